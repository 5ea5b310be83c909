"""The Agent protocol's guard: a non-finite loss or gradient skips the optimiser step and is counted, for every
optimiser of every agent (one helper, ``WorldModelAgent._step``)."""

import numpy as np
import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.agents.planet import PlaNet
from reverie.types import ActionSpec
from helpers.agents import dreamer, planet

TINY = dreamer(deter=16, units=16, horizon=3)


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
    # the NaN reward makes only the world-model loss non-finite: that step is skipped; the actor and critic
    # learn in imagination from the (unchanged, finite) model, so their steps are finite and taken
    assert metrics["guard/nonfinite"] == 1.0
    after = agent.state_dict()["modules"]
    for key, value in before.items():
        if key.startswith("wm."):
            assert torch.equal(value, after[key]), key
    for old, state in zip(opt_before, agent.model_opt.state.values()):
        assert torch.equal(old, state["exp_avg"])
    assert all(torch.isfinite(p).all() for p in agent.parameters())
    assert np.isfinite(agent.update(batch())["loss/model"])  # training goes on from the finite model



def test_planet_skips_a_non_finite_step_and_counts_it():
    """PlaNet's optimiser step goes through the same guarded step as DreamerV3's three."""
    torch.manual_seed(0)
    agent = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **planet(layers=1, horizon=3, candidates=20, top_k=4,
                                                                    iterations=2))
    planet_batch = {**batch(), "prev_action": np.zeros((6, 3, 2), np.float32)}
    assert agent.update(planet_batch)["guard/nonfinite"] == 0.0
    before = {k: v.clone() for k, v in agent.state_dict()["modules"].items()}
    moments = [s["exp_avg"].clone() for s in agent.model_opt.state.values()]
    assert agent.update({**planet_batch, "reward": np.full((6, 3), np.nan, np.float32)})["guard/nonfinite"] == 1.0
    for key, value in agent.state_dict()["modules"].items():
        assert torch.equal(value, before[key]), key
    for old, state in zip(moments, agent.model_opt.state.values()):
        assert torch.equal(old, state["exp_avg"])
    assert agent.update(planet_batch)["guard/nonfinite"] == 0.0  # and training goes on


def test_step_skips_non_finite_losses_and_gradients():
    """``WorldModelAgent._step``: zero_grad, backward into the given parameters, clip, and a step only when the loss
    and the gradient norm are finite and ``ok``; a skip leaves weights, moments and gradients untouched/dropped."""
    agent = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **planet())
    w = torch.nn.Parameter(torch.ones(3))
    other = torch.nn.Parameter(torch.ones(3))  # in the loss but not stepped: backward(inputs=...) leaves it alone
    opt = torch.optim.Adam([w], lr=0.1)
    for bad in (float("nan"), float("inf")):
        norm, skipped = agent._step(opt, (w * other * bad).sum(), [w], 1.0)
        assert skipped == 1 and not torch.isfinite(norm)
        assert torch.equal(w.detach(), torch.ones(3)) and w.grad is None and not opt.state  # untouched
    norm, skipped = agent._step(opt, (w * 2).sum(), [w], 1.0, ok=False)  # e.g. NaN returns
    assert skipped == 1 and norm.item() == pytest.approx(2 * 3 ** 0.5)
    norm, skipped = agent._step(opt, (w * other * 2).sum(), [w], 1.0)
    assert skipped == 0 and other.grad is None
    assert torch.allclose(w.detach(), torch.full((3,), 0.9))  # Adam's first step moves each weight by lr
