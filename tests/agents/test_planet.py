"""PlaNet agent: updates, acting in bounds, checkpoints, config errors, and `reverie train exp=debug agent=planet`."""

import json

import numpy as np
import pytest
import torch

from reverie import PlaNet, load_run
from reverie.cli import main
from reverie.types import ActionSpec
from helpers.agents import planet

TINY = planet(layers=1, horizon=3, candidates=20, top_k=4, iterations=2, cnn_depth=4)
# exp=debug shrinks PlaNet through configs/agent_exp/planet_debug.yaml (3 updates per cycle, tiny model and CEM)
DEBUG_PLANET = ["agent=planet"]


def batch(T=6, B=3, F=4, A=2, discrete=False, seed=0):
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    action = np.eye(A, dtype=np.float32)[rng.integers(A, size=(T, B))] if discrete else rng.uniform(-1, 1, (T, B, A))
    return {"vector": rng.normal(size=(T, B, F)).astype(np.float32),
            "prev_action": (action * ~is_first[..., None]).astype(np.float32),
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}


@pytest.mark.parametrize("discrete", [True, False])
def test_update_and_act(discrete):
    torch.manual_seed(0)
    agent = PlaNet({"vector": (4,)}, ActionSpec(discrete, 2), **{**TINY, **planet(overshooting=2)})
    before = [p.detach().clone() for p in agent.wm.parameters()]
    metrics = agent.update(batch(discrete=discrete))
    for key in ("loss/vector", "loss/reward", "loss/cont", "loss/kl", "loss/global_kl", "loss/overshooting",
                "loss/model", "grad_norm/model", "kl"):
        assert np.isfinite(metrics[key]), key
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.wm.parameters()))
    obs = {"vector": np.zeros((5, 4), np.float32), "is_first": np.ones(5, bool)}
    for mode in ("explore", "eval", "sample"):
        action, state = agent.act(obs, None, mode)
        assert action.shape == (5, 2) and action.dtype == np.float32
        if discrete:
            assert np.all(action.sum(-1) == 1.0) and set(np.unique(action)) <= {0.0, 1.0}
        else:
            assert np.all(np.abs(action) <= 1.0)
        obs["is_first"] = np.zeros(5, bool)
        action, state = agent.act(obs, state, mode)
        assert action.shape == (5, 2)
    with pytest.raises(ValueError, match="mode"):
        agent.act(obs, None, "greedy")


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    a.update(batch())
    b = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    b.load_state_dict(a.state_dict())
    torch.manual_seed(1)
    ma = a.update(batch(seed=1))
    torch.manual_seed(1)
    mb = b.update(batch(seed=1))
    assert ma == mb


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("env", [
    ["env=cartpole"],  # Discrete, vector
    ["env=pendulum"],  # Box, vector
    ["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv", "+env.kwargs.size=16", "+env.kwargs.length=10",
     "+env.kwargs.discrete=false", "env.num_envs=2"],  # Box, image
    ["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv", "+env.kwargs.size=16", "+env.kwargs.length=10",
     "env.num_envs=2"],  # Discrete, image
], ids=["discrete-vector", "continuous-vector", "continuous-image", "discrete-image"])
def test_smoke_debug_planet(tmp_path, env):
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", *DEBUG_PLANET, *env, "train.steps=120", "env.time_limit=20"]) == 0
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[-1]["updates"] > 0 and metrics[-1]["updates"] % 3 == 0  # whole cycles of train_steps
    assert any("loss/kl" in m and np.isfinite(m["loss/model"]) for m in metrics)
    scores = read_jsonl(run_dir / "scores.jsonl")
    assert {s["mode"] for s in scores} == {"train", "eval"}
    run = load_run(run_dir)
    assert isinstance(run.agent, PlaNet)


def test_presets_resolve_per_agent_and_agent_planet_builds_under_the_default_preset():
    from reverie.cli import check_setup, load_config

    repeats = {task: load_config(["exp=planet_dmc", f"env.task={task}"]).env.action_repeat
               for task in ("cartpole_swingup", "cheetah_run", "walker_walk", "hopper_hop")}
    assert repeats == {"cartpole_swingup": 8, "cheetah_run": 4, "walker_walk": 2, "hopper_hop": 2}
    cfg = load_config(["agent=planet", "env=pendulum"])  # exp=classic -> agent_exp/planet_classic.yaml
    assert cfg.agent.name == "planet" and cfg.env.id == "Pendulum-v1" and cfg.agent.schedule == "episodes"
    assert (cfg.agent.module.dynamics.deter, cfg.agent.module.candidates, cfg.env.action_repeat) == (100, 150, 4)
    assert "actor_lr" not in cfg.agent.module  # DreamerV3's classic learning rates stay with DreamerV3
    dreamer = load_config([])  # exp=classic -> agent_exp/dreamerv3_classic.yaml
    assert (dreamer.agent.train_ratio, dreamer.agent.module.actor_lr) == (128, 1.0e-4)
    assert load_config(["agent=planet", "exp=debug"]).agent.module.dynamics.deter == 16
    check_setup(load_config(["agent=planet", "env=pendulum"]))  # builds env and agent without error
