"""CEM planning: bounds, convergence, discrete actions, single elites, scoring arithmetic, world-model adapters."""

import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.agents.planet import PlaNet
from reverie.agents import planning
from reverie.agents.planning import CategoricalCEM, GaussianCEM, WorldModelPlanning, make_planner, score
from reverie.envs import VectorStepper, make_vector_env
from reverie.types import ActionSpec
from helpers.agents import dreamer, planet

LOW, HIGH = [-0.5, 1.0], [0.5, 2.0]


class SumOfAction:
    """Toy dynamics: the state is the last action; reward = sum of the action (or its entry ``index``)."""

    def __init__(self, index=None, cont=None, value=None, discount=None):
        self.index, self._cont, self._value = index, cont, value
        if discount is not None:
            self.discount = discount
        self.seen = []  # every action the planner scored

    def step(self, state, action):
        self.seen.append(action.clone())
        return {"last": action}

    def reward(self, state):
        a = state["last"]
        return a.sum(-1) if self.index is None else a[:, self.index]

    def cont(self, state):
        return None if self._cont is None else torch.full(state["last"].shape[:1], self._cont)

    def value(self, state):
        return None if self._value is None else torch.full(state["last"].shape[:1], self._value)


def start(n, dim=2):
    return {"deter": torch.zeros(n, 3), "last": torch.zeros(n, dim)}


def test_box_cem_stays_inside_the_box_and_converges_to_the_upper_corner():
    torch.manual_seed(0)
    planner = GaussianCEM(LOW, HIGH, horizon=3, candidates=200, top_k=20, iterations=8)
    toy = SumOfAction()
    plan = planner.plan(toy, start(2))
    low, high = torch.tensor(LOW), torch.tensor(HIGH)
    seen = torch.cat(toy.seen)
    assert seen.shape == (8 * 3 * 2 * 200, 2)  # iterations x horizon x (N * candidates)
    assert bool(((seen >= low) & (seen <= high)).all())
    assert plan.shape == (2, 2) and bool(((plan >= low) & (plan <= high)).all())
    torch.testing.assert_close(plan, high.expand(2, 2), atol=0.02, rtol=0)
    executed = torch.cat([planner.act(toy, start(2), "explore", noise=0.3) for _ in range(20)])
    assert bool(((executed >= low) & (executed <= high)).all())
    assert len(torch.unique(executed[:, 0])) > 1  # noise was added (then clipped)
    torch.manual_seed(3)
    eval_action = planner.act(toy, start(2), "eval", noise=0.3)
    torch.manual_seed(3)
    torch.testing.assert_close(eval_action, planner.plan(toy, start(2)), rtol=0, atol=0)  # no noise at eval


def test_single_elite_gives_finite_plan():
    torch.manual_seed(0)
    planner = GaussianCEM(LOW, HIGH, horizon=4, candidates=16, top_k=1, iterations=5)
    plan = planner.plan(SumOfAction(), start(3))
    assert torch.isfinite(plan).all()
    probs = CategoricalCEM(3, horizon=4, candidates=16, top_k=1, iterations=5).plan(SumOfAction(index=2), start(3, 3))
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(3))


def test_categorical_cem_picks_the_rewarded_action():
    torch.manual_seed(0)
    planner = CategoricalCEM(3, horizon=5, candidates=100, top_k=10, iterations=4)
    toy = SumOfAction(index=2)
    action = planner.act(toy, start(4, 3), "eval")
    assert torch.equal(action, torch.tensor([[0.0, 0.0, 1.0]] * 4))
    seen = torch.cat(toy.seen)
    assert torch.equal(seen.sum(-1), torch.ones(len(seen)))  # every candidate action is one-hot
    assert torch.equal(planner.act(toy, start(4, 3), "sample").argmax(-1), torch.full((4,), 2))


def test_categorical_cem_through_a_vector_env():
    """PlaNet's act -> categorical CEM (toy dynamics) -> to_env_action -> Discrete(3) env receives action 2."""
    torch.manual_seed(0)
    spec = ActionSpec(True, 3)
    agent = PlaNet({"vector": (3,)}, spec, **planet(deter=8, units=8), layers=1, horizon=3, candidates=30, top_k=5,
                   iterations=3, action_noise=0.0)
    agent.plan_model = SumOfAction(index=2)
    cfg = {"id": "reverie.envs.testing.IdentityEnv", "kwargs": {"n": 3, "length": 4},
           "wrappers": [{"_target_": "reverie.envs.testing.RecordActions"}]}
    stepper = VectorStepper(make_vector_env(cfg, seed=0, num_envs=2))
    row, state = stepper.reset(), None
    for _ in range(3):
        action, state = agent.act(row, state, "explore")
        row, _ = stepper.step(action)
    recorded = stepper.env.get_attr("recorded_actions")
    stepper.close()
    assert [[int(a) for a in env_actions] for env_actions in recorded] == [[2, 2, 2], [2, 2, 2]]


def test_gaussian_planner_rejects_discrete_spaces():
    with pytest.raises(ValueError, match="Discrete\\(3\\).*planner=categorical"):
        make_planner(ActionSpec(True, 3), "gaussian")
    with pytest.raises(ValueError, match="planner=gaussian"):
        make_planner(ActionSpec(False, 2), "categorical")
    with pytest.raises(ValueError, match="Discrete"):
        PlaNet({"vector": (3,)}, ActionSpec(True, 3), **planet(deter=8, units=8), planner="gaussian")
    assert isinstance(make_planner(ActionSpec(True, 3)), CategoricalCEM)
    assert isinstance(make_planner(ActionSpec(False, 2)), GaussianCEM)
    with pytest.raises(ValueError, match="top_k <= candidates"):
        GaussianCEM(LOW, HIGH, candidates=5, top_k=6)


def test_score_discounts_continue_and_value_bootstrap():
    toy = SumOfAction(cont=0.5, value=10.0)
    actions = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])  # (H=2, M=1, A=2): rewards 3 and 7
    got = score(toy, start(1), actions, gamma=0.9)
    expected = 3.0 + 0.9 * 0.5 * 7.0 + (0.9 * 0.5) ** 2 * 10.0
    torch.testing.assert_close(got, torch.tensor([expected]))
    torch.testing.assert_close(score(SumOfAction(), start(1), actions), torch.tensor([10.0]))


def test_cem_works_with_dreamer_world_model_and_critic():
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **dreamer(deter=16, units=16))
    model = WorldModelPlanning.from_dreamer(agent)
    state = {k: v.detach() for k, v in agent.wm.dynamics.initial(3).items()}
    with torch.no_grad():
        critic_mean = model.value(state)
    assert critic_mean.shape == (3,)
    action = GaussianCEM([-1.0, -1.0], [1.0, 1.0], horizon=3, candidates=20, top_k=4, iterations=2).plan(model, state)
    assert action.shape == (3, 2) and bool((action.abs() <= 1.0).all())


def test_planners_discount_by_the_dynamics_discount_unless_given_one(monkeypatch):
    """The planners' gamma defaults to the dynamics' ``discount``: with DreamerV3's critic as the bootstrap that is the
    critic's gamma (0.997), not 1; an explicit gamma (PlaNet's plan_gamma) wins; dynamics without one sum (1.0)."""
    actions = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])  # (H=2, M=1, A=2): rewards 3 and 7
    toy = SumOfAction(value=10.0, discount=0.5)
    torch.testing.assert_close(score(toy, start(1), actions), torch.tensor([3.0 + 0.5 * 7.0 + 0.25 * 10.0]))
    torch.testing.assert_close(score(toy, start(1), actions, gamma=1.0), torch.tensor([20.0]))
    seen = []
    real_score = planning.score
    monkeypatch.setattr(planning, "score", lambda dyn, s0, acts, gamma: seen.append(
        planning.discount_of(dyn, gamma)) or real_score(dyn, s0, acts, gamma))
    GaussianCEM(LOW, HIGH, horizon=2, candidates=4, top_k=2, iterations=1).plan(toy, start(1))
    CategoricalCEM(2, horizon=2, candidates=4, top_k=2, iterations=1).plan(SumOfAction(discount=0.9), start(1))
    GaussianCEM(LOW, HIGH, horizon=2, candidates=4, top_k=2, iterations=1, gamma=1.0).plan(toy, start(1))
    GaussianCEM(LOW, HIGH, horizon=2, candidates=4, top_k=2, iterations=1).plan(SumOfAction(), start(1))
    assert seen == [0.5, 0.9, 1.0, 1.0]
    agent = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **dreamer(deter=16, units=16))
    assert agent.gamma == pytest.approx(1 - 1 / 333) and WorldModelPlanning.from_dreamer(agent).discount == agent.gamma
    assert WorldModelPlanning(agent.wm).discount == 1.0
    plan_agent = PlaNet({"vector": (3,)}, ActionSpec(False, 2), **planet(deter=8, units=8))
    assert plan_agent.planner.gamma == 1.0  # plan_gamma: the reference's plain sum of rewards


def test_gaussian_cem_refits_std_as_sqrt_of_the_elite_variance_plus_1e_6():
    """google-research/planet control/planning.py:38-57: start at mean 0, std 1 in [-1, 1]; candidates
    mean + std * N(0, 1) clipped into the box; refit mean and sqrt(population variance + 1e-6) of the top-k."""
    torch.manual_seed(4)
    n, C, H, A = 2, 6, 3, 2
    toy = SumOfAction()
    GaussianCEM([-1.0, -1.0], [1.0, 1.0], horizon=H, candidates=C, top_k=C, iterations=2).plan(toy, start(n))
    torch.manual_seed(4)
    eps1, eps2 = torch.randn(n, C, H, A), torch.randn(n, C, H, A)
    first = eps1.clamp(-1, 1)  # mean 0, std 1
    seen1 = torch.stack(toy.seen[:H]).reshape(H, n, C, A).permute(1, 2, 0, 3)  # (H, N*C, A) -> (N, C, H, A)
    torch.testing.assert_close(seen1, first)
    mean, std = first.mean(1), (first.var(1, unbiased=False) + 1e-6).sqrt()  # every candidate is an elite
    second = (mean[:, None] + std[:, None] * eps2).clamp(-1, 1)
    seen2 = torch.stack(toy.seen[H:]).reshape(H, n, C, A).permute(1, 2, 0, 3)
    torch.testing.assert_close(seen2, second)
    one = GaussianCEM(LOW, HIGH, horizon=2, candidates=5, top_k=1, iterations=2)
    assert torch.isfinite(one.plan(SumOfAction(), start(1))).all()
