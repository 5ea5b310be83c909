"""`+key=` / `++key=` that add a key nothing reads are refused before anything is written (issue 27, item 4)."""

from __future__ import annotations

import pytest

from reverie.cli import main
from reverie.configs.compose import ConfigError, load_config


@pytest.mark.parametrize("override, key, hint", [
    ("+agent.foo=1", "agent.foo", "'agent' has no key 'foo'. Supported keys there: batch_length, batch_size, module"),
    ("++agent.foo=1", "agent.foo", "'agent' has no key 'foo'"),
    ("++agent.train_ration=3", "agent.train_ration", "Did you mean 'agent.train_ratio'?"),
    ("+train.foo.bar=1", "train.foo.bar", "'train' has no key 'foo'"),
    ("+agent.module.plan.depth=2", "agent.module.plan.depth", "'agent.module.plan' has no key 'depth'"),
    ("+agent.module.dynamics.foo.bar=1", "agent.module.dynamics.foo.bar", "'agent.module.dynamics' has no key 'foo'"),
    ("+env.sticky=0.5", "env.sticky", "'env' has no key 'sticky'"),  # an Atari key on CartPole: nothing reads it
])
def test_an_added_key_nothing_reads_is_refused_before_the_run_dir_exists(tmp_path, capsys, override, key, hint):
    assert main(["train", "exp=debug", override, f"run_dir={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert f"config error: unknown key '{key}'" in err and hint in err
    assert f"`{override}` would add it, but nothing reads it" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("overrides, key, value", [  # every `+` use of tests/, docs/, examples/ and bench/
    (["+env.kwargs.size=16", "+env.kwargs.dict_obs=true"], "env.kwargs.size", 16),
    (["env=pendulum", "+env.wrappers=[{_target_: reverie.envs.testing.RecordActions}]"], "env.wrappers.0._target_",
     "reverie.envs.testing.RecordActions"),
    (["+agent.schedule=episodes"], "agent.schedule", "episodes"),
    (["~agent.module.dynamics", "+agent.module.dynamics={_target_: my_pkg.MyDynamics, _partial_: true}"],
     "agent.module.dynamics._target_", "my_pkg.MyDynamics"),
    (["+agent.module.lr=1"], "agent.module.lr", 1),  # a _target_ block's argument: the agent build refuses it
    (["++agent.train_ratio=7"], "agent.train_ratio", 7),  # ++ on an existing key sets it
    (["+env.kwargs.opts.depth=2"], "env.kwargs.opts.depth", 2),  # anything under kwargs
    (["agent=planet", "++agent.collect_every=2"], "agent.collect_every", 2),
])
def test_keys_that_are_read_may_be_added(overrides, key, value):
    from omegaconf import OmegaConf

    assert OmegaConf.select(load_config(["exp=debug", *overrides]), key) == value


def test_a_config_group_added_with_plus_is_left_to_hydra():
    with pytest.raises(ConfigError) as err:
        load_config(["+exp=debug"])  # `exp` is a group already chosen: Hydra's own message
    assert "exp" in str(err.value) and "nothing reads it" not in str(err.value)
