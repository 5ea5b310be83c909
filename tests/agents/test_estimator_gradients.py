"""Each actor gradient estimator trains the actor and leaves the world model alone (issue 46, item 7): the actor
loss of either agent gives the actor a non-zero gradient and the world model none. The 2023 agent steps the actor
with its own optimiser and backpropagates into the actor's parameters only; the 2025 agent has one optimiser and
one loss, and its imagination runs without gradients, so the policy loss reaches no world-model parameter. The
counter-check lifts the 2025 imagination's ``no_grad`` (the trap a researcher editing it would fall into) and the
world model receives the policy loss's gradient."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from reverie.agents import DreamerV3, DreamerV3_2025
from reverie.agents.base import WorldModelAgent
from reverie.types import ActionSpec

TINY_2025 = dict(dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4), units=8, horizon=3,
                 precision="float32", kernels="off", warmup=0)


def batch(discrete: bool, T: int = 6, B: int = 3, A: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    actions = np.eye(A, dtype=np.float32)[rng.integers(A, size=(T, B))] if discrete else \
        rng.uniform(-1, 1, (T, B, A)).astype(np.float32)
    return {"vector": rng.normal(size=(T, B, 4)).astype(np.float32), "prev_action": actions * ~is_first[..., None],
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}


def policy_only_gradients(discrete: bool, lift_no_grad: bool = False) -> tuple[float, float]:
    """The 2025 agent's gradient norms (actor, world model) of its policy loss alone (every other scale 0);
    ``lift_no_grad``: ``torch.no_grad`` does nothing inside the imagination (``_imagine``)."""
    torch.manual_seed(0)
    scales = {k: 0.0 for k in ("rec", "reward", "cont", "dyn", "rep", "value", "repval")} | {"policy": 1.0}
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(discrete, 2), loss_scales=scales, **TINY_2025)
    grads = {}

    def capture(self, optimizer, loss, params, clip, ok=True):
        loss.backward(inputs=list(params), retain_graph=False)
        for name, p in agent.named_parameters():
            grads[name] = None if p.grad is None else float(p.grad.norm())
        optimizer.zero_grad(set_to_none=True)
        return torch.tensor(0.0), 1

    agent._step = capture.__get__(agent)
    if lift_no_grad:
        imagine = agent._imagine

        def lifted(start):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(torch, "no_grad", contextlib.nullcontext)
                return imagine(start)
        agent._imagine = lifted
    agent.update(batch(discrete))
    actor = sum(v for k, v in grads.items() if k.startswith("actor.") and v is not None)
    world = sum(v for k, v in grads.items() if k.startswith("wm.") and v is not None)
    return actor, world


@pytest.mark.parametrize("discrete", [True, False])
def test_the_2025_policy_loss_trains_the_actor_and_not_the_world_model(discrete):
    actor, world = policy_only_gradients(discrete)
    assert actor > 0.0 and world == 0.0


def test_lifting_the_2025_imaginations_no_grad_sends_the_policy_loss_into_the_world_model():
    actor, world = policy_only_gradients(False, lift_no_grad=True)
    assert actor > 0.0 and world > 0.0


def actor_step_effects(discrete: bool, estimator: str, everywhere: bool = False) -> dict:
    """The 2023 agent's actor step: its gradient norm and the world-model parameters whose gradient it changed;
    ``everywhere``: the actor loss backpropagates into every parameter (``backward()`` without ``inputs``)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), units=8, layers=1, mlp_units=8, mlp_layers=1,
                      horizon=3, precision="float32", kernels="off",
                      **({"actor_grad_disc": estimator} if discrete else {}))
    seen = {}
    step = WorldModelAgent._step

    def recording(optimizer, loss, params, clip, ok=True):
        if optimizer is agent.actor_opt:
            before = {k: None if p.grad is None else p.grad.clone() for k, p in agent.wm.named_parameters()}
            if everywhere:
                loss.backward(retain_graph=True)
            result = step(agent, optimizer, loss, params, clip, ok)
            seen["actor_norm"] = float(result[0])
            seen["world_changed"] = [k for k, p in agent.wm.named_parameters()
                                     if not (p.grad is None and before[k] is None or
                                             p.grad is not None and before[k] is not None and
                                             torch.equal(p.grad, before[k]))]
            return result
        return step(agent, optimizer, loss, params, clip, ok)

    agent._step = recording
    agent.update(batch(discrete))
    return seen


@pytest.mark.parametrize("discrete, estimator", [(True, "reinforce"), (True, "backprop"), (False, "backprop")])
def test_the_2023_actor_step_trains_the_actor_and_not_the_world_model(discrete, estimator):
    """REINFORCE (discrete, the default) and backprop (continuous; discrete with actor_grad_disc=backprop)."""
    seen = actor_step_effects(discrete, estimator)
    assert seen["actor_norm"] > 0.0 and seen["world_changed"] == []


def test_an_actor_loss_backpropagated_everywhere_reaches_the_world_model():
    """The counter-check: through the dynamics (backprop estimator) the actor loss does depend on the world model;
    only backpropagating into the actor's parameters alone keeps it out."""
    assert actor_step_effects(False, "backprop", everywhere=True)["world_changed"]
