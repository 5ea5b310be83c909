"""The Agent protocol's guard: a non-finite loss or gradient skips the optimiser step and is counted, for every
optimiser of every agent (one helper, ``WorldModelAgent._step``)."""

import copy

import numpy as np
import pytest
import torch

from reverie.agents import DreamerV3_2025
from reverie.agents.dreamer import DreamerV3
from reverie.agents.planet import PlaNet
from reverie.types import ActionSpec
from helpers.agents import dreamer, planet
from helpers.state_compare import assert_same

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


# ------------------------------------------------------------------------ a skipped step changes nothing (issue 26)
def poison(agent, names):
    """Make the loss of each optimiser named in ``names`` non-finite (times NaN) where the agent hands it to the
    guarded step, so that exactly those steps are skipped."""
    step = agent._step
    targets = [getattr(agent, name) for name in names]

    def poisoned(optimizer, loss, params, clip, ok=True):
        if any(optimizer is t for t in targets):
            loss = loss * float("nan")
        return step(optimizer, loss, params, clip, ok)

    agent._step = poisoned


def owned(agent, name):
    """The saved state a step of optimiser ``name`` may change: its own state and the modules (by state_dict key
    prefix) it trains or that follow it (the return normaliser scales the actor's advantage; the slow critic
    follows the critic)."""
    prefixes = {"model_opt": ("wm.",), "actor_opt": ("actor.", "retnorm."), "critic_opt": ("critic.", "slow_critic."),
                "opt": ("",)}[name]
    return name, prefixes


SKIP_AGENTS = {
    "dreamerv3": lambda discrete: DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), **TINY),
    "dreamerv3_2025": lambda discrete: DreamerV3_2025({"vector": (4,)}, ActionSpec(discrete, 2),
                                                      dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4),
                                                      units=8, horizon=3, precision="float32"),
    "planet": lambda discrete: PlaNet({"vector": (4,)}, ActionSpec(discrete, 2),
                                      **planet(layers=1, horizon=3, candidates=20, top_k=4, iterations=2)),
}


def skip_batch():
    data = batch()
    rng = np.random.default_rng(1)
    data["vector"] = rng.normal(size=data["vector"].shape).astype(np.float32)
    data["reward"] = rng.normal(size=data["reward"].shape).astype(np.float32)
    data["is_last"] = np.zeros_like(data["is_first"])
    return data


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
@pytest.mark.parametrize("kind", sorted(SKIP_AGENTS))
def test_a_skipped_step_changes_nothing_in_the_saved_state(kind, discrete):
    """For every agent and every optimiser: a non-finite loss injected into that optimiser's step leaves every
    entry of the saved state (``agent.state_dict()``: modules and their buffers, optimiser moments and step
    counters, the return normaliser, the slow critic) that this step trains or moves exactly as it was; with every
    step poisoned at once, the whole saved state is unchanged. The other steps of the update run as usual."""
    make = SKIP_AGENTS[kind]
    torch.manual_seed(0)
    probe = make(discrete)
    for names in [(name,) for name in probe.optimizers] + [probe.optimizers]:
        torch.manual_seed(0)
        agent = make(discrete)
        assert agent.update(skip_batch())["guard/nonfinite"] == 0.0  # moments, normaliser and slow critic move
        before = copy.deepcopy(agent.state_dict())
        poison(agent, names)
        assert agent.update(skip_batch())["guard/nonfinite"] == float(len(names)), names
        after = agent.state_dict()
        assert before.keys() == after.keys()
        if names == agent.optimizers:  # every step skipped: nothing at all may change
            assert_same(before, after)
            continue
        (name,) = names
        opt_name, prefixes = owned(agent, name)
        assert_same(before[opt_name], after[opt_name], opt_name)
        keys = [k for k in before["modules"] if k.startswith(prefixes)]
        assert keys, (name, prefixes)  # the prefixes name real modules of this agent
        for key in keys:
            assert_same(before["modules"][key], after["modules"][key], f"{name} skipped: modules.{key}")
