"""The suite registry (env.suite -> builder), run metadata (env_metadata.json) and a debug training run on Atari."""

import importlib.metadata
import json

import pytest

from reverie.envs import SUITES, env_metadata, make_env, make_vector_env, write_env_metadata


def test_registry_names_and_unknown_suite_error():
    assert set(SUITES) == {"gym", "atari", "dmc"}
    assert not SUITES["gym"].repeats and SUITES["atari"].repeats and SUITES["dmc"].repeats
    for build in (make_env, make_vector_env):
        with pytest.raises(ValueError, match=r"env.suite='mujoco' is unknown; choose one of gym, atari, dmc"):
            build({"suite": "mujoco", "task": "x"}, 0)


def test_gym_is_the_default_suite():
    env = make_env({"id": "CartPole-v1"}, seed=0)
    assert list(env.reset()[0]) == ["vector"]
    meta = env_metadata({"id": "CartPole-v1", "action_repeat": 2})
    assert meta["suite"] == "gym" and meta["action_repeat"] == 2 and meta["frames_per_agent_step"] == 2
    assert meta["versions"]["gymnasium"] == importlib.metadata.version("gymnasium")


def test_atari_metadata_records_every_protocol_setting():
    pytest.importorskip("ale_py")
    from omegaconf import OmegaConf

    meta = env_metadata(OmegaConf.load("reverie/configs/env/atari100k.yaml"))
    assert meta["versions"]["ale-py"] == importlib.metadata.version("ale-py")
    expected = {
        "suite": "atari", "env_id": "ALE/Pong-v5", "backend": "ale", "action_repeat": 4, "frames_per_agent_step": 4,
        "sticky_action_probability": 0.0, "noops_max": 30, "action_set": "minimal", "life_loss": "ignore",
        "max_frames": 108000, "image_size": [64, 64], "time_limit": None, "num_envs": 1,
    }
    assert {k: meta[k] for k in expected} == expected
    assert "max over the last 2 frames" in meta["pooling"] and "truncation" in meta["frame_cap_is"]
    meta = env_metadata(OmegaConf.load("reverie/configs/env/atari.yaml"))
    assert (meta["sticky_action_probability"], meta["noops_max"], meta["action_set"]) == (0.25, 0, "full")


def test_dmc_metadata():
    pytest.importorskip("dm_control")
    meta = env_metadata({"suite": "dmc", "task": "quadruped_run", "image": True, "proprio": False})
    assert meta["versions"]["dm_control"] == importlib.metadata.version("dm_control")
    assert meta["versions"]["mujoco"] == importlib.metadata.version("mujoco")
    assert (meta["action_repeat"], meta["observations"], meta["image_size"], meta["camera"]) == (
        2, ["image"], [64, 64], 2)


def test_write_env_metadata(tmp_path):
    path = write_env_metadata({"id": "CartPole-v1"}, tmp_path / "run")
    assert path == tmp_path / "run" / "env_metadata.json"
    assert json.loads(path.read_text())["id"] == "CartPole-v1"


def test_debug_training_run_on_atari_records_protocol_and_frames(tmp_path):
    """exp=debug on atari100k Pong: env_metadata.json in the run, and scores count frames = steps x 4."""
    pytest.importorskip("ale_py")
    from reverie.cli import main

    run_dir = tmp_path / "atari"
    assert main(["train", "exp=debug", "env=atari100k", f"run_dir={run_dir}", "train.steps=72",
                 "train.eval_episodes=1", "env.time_limit=30"]) == 0
    meta = json.loads((run_dir / "env_metadata.json").read_text())
    assert meta["env_id"] == "ALE/Pong-v5" and meta["action_repeat"] == 4 and "ale-py" in meta["versions"]
    scores = [json.loads(line) for line in (run_dir / "scores.jsonl").read_text().splitlines()]
    assert scores and all(s["frames"] == 4 * s["step"] for s in scores)
    assert {s["mode"] for s in scores} == {"train", "eval"} and all(s["length"] == 30 for s in scores)
