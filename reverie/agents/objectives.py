"""The objectives the agents minimise, as plain functions of tensors: read them beside the papers. Imagined rows are
``(H, N)``, replayed rows ``(T, B)``; each function returns the per-row loss. The world model's own terms are in
:meth:`reverie.models.world_model.WorldModel.loss` and the dynamics' ``loss``. The actor's gradient estimators (2023
``actor_grad_disc`` / ``actor_grad_cont``): :class:`Reinforce` and :class:`Backprop`."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from reverie.models.distributions import TwoHotSymlog


def weighted_sum(losses: dict[str, torch.Tensor], scales: dict[str, float], owner: str) -> torch.Tensor:
    """``sum_k scales[k] * mean(losses[k])``, the one total of every agent (official ``agent.py:237-240``); RuntimeError
    when the loss keys and the scale keys differ as sets."""
    if losses.keys() != scales.keys():
        raise RuntimeError(f"{owner}: the update's losses are {sorted(losses)}, its scales are for {sorted(scales)} "
                           f"(a dynamics' or objective's loss() must return exactly its loss_keys)")
    return sum(scales[k] * v.mean() for k, v in losses.items())


def advantage(ret: torch.Tensor, value: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(R_t - v(s_t)) / S`` ``(H, N)`` in units of the return scale (DreamerV3 section 4, actor learning)."""
    return (ret - value) / scale


def reinforce_policy_loss(log_prob: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor, weight: torch.Tensor,
                          entropy_scale: float) -> torch.Tensor:
    """``-w_t (log pi(a_t | s_t) sg(A_t) + eta H[pi(. | s_t)])`` ``(H, N)`` (2023 ``agent.py``
    ``ImagActorCritic.loss`` ``'reinforce'``; 2025 ``imag_loss``); all arguments ``(H, N)``."""
    return -weight * (log_prob * adv.detach() + entropy_scale * entropy)


def backprop_policy_loss(adv: torch.Tensor, entropy: torch.Tensor, weight: torch.Tensor,
                         entropy_scale: float) -> torch.Tensor:
    """``-w_t (A_t + eta H[pi(. | s_t)])`` ``(H, N)``, the advantage's gradient flowing through the imagined states
    (2023 ``agent.py`` ``'backprop': -adv``)."""
    return -weight * (adv + entropy_scale * entropy)


def critic_loss(value: TwoHotSymlog, ret: torch.Tensor, slow: torch.Tensor, weight: torch.Tensor,
                slow_reg: float) -> torch.Tensor:
    """``-w_t (log p(sg(R_t) | s_t) + slow_reg log p(v_slow(s_t) | s_t))`` ``(H, N)``: two-hot regression to the
    lambda-return, regularised towards the slow critic (2023 ``agent.py`` ``VFunction.loss``; 2025 ``imag_loss``,
    ``repl_loss``)."""
    return -weight * value.log_prob_mix([ret.detach(), slow.detach()], [1.0, slow_reg])


def storm_lambda_return(reward: torch.Tensor, value: torch.Tensor, termination: torch.Tensor, gamma: float,
                        lam: float) -> torch.Tensor:
    """STORM's lambda-return ``(T, N)`` (weipu-zhang/STORM ``agents.py`` ``calc_lambda_return``): ``G_t = r_t + gamma
    (1 - d_t) ((1 - lam) v_t + lam G_{t+1})``, ``G_T = v_T``, with ``reward``, ``termination`` ``(T, N)`` and ``value
    (T+1, N)``. It bootstraps from ``v_t``, where :func:`reverie.agents.returns.lambda_return` reads ``v_{t+1}``."""
    cont = 1.0 - termination
    returns = [value[-1]]
    for t in range(reward.shape[0] - 1, -1, -1):
        returns.append(reward[t] + gamma * cont[t] * (1.0 - lam) * value[t] + gamma * cont[t] * lam * returns[-1])
    return torch.stack(returns[1:][::-1])


def kth_percentile(x: torch.Tensor, q: float) -> torch.Tensor:
    """The ``int(q * n)``-th smallest entry of ``x`` (STORM ``agents.py`` ``percentile``; no interpolation); at least
    the smallest (where STORM's ``kthvalue`` would get ``k = 0``: fewer than ``1 / q`` entries)."""
    flat = x.flatten()
    return torch.kthvalue(flat, max(1, int(q * flat.numel()))).values


class Reinforce:
    """REINFORCE (2023 ``actor_grad_disc: reinforce``; the 2025 agent's only estimator): the rollout samples without
    gradient; :meth:`loss` evaluates ``pi(. | s_t)`` on all ``H`` steps at once."""

    grad = False  # the rollout runs under no_grad

    def __init__(self, actor: nn.Module):
        self.actor = actor

    def value(self, critic: nn.Module, feat: torch.Tensor, critic_out: torch.Tensor) -> torch.Tensor:
        """The critic's values ``(H+1, N)``, constants, from the critic loss's own pass ``critic_out (H+1, N, 255)``."""
        return TwoHotSymlog(critic_out.detach()).mean

    def act(self, feat: torch.Tensor) -> torch.Tensor:
        """A one-hot action ``(N, A)`` from features ``(N, F)``."""
        return self.actor.sample(self.actor.net(feat))

    def loss(self, feat: torch.Tensor, action: torch.Tensor, adv: torch.Tensor, weight: torch.Tensor,
             entropy_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss (H, N), entropy (H, N))`` from ``feat (H+1, N, F)`` and ``action (H+1, N, A)``."""
        policy = self.actor(feat[:-1].detach())  # pi(. | s_t), t < H
        entropy = policy.entropy()
        return reinforce_policy_loss(policy.log_prob(action[:-1]), adv, entropy, weight, entropy_scale), entropy

    def close(self) -> None:
        """Nothing to drop."""


class Backprop:
    """Backprop through the imagined dynamics (2023 ``actor_grad_cont: backprop``; discrete actions with
    ``actor_grad_disc: backprop``, straight-through): the rollout keeps its gradient."""

    grad = True

    def __init__(self, actor: nn.Module):
        self.actor, self.entropies = actor, []

    def value(self, critic: nn.Module, feat: torch.Tensor, critic_out: torch.Tensor) -> torch.Tensor:
        """The critic's values ``(H+1, N)``, differentiable in the imagined states (their own pass)."""
        return TwoHotSymlog(critic(feat)).mean

    def act(self, feat: torch.Tensor) -> torch.Tensor:
        """A reparameterised or straight-through action ``(N, A)``; the actor's input is detached."""
        policy = self.actor(feat.detach())
        self.entropies.append(policy.entropy())
        return policy.rsample()

    def loss(self, feat: torch.Tensor, action: torch.Tensor, adv: torch.Tensor, weight: torch.Tensor,
             entropy_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss (H, N), entropy (H, N))``; ``adv`` carries the gradient of the rollout."""
        entropy = torch.stack(self.entropies[:adv.shape[0]])
        return backprop_policy_loss(adv, entropy, weight, entropy_scale), entropy

    def close(self) -> None:
        self.entropies = []


ESTIMATORS: dict[str, Callable[..., Reinforce | Backprop]] = {"reinforce": Reinforce, "backprop": Backprop}
