"""Issue 20: numeric keys outside their range stop `reverie train` before anything is written."""

import pytest

from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.configs.ranges import range_errors


@pytest.mark.parametrize("steps", ["0", "-100"])
def test_nonpositive_steps_write_nothing(tmp_path, monkeypatch, capsys, steps):
    monkeypatch.chdir(tmp_path)  # the default run directory would be ./runs/<date>_<time>_debug_dreamerv3_CartPole-v1
    assert main(["train", "exp=debug", f"train.steps={steps}"]) == 2
    assert main(["train", "exp=debug", f"train.steps={steps}", f"run_dir={tmp_path / 'mine'}"]) == 2
    err = capsys.readouterr().err
    assert err.count(f"config error: train.steps={steps} must be > 0 (env steps to collect)") == 2
    assert list(tmp_path.iterdir()) == []  # no runs/, no run_dir, no config.yaml


def test_every_bad_key_is_named_with_its_range():
    cfg = load_config(["exp=debug", "train.prefill=-1", "train.checkpoint_keep=0", "agent.train_ratio=0",
                       "agent.batch_size=0", "replay.capacity=0", "train.eval_every=-5", "train.eval_episodes=1.5",
                       "train.control_hz=0", "threads=0"])
    assert range_errors(cfg) == [
        "train.prefill=-1 must be >= 0 (random-policy env steps before learning)",
        "train.eval_every=-5 must be >= 0 (env steps between evaluations; 0: only at the end)",
        "train.eval_episodes=1.5 must be an integer >= 1 (episodes per evaluation)",
        "train.checkpoint_keep=0 must be >= 1 (newest checkpoints kept)",
        "train.control_hz=0 must be > 0 (collector steps per second; null: off)",
        "agent.train_ratio=0 must be > 0 (replayed steps per env step)",
        "agent.batch_size=0 must be >= 1 (sequences per batch (B))",
        "replay.capacity=0 must be >= 1 (replay steps over all envs)",
        "threads=0 must be >= 1 (torch threads; null: the idle cores at start)",
    ]
    # pretrain.eval_episodes defaults to train.eval_episodes: named where it is set, once
    assert range_errors(load_config(["exp=debug", "pretrain.eval_episodes=1.5"])) == [
        "pretrain.eval_episodes=1.5 must be an integer >= 0 (episodes per evaluation; 0: never act in the env)"]
    assert range_errors(load_config(["exp=debug", "replay.capacity=5", "env.num_envs=4"])) == [
        "replay.capacity=5 with env.num_envs=4 leaves 1 rows per env; needs replay.capacity >= 8"]


@pytest.mark.parametrize("overrides", [[], ["exp=debug"], ["exp=reference"], ["exp=atari100k"], ["exp=planet_dmc"],
                                       ["exp=dmc_cpu"],
                                       ["agent=planet"], ["agent=planet", "exp=debug"], ["env=pendulum"]])
def test_shipped_presets_are_in_range(overrides):
    assert range_errors(load_config(overrides)) == []


def test_train_itself_refuses_before_writing(tmp_path):
    from reverie.train import train

    with pytest.raises(ValueError, match=r"config error: train.steps=0 must be > 0"):
        train(load_config(["exp=debug", "train.steps=0"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()
