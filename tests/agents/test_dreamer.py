import gc
import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.models.distributions import Bernoulli, TwoHotSymlog
from reverie.types import ActionSpec
from helpers.agents import dreamer, vector_batch

TINY = dreamer(deter=16, units=16, horizon=3)


@pytest.mark.parametrize("discrete", [True, False])
def test_update_returns_finite_metrics_and_act_shapes(discrete):
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), **TINY)
    metrics = agent.update(vector_batch())
    for key in ("loss/vector", "loss/reward", "loss/cont", "loss/dyn", "loss/rep", "loss/actor", "loss/critic"):
        assert np.isfinite(metrics[key]), key
    obs = {"vector": np.zeros((5, 4), np.float32), "is_first": np.ones(5, bool)}
    action, state = agent.act(obs, None, "explore")
    assert action.shape == (5, 2) and action.dtype == np.float32
    if discrete:
        assert np.all(action.sum(-1) == 1.0)
    else:
        assert np.all(np.abs(action) <= 1.0)
    torch.manual_seed(1)  # latents are sampled in every mode (as in the reference); the actor takes its mode
    a1, _ = agent.act(obs, None, "eval")
    torch.manual_seed(1)
    a2, _ = agent.act(obs, None, "eval")
    assert np.array_equal(a1, a2)


def test_loss_scales_must_match_world_model_losses():
    with pytest.raises(ValueError, match="loss_scales keys \\['bogus'\\] are not losses"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), loss_scales={"bogus": 1.0}, **TINY)


def test_state_dict_round_trip_acts_identically():
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    agent.update(vector_batch())
    other = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    other.load_state_dict(agent.state_dict())
    obs = {"vector": np.ones((2, 4), np.float32), "is_first": np.ones(2, bool)}
    torch.manual_seed(1)
    mine = agent.act(obs, None, "eval")[0]
    torch.manual_seed(1)
    assert np.array_equal(mine, other.act(obs, None, "eval")[0])
    assert other.model_opt.state_dict()["state"].keys() == agent.model_opt.state_dict()["state"].keys()
    assert other.retnorm.high.item() == agent.retnorm.high.item()


def test_slow_critic_copies_the_critic_at_the_first_update_then_tracks_it_by_ema():
    """The 2023 reference's SlowUpdater: mix 1 at its first call (after the first critic step), then 0.02."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), slow_critic_fraction=0.02, **TINY)
    agent.update(vector_batch())
    for slow, fast in zip(agent.slow_critic.parameters(), agent.critic.parameters()):
        assert torch.equal(slow, fast)
    slow_before = [p.clone() for p in agent.slow_critic.parameters()]
    agent.update(vector_batch())
    for before, slow, fast in zip(slow_before, agent.slow_critic.parameters(), agent.critic.parameters()):
        torch.testing.assert_close(slow, 0.98 * before + 0.02 * fast)
        assert not torch.equal(slow, fast)


def test_advantage_at_t_weights_log_prob_of_action_taken_at_t(monkeypatch):
    """A one-step bandit in imagination: reward 1 arrives after action 1 was taken at the start state.

    The update must raise pi(action 1 | start). Pairing the advantage of step t with the action of step t+1
    (here always the opposite action) would lower it instead.
    """
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), actor_lr=1e-2, actor_entropy=0.0,
                      **dreamer(deter=16, units=16, horizon=1, kernels="off"))
    dynamics = agent.wm.dynamics
    start = {k: v.expand(64, *v.shape[1:]).clone() for k, v in dynamics.initial(1).items()}

    def fake_imagine(policy, start_state, horizon):
        n = start_state["deter"].shape[0]
        a0 = torch.arange(n) % 2
        nxt = {k: v.clone() for k, v in start_state.items()}
        nxt["deter"][:, 0] = 100.0 * a0  # the next state remembers which action led to it
        states = {k: torch.stack([start_state[k], nxt[k]]) for k in start_state}
        policy(start_state), policy(nxt)  # the agent records pi(. | s_t) through its policy, as in a real rollout
        actions = torch.stack([torch.eye(2)[a0], torch.eye(2)[1 - a0]])  # action at t+1 is always the other one
        return states, actions

    monkeypatch.setattr(dynamics, "imagine", fake_imagine)
    monkeypatch.setattr(agent.wm, "reward", lambda feat: TwoHotSymlog(torch.where(
        (feat[..., :1] > 50.0), torch.nn.functional.one_hot(torch.tensor(150), 255).float() * 50.0,
        torch.zeros(255))))  # reward ~1.2 after action 1, 0 after action 0

    def prob_action_1():
        with torch.no_grad():
            return agent.actor(dynamics.features(start)).probs[0, 1].item()

    before = prob_action_1()
    for _ in range(5):
        agent._behavior(start, torch.ones(64))
    assert prob_action_1() > before + 0.05


def test_return_normaliser_range_metrics_match_its_state():
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    metrics = agent.update(vector_batch())
    low, high = agent.retnorm.low.item(), agent.retnorm.high.item()
    assert (metrics["return/low"], metrics["return/high"]) == pytest.approx((low, high), abs=1e-7)
    assert low < high  # one update moves the EMAs 1% of the way from 0 towards the 5th / 95th percentiles
    assert metrics["return/scale"] == pytest.approx(max(1.0, high - low))
    assert metrics["value/std"] >= 0.0


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_acting_then_updating_in_each_precision(precision):
    """act() runs under inference mode; the layers' cached compute-dtype weights from it must not reach the
    update's backward pass (inference tensors cannot be saved for backward)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **{**TINY, "precision": precision})
    obs = {"vector": np.zeros((20, 4), np.float32), "is_first": np.ones(20, bool)}
    for _ in range(2):
        agent.act(obs, None, "explore")
        metrics = agent.update(vector_batch(T=8, B=40))  # 320 imagination starts: the gather path
        assert np.isfinite(metrics["loss/actor"]) and np.isfinite(metrics["loss/model"])


def check_gradient_at_step(name: str, reference_loss, atol: float, discrete: bool = True) -> None:
    """Two updates (discrete or continuous actions); at the second one's ``<name>_opt.step``
    the gradient it steps with must equal
    autograd's gradient of ``reference_loss(agent, feat, actions, reward, cont)`` on that update's own rollout
    (``feat (H+1, N, F)`` dense, ``reward``/``cont (H+1, N)`` as the update builds them), with the networks as
    the update used them (before the step)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), **TINY)
    agent.update(vector_batch())  # move the heads off their zero-initialised outputs
    dynamics, module, opt, rollout, checked = agent.wm.dynamics, getattr(agent, name), getattr(agent, f"{name}_opt"), \
        {}, {}
    imagine, step = dynamics.imagine, opt.step
    dynamics.imagine = lambda *a, **k: rollout.setdefault("out", imagine(*a, **k))

    def reference_then_step(*args, **kwargs):
        states, actions = rollout["out"]
        with torch.no_grad():
            feat = dynamics.features(states).as_subclass(torch.Tensor)  # (H+1, N, F), a plain tensor
            reward = torch.cat([torch.zeros_like(feat[:1, :, 0]), agent.wm.reward(feat[1:]).mean])
            cont = torch.cat([torch.ones_like(feat[:1, :, 0]), agent.wm.cont(feat[1:]).mode])
        loss = reference_loss(agent, feat, actions, reward, cont)
        expected = torch.autograd.grad(loss, list(module.parameters()))
        for p, g in zip(module.parameters(), expected):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=atol)
        checked["grads"] = sum(float(g.abs().sum()) for g in expected)
        return step(*args, **kwargs)

    opt.step = reference_then_step
    agent.update(vector_batch(seed=1))
    assert checked["grads"] > 0.0


@pytest.mark.parametrize("discrete", [True, False])
def test_critic_gradient_equals_the_one_pass_reference(discrete):
    """The critic's loss (two-hot regression to the lambda-return plus the slow-critic regulariser, weighted by the
    imagined continuation) written out with one dense critic pass over all H+1 steps and ``log_prob``."""
    from reverie.agents.returns import imagination_weights, lambda_return

    def critic_loss(agent, feat, actions, reward, cont):
        with torch.no_grad():
            slow = TwoHotSymlog(agent.slow_critic(feat[:-1])).mean
        out = agent.critic(feat)  # (H+1, N, 255)
        ret = lambda_return(reward, TwoHotSymlog(out).mean.detach(), cont, agent.gamma, agent.lam)
        dist = TwoHotSymlog(out[:-1])
        return -(imagination_weights(cont, agent.gamma)[:-1] * (dist.log_prob(ret) + agent.slow_reg
                                                                * dist.log_prob(slow))).mean()

    check_gradient_at_step("critic", critic_loss, atol=1e-6, discrete=discrete)


def test_actor_gradient_equals_a_fresh_pass_reference():
    """Discrete actions: the actor's loss (REINFORCE: advantage-weighted log-likelihood of the rollout's actions
    plus the entropy bonus, weighted by the imagined continuation; eq. 8-9) written out with a fresh actor pass
    over the imagined states, as the update's own loss pass does (reverie.agents.objectives.Reinforce)."""
    from reverie.agents.returns import imagination_weights, lambda_return

    def actor_loss(agent, feat, actions, reward, cont):
        with torch.no_grad():
            value = TwoHotSymlog(agent.critic(feat)).mean
            ret = lambda_return(reward, value, cont, agent.gamma, agent.lam)
            adv = (ret - value[:-1]) / agent.retnorm.scale()  # the normaliser as updated by this batch
        dist = agent.actor(feat[:-1])
        objective = dist.log_prob(actions[:-1]) * adv + agent.actor_entropy * dist.entropy()
        return -(imagination_weights(cont, agent.gamma)[:-1] * objective).mean()

    check_gradient_at_step("actor", actor_loss, atol=1e-7)


def test_imag_last_imagines_from_the_last_rows_only():
    """``imag_last=K``: the behaviour starts from the posterior states of the last K rows, ``N = K*B``, with the start
    continue flags of those rows; 0 starts from all ``T*B`` rows (the 2023 reference)."""
    for imag_last, rows in ((2, slice(4, 6)), (0, slice(0, 6))):
        torch.manual_seed(0)
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY, imag_last=imag_last)
        data = vector_batch(T=6, B=3)
        data["is_terminal"][5, 1] = True
        seen = {}
        behavior = agent._behavior
        agent._behavior = lambda start, cont: seen.update(start=start, cont=cont) or behavior(start, cont)
        torch.manual_seed(1)
        agent.update(data)
        expected_cont = 1.0 - torch.as_tensor(data["is_terminal"][rows]).flatten().float()  # (K, B) -> (K*B,)
        assert seen["start"]["deter"].shape[0] == (rows.stop - rows.start) * 3
        torch.testing.assert_close(seen["cont"], expected_cont)
    with pytest.raises(ValueError, match="imag_last must be >= 0"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY, imag_last=-1)


@pytest.mark.parametrize("discrete", [True, False])
def test_update_model_is_the_world_model_step_of_update(discrete):
    """From the same state and RNG, update_model and update leave the same world model (its step comes first in
    update); update_model leaves actor, critic, slow critic, normaliser and their optimisers as built."""
    torch.manual_seed(0)
    full = DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), **TINY)
    model_only = DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), **TINY)
    model_only.load_state_dict(full.state_dict())
    before = {k: v.clone() for k, v in model_only.state_dict()["modules"].items()}
    torch.manual_seed(1)
    full_metrics = full.update(vector_batch())
    torch.manual_seed(1)
    metrics = model_only.update_model(vector_batch())
    assert metrics == {k: v for k, v in full_metrics.items() if k in metrics}
    assert "loss/vector" in metrics and "loss/actor" not in metrics and metrics["guard/nonfinite"] == 0.0
    after = model_only.state_dict()
    for key, value in full.state_dict()["modules"].items():
        if key.startswith("wm."):
            assert torch.equal(after["modules"][key], value), key
        else:
            assert torch.equal(after["modules"][key], before[key]), key
    assert not after["actor_opt"]["state"] and not after["critic_opt"]["state"] and after["model_opt"]["state"]


def test_load_pretrained_takes_the_world_model_or_everything():
    torch.manual_seed(0)
    trained = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    trained.update(vector_batch())
    state = trained.state_dict()
    torch.manual_seed(1)
    fresh = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    own = {k: v.clone() for k, v in fresh.state_dict()["modules"].items()}
    assert fresh.load_pretrained(state, behavior=False) == ["world model"]
    now = fresh.state_dict()
    for key, value in now["modules"].items():
        assert torch.equal(value, state["modules"][key] if key.startswith("wm.") else own[key]), key
    assert now["model_opt"]["state"][0]["exp_avg"].equal(state["model_opt"]["state"][0]["exp_avg"])
    assert not now["actor_opt"]["state"]
    assert fresh.load_pretrained(state, behavior=True) == ["world model", "actor", "critic", "slow_critic", "retnorm"]
    for key, value in fresh.state_dict()["modules"].items():
        assert torch.equal(value, state["modules"][key]), key


@pytest.mark.parametrize("imag_cont, c", [("mode", 1.0), ("prob", 0.6)])
def test_imag_cont_reads_the_continue_heads_mode_or_its_probability(monkeypatch, imag_cont, c):
    """Imagined reward 1 per step, the critic's zero-initialised value 0, continue probability 0.6 at every imagined
    step (its mode: 1). By hand, with ``q = gamma * c * lam``: ``R_2 = 1``, ``R_1 = 1 + q``, ``R_0 = 1 + q + q^2``
    (H = 3), where ``c`` is 1 for ``imag_cont="mode"`` (2023 reference) and 0.6 for ``"prob"`` (current official)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(deter=16, units=16, horizon=3, kernels="off"),
                      imag_cont=imag_cont)
    monkeypatch.setattr(agent.wm, "cont", lambda feat: Bernoulli(torch.full(feat.shape[:-1], math.log(0.6 / 0.4))))
    monkeypatch.setattr(agent.wm, "reward", lambda feat: SimpleNamespace(mean=torch.ones(feat.shape[:-1])))
    start = {k: v.expand(8, *v.shape[1:]).clone() for k, v in agent.wm.dynamics.initial(1).items()}
    metrics, _ = agent._behavior(start, torch.ones(8))
    assert abs(float(metrics["value/mean"])) < 1e-6  # the critic's output layer starts at zero
    q = agent.gamma * c * agent.lam
    assert float(metrics["return/mean"]) == pytest.approx((1 + (1 + q) + (1 + q + q * q)) / 3, abs=1e-5)


def test_imag_cont_refuses_an_unknown_reading():
    with pytest.raises(ValueError, match="imag_cont must be one of \\('mode', 'prob'\\)"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY, imag_cont="mean")


def test_the_presets_read_the_continue_as_the_docs_say():
    """The 2023 reference's reading (the mode) under exp=reference and exp=dmc_cpu; exp=classic (the default run)
    reads the probability, what keeps CartPole solved (docs/dreamerv3.md); either is a knob."""
    from reverie.configs.compose import load_config

    for overrides in (["exp=reference"], ["exp=dmc_cpu", "env=dmc_proprio"], ["agent.module.imag_cont=mode"]):
        assert load_config(overrides).agent.module.imag_cont == "mode", overrides
    for overrides in ([], ["env=pendulum"]):
        assert load_config(overrides).agent.module.imag_cont == "prob", overrides


@pytest.mark.parametrize("agent_name", ["dreamerv3", "dreamerv3_2025", "planet"])
def test_a_float64_agent_acts_from_its_initial_state(agent_name):
    """``precision=float64``: the first step's previous action (zeros) and the chosen action are float64 like the
    parameters (they were float32 and the first or second act raised a dtype error; PlaNet's CEM drew float32
    candidates)."""
    from reverie.agents.build import build_agent
    from reverie.configs.compose import load_config

    cfg = load_config([f"agent={agent_name}", "exp=debug", "agent.module.precision=float64"])
    agent = build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(True, 2))
    obs = {"vector": np.zeros((3, 4), np.float32), "is_first": np.ones(3, bool)}
    action, state = agent.act(obs, None, "explore")
    action, _ = agent.act(obs | {"is_first": np.zeros(3, bool)}, state, "explore")
    assert action.shape == (3, 2) and np.allclose(action.sum(-1), 1.0)


def test_the_imagined_states_are_freed_before_the_actor_and_critic_steps():
    """_behavior reads the rollout's stacked states only for the features: on the readable path (kernels off, the
    features a concatenated copy) they are freed before the two backward passes, not held to the end (-23% peak
    memory of the xs update, docs/dreamerv3.md)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **(TINY | {"kernels": "off"}))
    dynamics, refs, alive = agent.wm.dynamics, [], []
    imagine, step = dynamics.imagine, agent._step

    def recording_imagine(*args, **kwargs):
        states, actions = imagine(*args, **kwargs)
        refs.extend(weakref.ref(value) for value in states.values())
        return states, actions

    def checking_step(*args, **kwargs):
        if refs:  # the behaviour phase's steps (the world model's step comes before the rollout)
            gc.collect()
            alive.append(sum(ref() is not None for ref in refs))
        return step(*args, **kwargs)

    dynamics.imagine, agent._step = recording_imagine, checking_step
    agent.update(vector_batch())
    assert len(refs) == 2 and alive == [0, 0]  # deter and stoch; the actor's and the critic's step
