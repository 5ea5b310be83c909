"""Non-finite losses or gradients skip the optimiser step and are counted (issue 6)."""

import numpy as np
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec

TINY = dict(deter=16, stoch=4, classes=4, units=16, layers=1, horizon=3, precision="float32")


def batch(reward=0.5):
    T, B = 6, 3
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    return {"vector": np.ones((T, B, 4), np.float32), "prev_action": np.zeros((T, B, 2), np.float32),
            "reward": np.full((T, B), reward, np.float32), "is_first": is_first, "is_terminal": np.zeros((T, B), bool)}


def test_nan_batch_changes_nothing_and_is_counted():
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    assert agent.update(batch())["guard/nonfinite"] == 0.0
    before = {k: v.clone() for k, v in agent.state_dict()["modules"].items()}
    opt_before = [s["exp_avg"].clone() for s in agent.model_opt.state.values()]
    metrics = agent.update(batch(reward=float("nan")))
    assert metrics["guard/nonfinite"] >= 1.0  # at least the world-model step was skipped
    after = agent.state_dict()["modules"]
    for key, value in before.items():
        assert torch.equal(value, after[key]), key  # parameters, slow critic, return normaliser
    for old, state in zip(opt_before, agent.model_opt.state.values()):
        assert torch.equal(old, state["exp_avg"])
    assert all(torch.isfinite(p).all() for p in agent.parameters())
    assert np.isfinite(agent.update(batch())["loss/model"])  # training goes on from the finite model
