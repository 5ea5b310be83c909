"""Planners against toy models whose answer the math gives: the best sequence, the value bootstrap's effect,
MPPI's weights, the actor's proposals, and DreamerV3 acting by planning."""

import math

import numpy as np
import pytest
import torch
from helpers.agents import dreamer

from reverie.agents.dreamer import DreamerV3
from reverie.agents.dreamer_planning import PLAN_DEFAULTS
from reverie.agents.planning import CategoricalCEM, GaussianCEM, WorldModelPlanning
from reverie.types import ActionSpec

TARGET_BOX = torch.tensor([[0.8, -0.5], [-0.3, 0.6], [0.1, -0.9], [0.5, 0.4]])  # (H, A) inside [-1, 1]
TARGET_INDEX = [2, 0, 3, 1, 3]  # Discrete(4), H = 5


class Toy:
    """Toy dynamics without a continue head or a value (``PlanningModel`` protocol); subclasses step and reward."""

    def cont(self, state):
        return None

    def value(self, state):
        return None


class Tracking(Toy):
    """Box toy: ``t`` counts steps; arriving at ``s_{t+1}`` pays ``-|a_t - target_t|^2``. Best sequence: the target."""

    def step(self, state, action):
        t = int(state["t"][0])
        return {"t": state["t"] + 1, "r": -((action - TARGET_BOX[t]) ** 2).sum(-1)}

    def reward(self, state):
        return state["r"]


class Lock(Toy):
    """Discrete toy (combination lock): arriving at ``s_{t+1}`` pays 1 while every action so far matched
    ``TARGET_INDEX``; one wrong action loses all later rewards. Best sequence: the target (return H)."""

    def step(self, state, action):
        t = int(state["t"][0])
        ok = state["ok"] * action[:, TARGET_INDEX[t]]
        return {"t": state["t"] + 1, "ok": ok}

    def reward(self, state):
        return state["ok"]


def test_box_planner_finds_the_known_best_sequence():
    torch.manual_seed(0)
    planner = GaussianCEM([-1.0, -1.0], [1.0, 1.0], horizon=4, candidates=300, top_k=30, iterations=10)
    plan = planner.plan_sequence(Tracking(), {"t": torch.zeros(2)})
    assert plan.shape == (2, 4, 2)
    torch.testing.assert_close(plan, TARGET_BOX.expand(2, 4, 2), atol=0.02, rtol=0)
    torch.testing.assert_close(planner.plan(Tracking(), {"t": torch.zeros(2)}), TARGET_BOX[0].expand(2, 2),
                               atol=0.02, rtol=0)


def test_discrete_planner_finds_the_known_best_sequence():
    torch.manual_seed(0)
    planner = CategoricalCEM(4, horizon=5, candidates=300, top_k=20, iterations=6)
    probs = planner.plan_sequence(Lock(), {"t": torch.zeros(3), "ok": torch.ones(3)})
    assert probs.shape == (3, 5, 4)
    assert probs.argmax(-1).tolist() == [TARGET_INDEX] * 3
    assert torch.equal(probs.max(-1).values, torch.ones(3, 5))  # every elite is the target: frequencies 1
    action = planner.act(Lock(), {"t": torch.zeros(3), "ok": torch.ones(3)}, "eval")
    assert torch.equal(action, torch.eye(4)[[TARGET_INDEX[0]] * 3])


# --- the value bootstrap ----------------------------------------------------------------------------------------
GAMMA, DELAY, BIG = 0.9, 3, 2.0  # the late reward BIG arrives DELAY + 1 steps after choosing the long branch


class Fork:
    """The first action picks a branch; later actions do nothing. Short branch (action 0 / a < 0): reward 1 on
    arriving at ``s_1``, then nothing. Long branch (action 1 / a > 0): reward ``BIG`` on arriving at
    ``s_{DELAY+1}``. ``value`` is the exact discounted value of a state (0 without ``bootstrap``).

    Returns as :func:`reverie.agents.planning.score` computes them, horizon ``H``:
    short: 1 (any H >= 1). long: ``gamma^DELAY * BIG`` = 1.458 when ``H >= DELAY + 1`` (the reward is seen) or
    with the bootstrap (``gamma^H v(s_H) = gamma^H gamma^(DELAY - H) BIG``, the same number); 0 when
    ``H <= DELAY`` without it. So the long branch wins except when the horizon is too short and there is no value.
    """

    def __init__(self, discrete, bootstrap):
        self.discrete, self.bootstrap, self.discount = discrete, bootstrap, GAMMA

    def step(self, state, action):
        choice = action[:, 1] if self.discrete else (action[:, 0] > 0).float()
        branch = torch.where(state["t"] == 0, choice, state["branch"])
        return {"t": state["t"] + 1, "branch": branch}

    def reward(self, state):
        short = (state["branch"] == 0) & (state["t"] == 1)
        long = (state["branch"] == 1) & (state["t"] == DELAY + 1)
        return short.float() + BIG * long.float()

    def cont(self, state):
        return None

    def value(self, state):
        if not self.bootstrap:
            return None
        t = state["t"]
        pending = (state["branch"] == 1) & (t <= DELAY)
        return torch.where(pending, GAMMA ** (DELAY - t) * BIG, torch.zeros_like(t))


@pytest.mark.parametrize("discrete", [True, False])
def test_value_bootstrap_changes_the_action_exactly_when_the_horizon_is_too_short(discrete):
    assert GAMMA ** DELAY * BIG > 1.0  # the long branch is the better one
    chosen = {}
    for horizon in range(1, DELAY + 3):
        for bootstrap in (False, True):
            torch.manual_seed(horizon)
            start = {"t": torch.zeros(2), "branch": torch.full((2,), -1.0)}
            if discrete:
                planner = CategoricalCEM(2, horizon=horizon, candidates=64, top_k=8, iterations=3)
                action = planner.act(Fork(True, bootstrap), start, "eval").argmax(-1)
            else:
                planner = GaussianCEM([-1.0], [1.0], horizon=horizon, candidates=64, top_k=8, iterations=3)
                action = (planner.act(Fork(False, bootstrap), start, "eval")[:, 0] > 0).long()
            assert torch.equal(action, action[:1].expand(2))
            chosen[horizon, bootstrap] = int(action[0])
    for horizon in range(1, DELAY + 3):
        assert chosen[horizon, True] == 1  # the bootstrap sees past any horizon
        assert chosen[horizon, False] == (1 if horizon >= DELAY + 1 else 0), horizon


def test_planner_discount_defaults_to_the_model_discount():
    """gamma=None takes the model's discount: with Fork's 0.9 the long branch is worth 1.458; a planner with
    gamma=0.5 values it at 0.25 and takes the short branch."""
    start = {"t": torch.zeros(1), "branch": torch.full((1,), -1.0)}
    torch.manual_seed(0)
    assert CategoricalCEM(2, horizon=5, candidates=64, top_k=8, iterations=3).act(
        Fork(True, False), start).argmax() == 1
    torch.manual_seed(0)
    assert CategoricalCEM(2, horizon=5, candidates=64, top_k=8, iterations=3, gamma=0.5).act(
        Fork(True, False), start).argmax() == 0


# --- MPPI weights and the policy's proposals --------------------------------------------------------------------
class Bowl(Toy):
    """Horizon-1 Box toy: reward ``-a^2`` (A = 1), so the elites lie near 0, away from the clipped bounds;
    records every scored action."""

    def __init__(self):
        self.seen = []

    def step(self, state, action):
        self.seen.append(action[:, 0].clone())
        return {"r": -action[:, 0] ** 2}

    def reward(self, state):
        return state["r"]


def test_mppi_refit_weights_the_elites_by_their_scaled_returns():
    torch.manual_seed(0)
    temperature, k = 0.5, 4
    toy = Bowl()
    mean = GaussianCEM([-1.0], [1.0], horizon=1, candidates=50, top_k=k, iterations=1,
                       temperature=temperature).plan(toy, {"r": torch.zeros(1)})
    actions = toy.seen[0].double()
    ret, index = (-actions ** 2).topk(k)  # the elites' returns, best first
    weights = torch.exp((ret - ret[0]) / (temperature * (ret[0] - ret[-1])))
    weights = weights / weights.sum()
    assert math.isclose(float(weights[-1] / weights[0]), math.exp(-1 / temperature), rel_tol=1e-9)
    torch.testing.assert_close(mean[0, 0].double(), (weights * actions[index]).sum(), atol=1e-6, rtol=0)
    torch.manual_seed(0)
    cem = GaussianCEM([-1.0], [1.0], horizon=1, candidates=50, top_k=k, iterations=1).plan(
        Bowl(), {"r": torch.zeros(1)})
    torch.testing.assert_close(cem[0, 0].double(), actions[index].mean(), atol=1e-6, rtol=0)  # CEM: equal weights
    with pytest.raises(ValueError, match="temperature must be > 0"):
        GaussianCEM([-1.0], [1.0], temperature=0.0)


class LockWithPolicy(Lock):
    """:class:`Lock` whose reward comes only at the end (all ``H`` actions right), with a policy that knows
    the combination: random search alone finds it with probability ``C / 4^H`` per iteration."""

    def reward(self, state):
        return state["ok"] * (state["t"] == len(TARGET_INDEX)).float()

    def policy(self, state):
        return torch.eye(4)[[TARGET_INDEX[int(state["t"][0])]] * len(state["t"])]


def test_policy_candidates_join_the_search():
    start = {"t": torch.zeros(2), "ok": torch.ones(2)}
    torch.manual_seed(0)
    blind = CategoricalCEM(4, horizon=5, candidates=16, top_k=2, iterations=2).plan_sequence(LockWithPolicy(), start)
    assert blind.argmax(-1).tolist() != [TARGET_INDEX] * 2  # 32 draws of 1024 sequences: not found
    torch.manual_seed(0)
    seeded = CategoricalCEM(4, horizon=5, candidates=16, top_k=2, iterations=2, policy_candidates=1)
    assert seeded.plan_sequence(LockWithPolicy(), start).argmax(-1).tolist() == [TARGET_INDEX] * 2
    with pytest.raises(ValueError, match="needs a planning model with a policy"):
        seeded.plan(Lock(), start)


# --- DreamerV3 acting by planning -------------------------------------------------------------------------------
def tiny_dreamer(spec, **kwargs):
    torch.manual_seed(0)
    return DreamerV3({"vector": (3,)}, spec, **dreamer(deter=16, units=16, gamma=0.95, **kwargs))


def test_from_dreamer_proposes_with_the_actor():
    agent = tiny_dreamer(ActionSpec(True, 3))
    model = WorldModelPlanning.from_dreamer(agent)
    assert model.discount == 0.95
    state = {k: v.detach() for k, v in agent.wm.dynamics.initial(4).items()}
    with torch.no_grad():
        proposal = model.policy(state)
    assert proposal.shape == (4, 3) and torch.equal(proposal.sum(-1), torch.ones(4))  # one-hot actor draws


@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("kind", ["cem", "mppi"])
def test_dreamer_acts_with_a_planner(discrete, kind):
    spec = ActionSpec(discrete, 2)
    plan = {"horizon": 3, "candidates": 16, "top_k": 4, "iterations": 2, "policy_candidates": 2}
    agent = tiny_dreamer(spec, planner=kind, plan=plan)
    assert agent.planner.kind == kind and agent.planner.settings == {**PLAN_DEFAULTS, **plan}
    obs = {"vector": np.zeros((3, 3), np.float32), "is_first": np.ones(3, bool)}
    action, state = agent.act(obs, None, "eval")
    assert action.shape == (3, 2) and action.dtype == np.float32
    if discrete:
        assert np.array_equal(action.sum(-1), np.ones(3)) and set(np.unique(action)) <= {0.0, 1.0}
    else:
        assert np.all(np.abs(action) <= 1.0)
    torch.testing.assert_close(state[1], torch.as_tensor(action))  # the executed action feeds the next posterior
    explore, _ = agent.act({**obs, "is_first": np.zeros(3, bool)}, state, "explore")
    assert explore.shape == (3, 2)


def test_dreamer_planner_settings_are_checked():
    with pytest.raises(ValueError, match="planner must be one of actor, cem, mppi"):
        tiny_dreamer(ActionSpec(True, 2), planner="beam")
    with pytest.raises(ValueError, match=r"unknown planner setting\(s\) \['horizont'\]"):
        tiny_dreamer(ActionSpec(True, 2), planner="cem", plan={"horizont": 3})
    assert tiny_dreamer(ActionSpec(True, 2)).planner is None  # the actor by default


def test_training_collects_and_evaluates_with_the_planner(tmp_path, monkeypatch):
    """`agent.module.planner=cem` in `reverie train`: the planner acts at collection (explore) and evaluation."""
    from reverie.agents import dreamer_planning
    from reverie.cli import main
    from reverie.state.saved_run import load_run

    modes = []
    act = dreamer_planning.DreamerPlanner.act

    def counting(self, agent, post, mode):
        modes.append(mode)
        return act(self, agent, post, mode)

    monkeypatch.setattr(dreamer_planning.DreamerPlanner, "act", counting)
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=80", "train.prefill=64",
                 "train.eval_episodes=1", "agent.module.planner=cem", "agent.module.plan.candidates=8",
                 "agent.module.plan.top_k=2", "agent.module.plan.iterations=1", "agent.module.plan.horizon=2"]) == 0
    assert modes.count("explore") == (80 - 64) // 4  # 4 envs: one batched call per collected row after prefill
    assert "eval" in modes
    assert load_run(run_dir).acting["planner"] == "cem"
