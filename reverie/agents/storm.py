"""STORM's actor-critic (Zhang et al. 2023, "STORM: Efficient Stochastic Transformer based World Models for
Reinforcement Learning"; weipu-zhang/STORM at 1c50658, ``agents.py`` ``ActorCriticAgent``), the behaviour half of
``agent=storm`` (issue 44; its world model is :class:`reverie.models.dynamics.TransformerDynamics`).

Where STORM's equations are DreamerV3's, the functions are :mod:`reverie.agents.objectives`'; where they differ,
STORM's own: the lambda-return bootstraps from ``v_t`` (:func:`~reverie.agents.objectives.storm_lambda_return`), the
percentiles are k-th values (:func:`~reverie.agents.objectives.kth_percentile`), the losses are plain means (no
continue weights), the critic is regularised towards the slow critic's lambda-return (not its values), and one Adam
trains actor and critic together. Checked against STORM's own update by tests/goldens/test_storm_actor_critic.py.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from reverie.agents import objectives
from reverie.agents.base import guarded_step
from reverie.agents.returns import ReturnNormalizer
from reverie.models.distributions import TwoHotSymlog


def storm_mlp(inputs: int, units: int, layers: int, outputs: int) -> nn.Sequential:
    """``layers`` x (Linear without bias, LayerNorm, ReLU), then a Linear to ``outputs`` (STORM ``agents.py``
    ``ActorCriticAgent.__init__``; its parameter names: ``0.weight``, ``1.weight``, ``1.bias``, ...)."""
    mods: list[nn.Module] = []
    for i in range(layers):
        mods += [nn.Linear(inputs if i == 0 else units, units, bias=False), nn.LayerNorm(units), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(units, outputs))


class KthReturnNormalizer(ReturnNormalizer):
    """:class:`ReturnNormalizer` with STORM's k-th value percentiles (``utils.py`` ``EMAScalar``, decay 0.99,
    starting at 0; the scale ``max(1, high - low)``)."""

    def _quantiles(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return objectives.kth_percentile(x, self.low_q), objectives.kth_percentile(x, self.high_q)


class StormActorCritic(nn.Module):
    """STORM's policy and value on imagined features, with its update.

    Args:
        feat_dim: ``F``, the width of the features the actor and critic read. actions: ``A`` (discrete).
        units, layers: the MLPs' width and depth (STORM ``Agent.HiddenDim: 512``, ``NumLayers: 2``).
        gamma, lam, entropy: ``Gamma: 0.985``, ``Lambda: 0.95``, ``EntropyCoef: 3e-4`` (``config_files/STORM.yaml``).
        lr, eps, clip: the one Adam over actor and critic (3e-5, 1e-5) and its gradient-norm clip (100).
        slow_decay: the slow critic's EMA decay, every update (0.98).
    """

    def __init__(self, feat_dim: int, actions: int, units: int = 512, layers: int = 2, gamma: float = 0.985,
                 lam: float = 0.95, entropy: float = 3e-4, lr: float = 3e-5, eps: float = 1e-5, clip: float = 100.0,
                 slow_decay: float = 0.98):
        super().__init__()
        self.gamma, self.lam, self.entropy, self.clip, self.slow_decay = gamma, lam, entropy, clip, slow_decay
        self.actor = storm_mlp(feat_dim, units, layers, actions)
        self.critic = storm_mlp(feat_dim, units, layers, 255)
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.register_buffer("bins", torch.linspace(-20.0, 20.0, 255), persistent=False)  # STORM's two-hot bins
        self.retnorm = KthReturnNormalizer()
        self.opt = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=lr, eps=eps)

    def policy(self, feat: torch.Tensor) -> torch.distributions.Categorical:
        """``pi(. | s)`` from features ``(..., F)``."""
        return torch.distributions.Categorical(logits=self.actor(feat))

    def update(self, feat: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
               termination: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
        """One update on an imagined rollout (STORM ``ActorCriticAgent.update``): ``feat (T+1, N, F)``, the
        actions taken ``action (T, N)`` (indices), ``reward`` and ``termination`` ``(T, N)``.

        Returns:
            ``(metrics, skipped)``: the losses, entropy, return scale; 1 when the guard skipped the step.
        """
        critic_out = self.critic(feat)  # (T+1, N, 255)
        value = TwoHotSymlog(critic_out, bins=self.bins).mean  # (T+1, N)
        with torch.no_grad():
            slow = TwoHotSymlog(self.slow_critic(feat), bins=self.bins).mean
        ret = objectives.storm_lambda_return(reward, value, termination, self.gamma, self.lam)  # (T, N)
        slow_ret = objectives.storm_lambda_return(reward, slow, termination, self.gamma, self.lam)
        value_dist = TwoHotSymlog(critic_out[:-1], bins=self.bins)
        value_loss = -value_dist.log_prob(ret.detach()).mean()
        slow_reg = -value_dist.log_prob(slow_ret.detach()).mean()
        stats = self.retnorm.next(ret)
        scale = self.retnorm.scale(stats)
        adv = objectives.advantage(ret, value[:-1], scale)
        policy = self.policy(feat[:-1])
        entropy = policy.entropy()  # (T, N)
        policy_loss = objectives.reinforce_policy_loss(policy.log_prob(action), adv, entropy,
                                                       torch.ones_like(adv), 0.0).mean()
        loss = policy_loss + value_loss + slow_reg - self.entropy * entropy.mean()
        norm, skipped = guarded_step(self.opt, loss, [*self.actor.parameters(), *self.critic.parameters()],
                                     self.clip, ok=bool(torch.isfinite(ret).all()))
        if not skipped:
            self.retnorm.commit(stats)
            with torch.no_grad():
                for s, f in zip(self.slow_critic.parameters(), self.critic.parameters()):
                    s.copy_(s * self.slow_decay + f * (1.0 - self.slow_decay))  # STORM's update_slow_critic
        metrics = {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(),
                   "loss/slow_reg": slow_reg.detach(), "actor/entropy": entropy.detach().mean(),
                   "return/S": (stats[1] - stats[0]).detach(), "return/scale": scale.detach(),
                   "loss/total": loss.detach(), "grad_norm/total": norm}
        return metrics, skipped
