"""Run folders and start-up lines that name what differs from the preset, and group options that do not exist
(issue 47: runs you can tell apart, refusals instead of leaks)."""

import pytest

from reverie.cli import main
from reverie.configs.compose import ConfigError, load_config, run_name, variant


@pytest.mark.parametrize("overrides, name, changed", [
    ([], "classic_dreamerv3_CartPole-v1", []),
    (["dynamics=storm"], "classic_dreamerv3-storm_CartPole-v1", [("storm", "dynamics",
                                                                  "TransformerDynamics (dynamics=storm)")]),
    (["agent.module.representation=r2"], "classic_dreamerv3-r2_CartPole-v1", [("r2", "representation", "r2")]),
    (["dynamics=storm", "agent.module.representation=infonce", "init_from=runs/pre"],
     "classic_dreamerv3-storm-infonce-init_CartPole-v1",
     [("storm", "dynamics", "TransformerDynamics (dynamics=storm)"), ("infonce", "representation", "infonce"),
      ("init", "init_from", "runs/pre")]),
    (["agent=dreamerv3_2025"], "classic_dreamerv3_2025_CartPole-v1", []),  # its own BlockRSSM: no tag
    (["agent=planet", "env=pendulum"], "classic_planet_Pendulum-v1", []),
])
def test_the_run_folder_names_the_dynamics_objective_and_init(overrides, name, changed):
    cfg = load_config(overrides)
    assert run_name(cfg) == name
    assert variant(cfg) == changed


def test_the_start_up_line_names_what_differs(tmp_path, capsys):
    assert main(["train", "exp=debug", "dynamics=storm", "agent.module.representation=r2", "train.steps=80",
                 f"run_dir={tmp_path / 'r'}"]) == 0
    out = capsys.readouterr().out
    assert "[reverie] agent dreamerv3 with dynamics TransformerDynamics (dynamics=storm), representation r2\n" in out
    assert main(["train", "exp=debug", "train.steps=80", f"run_dir={tmp_path / 'plain'}"]) == 0
    assert "[reverie] agent dreamerv3 with" not in capsys.readouterr().out


@pytest.mark.parametrize("override, expected", [
    ("env=Acrobot-v1", "config error: env=Acrobot-v1: the group 'env' has no option 'Acrobot-v1'. A Gymnasium id "
                       "goes in `env=gym env.id=Acrobot-v1`. Options: atari, atari100k, cartpole, dmc_proprio, "
                       "dmc_vision, gym, pendulum."),
    ("env=pendulumm", "config error: env=pendulumm: the group 'env' has no option 'pendulumm'. Did you mean "
                      "env=pendulum? Options: atari, atari100k, cartpole, dmc_proprio, dmc_vision, gym, pendulum."),
    ("exp=debugg", "Did you mean exp=debug?"),
    ("size=xxxxl", "the group 'size' has no option 'xxxxl'"),
])
def test_a_missing_group_option_names_close_ones_and_the_gym_form(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert expected in str(err.value)


def test_a_dynamics_for_another_agent_is_refused_naming_the_agents_it_serves(tmp_path, capsys):
    assert main(["train", "exp=debug", "agent=planet", "dynamics=storm", f"run_dir={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent error: dynamics=storm serves agent=dreamerv3 (agent=dreamerv3_2025 with its "
                          "dynamics block replaced: docs/transformer.md), not agent=planet: it sets agent.module keys "
                          "for the DreamerV3 agent (PlaNet.__init__() got an unexpected keyword argument")
    assert not (tmp_path / "x").exists()
