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



def test_finite_step_skips_non_finite_losses_and_gradients():
    from reverie.agents.dreamer import _finite_step

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([w], lr=0.1)
    for bad in (float("nan"), float("inf")):
        loss = (w * bad).sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([w], 1.0)
        assert _finite_step(opt, loss, norm) == 1
        assert torch.equal(w.detach(), torch.ones(3)) and w.grad is None and not opt.state  # untouched
    loss = (w * 2).sum()
    loss.backward()
    assert _finite_step(opt, loss, torch.nn.utils.clip_grad_norm_([w], 1.0), ok=False) == 1  # e.g. NaN returns
    loss = (w * 2).sum()
    loss.backward()
    assert _finite_step(opt, loss, torch.nn.utils.clip_grad_norm_([w], 1.0)) == 0
    assert torch.allclose(w.detach(), torch.full((3,), 0.9))  # Adam's first step moves each weight by lr
