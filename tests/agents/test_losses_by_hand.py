"""DreamerV3's (2023) actor and critic losses on a rollout small enough to write out: every expected number is
computed here from the formulas (lambda-return, imagination weights, symlog two-hot, unimix policy, normal entropy)
in plain torch, not with reverie's ``lambda_return``, ``imagination_weights``, two-hot distributions or heads
(the wiring tests in test_dreamer.py compare against those).

The setting (H = 2 imagined steps, N = 2 starts, float64): the actor's, critic's and slow critic's output layers
have zero weights, so their outputs are their biases at every state: a fixed policy ``pi``, a fixed value ``v``
and a fixed slow value ``s``. The rollout, its rewards and its continue flags are fixed by hand. Reference: the 2023
DreamerV3 paper, section 4 (eq. 7-10) and danijar/dreamerv3 8fa35f8 ``agent.py`` ``ImagActorCritic.loss`` /
``VFunction.loss``. Tolerance: 1e-6 relative, the rounding of the 255 bin centres, which the heads keep in float32
(the rest of the computation is float64)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec

from helpers.agents import dreamer

H, N, GAMMA, LAM, ETA, SLOW_REG = 2, 2, 0.9, 0.8, 0.1, 0.5
REWARD = torch.tensor([[1.0, -0.5], [2.0, 0.25]], dtype=torch.float64)  # r_1, r_2 (H, N): on arriving at t = 1, 2
CONT = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)  # c_1, c_2: start 1 ends at step 2


def bins() -> torch.Tensor:
    return torch.linspace(-20.0, 20.0, 255, dtype=torch.float64)  # symlog space, as the 2023 reference


def symexp(x: float) -> float:
    return math.copysign(math.expm1(abs(x)), x)


def symlog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def head_value(bias: torch.Tensor) -> float:
    """The 2023 two-hot head's prediction: ``symexp(sum_k softmax(bias)_k * bin_k)``."""
    return symexp(float((torch.softmax(bias, 0) * bins()).sum()))


def two_hot_log_prob(bias: torch.Tensor, target: float) -> float:
    """``log p`` of the symlog two-hot encoding of ``target``: the two bins around ``symlog(target)``, weights
    linear in the distance (eq. 10)."""
    y, b = symlog(target), bins()
    k = int(torch.searchsorted(b, torch.tensor(y, dtype=torch.float64), right=True)) - 1  # b[k] <= y < b[k + 1]
    frac = (y - float(b[k])) / float(b[k + 1] - b[k])
    logp = torch.log_softmax(bias, 0)
    return (1.0 - frac) * float(logp[k]) + frac * float(logp[k + 1])


def returns_and_weights(v: float) -> tuple[list[list[float]], list[list[float]]]:
    """Lambda-returns ``R_t`` (t = 0, 1) and weights ``w_t`` per start, with the same value ``v`` at every state:
    ``R_1 = r_2 + gamma c_2 v``, ``R_0 = r_1 + gamma c_1 ((1 - lam) v + lam R_1)``; ``w_0 = 1``,
    ``w_1 = gamma c_1`` (the discount to step 1 times the chance it is reached, over gamma)."""
    ret, weight = [], []
    for n in range(N):
        r1, r2, c1, c2 = float(REWARD[0, n]), float(REWARD[1, n]), float(CONT[0, n]), float(CONT[1, n])
        big_r1 = r2 + GAMMA * c2 * v
        big_r0 = r1 + GAMMA * c1 * ((1 - LAM) * v + LAM * big_r1)
        ret.append([big_r0, big_r1])
        weight.append([1.0, GAMMA * c1])
    return ret, weight


def fixed_agent(discrete: bool, monkeypatch, **kwargs):
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(discrete, 2), gamma=GAMMA, lam=LAM, actor_entropy=ETA,
                      slow_reg=SLOW_REG, **dreamer(deter=8, units=8, horizon=H, kernels="off", precision="float64"),
                      **kwargs)
    biases = {}
    for name, net, size in (("actor", agent.actor.net, 2 if discrete else 4), ("critic", agent.critic, 255),
                            ("slow", agent.slow_critic, 255)):
        bias = torch.linspace(-1.0, 1.5, size, dtype=torch.float64) * (0.3 if name == "actor" else 0.02)
        if name == "slow":
            bias = bias.flip(0)  # another distribution: another value
        with torch.no_grad():
            net.out.weight.zero_()
            net.out.bias.copy_(bias)
        biases[name] = bias
    dynamics = agent.wm.dynamics
    start = {k: v.expand(N, *v.shape[1:]).clone() for k, v in dynamics.initial(1).items()}
    actions = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]],
                           dtype=torch.float64)  # (H+1, N, A): a_0, a_1 (a_2 is never scored)
    if not discrete:
        actions = actions * 0.6 - 0.3

    def fake_imagine(policy, start_state, horizon):
        states = {k: torch.stack([v] * (horizon + 1)) for k, v in start_state.items()}
        for t in range(horizon + 1):
            policy({k: v[t] for k, v in states.items()})  # the agent's own passes, as in a real rollout
        return states, actions

    monkeypatch.setattr(dynamics, "imagine", fake_imagine)
    monkeypatch.setattr(agent.wm, "reward", lambda feat: SimpleNamespace(mean=REWARD))
    monkeypatch.setattr(agent.wm, "cont", lambda feat: SimpleNamespace(mode=CONT))
    return agent, start, actions, biases


def test_discrete_actor_and_critic_losses_by_hand(monkeypatch):
    """REINFORCE (eq. 9-10): ``L = -mean_{t,n} w_t (log pi(a_t) (R_t - v) / S + eta H[pi])`` with ``S = 1`` (the
    percentile range of these small returns, times 0.01 after one EMA step, is below the limit 1); the critic's
    ``-mean w_t (log p(R_t) + slow_reg log p(s))`` over the symlog two-hot targets."""
    agent, start, actions, biases = fixed_agent(True, monkeypatch)
    metrics, _ = agent._behavior(start, torch.ones(N, dtype=torch.float64))

    v, s = head_value(biases["critic"]), head_value(biases["slow"])
    ret, weight = returns_and_weights(v)
    probs = 0.99 * torch.softmax(biases["actor"], 0) + 0.01 / 2  # the 1% unimix policy
    entropy = -float((probs * probs.log()).sum())
    actor = critic = 0.0
    for n in range(N):
        for t in range(H):
            logpi = math.log(float(probs[int(actions[t, n].argmax())]))
            actor += weight[n][t] * (logpi * (ret[n][t] - v) + ETA * entropy)
            critic += weight[n][t] * (two_hot_log_prob(biases["critic"], ret[n][t])
                                      + SLOW_REG * two_hot_log_prob(biases["critic"], s))
    assert float(metrics["return/scale"]) == 1.0
    assert float(metrics["value/mean"]) == pytest.approx(v, rel=1e-6)
    assert float(metrics["return/mean"]) == pytest.approx(sum(map(sum, ret)) / (H * N), rel=1e-6)
    assert float(metrics["loss/actor"]) == pytest.approx(-actor / (H * N), rel=1e-6, abs=1e-9)
    assert float(metrics["loss/critic"]) == pytest.approx(-critic / (H * N), rel=1e-6, abs=1e-9)


def test_continuous_actor_loss_by_hand(monkeypatch):
    """Dynamics backpropagation (eq. 9, continuous): the objective is the normalised advantage itself,
    ``L = -mean_{t,n} w_t ((R_t - v) / S + eta H[pi])`` with ``H`` the entropy of the diagonal normal
    ``N(tanh(m), ((1 - 0.1) sigmoid(u + 2) + 0.1)^2)``: ``sum_a 1/2 log(2 pi e std_a^2)``."""
    agent, start, actions, biases = fixed_agent(False, monkeypatch)
    metrics, _ = agent._behavior(start, torch.ones(N, dtype=torch.float64))

    v = head_value(biases["critic"])
    ret, weight = returns_and_weights(v)
    std_raw = biases["actor"][2:]  # the net's output (mean_raw, std_raw) = its bias
    entropy = sum(0.5 * math.log(2 * math.pi * math.e * (0.9 / (1 + math.exp(-(float(u) + 2))) + 0.1) ** 2)
                  for u in std_raw)
    actor = sum(weight[n][t] * ((ret[n][t] - v) + ETA * entropy) for n in range(N) for t in range(H))
    assert float(metrics["return/scale"]) == 1.0
    assert float(metrics["actor/entropy"]) == pytest.approx(entropy, rel=1e-9)
    assert float(metrics["loss/actor"]) == pytest.approx(-actor / (H * N), rel=1e-6, abs=1e-9)


def test_discrete_backprop_actor_loss_by_hand(monkeypatch):
    """``actor_grad_disc=backprop`` (reference ``agent.py``: ``'backprop': -adv``): as the continuous loss, the
    objective is the normalised advantage itself, ``L = -mean_{t,n} w_t ((R_t - v) / S + eta H[pi])``, here with
    the entropy of the unimix categorical ``p = 0.99 softmax(b) + 0.01 / 2``: ``-sum_a p_a log p_a``."""
    agent, start, actions, biases = fixed_agent(True, monkeypatch, actor_grad_disc="backprop")
    metrics, _ = agent._behavior(start, torch.ones(N, dtype=torch.float64))

    v = head_value(biases["critic"])
    ret, weight = returns_and_weights(v)
    p = 0.99 * torch.softmax(biases["actor"], 0) + 0.01 / 2
    entropy = -float((p * p.log()).sum())
    actor = sum(weight[n][t] * ((ret[n][t] - v) + ETA * entropy) for n in range(N) for t in range(H))
    assert float(metrics["return/scale"]) == 1.0
    assert float(metrics["actor/entropy"]) == pytest.approx(entropy, rel=1e-9)
    assert float(metrics["loss/actor"]) == pytest.approx(-actor / (H * N), rel=1e-6, abs=1e-9)
