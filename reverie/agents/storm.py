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
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from reverie.agents import objectives
from reverie.agents.base import UpdateResult, guarded_step
from reverie.agents.dreamer import DreamerV3
from reverie.agents.returns import ReturnNormalizer
from reverie.models.distributions import TwoHotSymlog
from reverie.runtime.precision import autocast


@runtime_checkable
class HasPrior(Protocol):
    """A dynamics that can replace a state's latent by its prior's (``act_on="prior"``)."""

    def prior(self, state: dict[str, torch.Tensor], sample: bool = True) -> dict[str, torch.Tensor]: ...


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
        value = TwoHotSymlog(critic_out.detach(), bins=self.bins).mean  # (T+1, N): returns and baseline, constants
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


class Storm(DreamerV3):
    """``agent=storm``: a world model (by default :class:`reverie.models.dynamics.TransformerDynamics`, STORM's
    transformer) trained as DreamerV3's, and STORM's actor-critic (:class:`StormActorCritic`) trained on imagined
    rollouts from it. Discrete actions only (STORM is an Atari agent).

    What is STORM's here and what is not yet: docs/transformer.md, "agent=storm". STORM's: the actor-critic and its
    update (checked against its code), the imagination starts (``imag_contexts`` fresh contexts of
    ``imag_context`` replayed steps, observed without dropout, then the prior of the step after them,
    ``train.py:52-73``), acting on the prior (``act_on``) and the world model's loss layout (``loss_layout``,
    checked against its ``WorldModel.update``).

    Args:
        obs_shapes, action_spec, dynamics, units, layers, mlp_units, mlp_layers, cnn_depth, cnn, loss_scales,
            model_lr, model_eps, model_clip, device, precision, kernels, representation, objectives, head_inputs:
            the world model's, as :class:`reverie.agents.DreamerV3` (STORM's heads: ``agent=storm`` sets
            ``head_inputs`` to the decoder from ``z``, reward and continue from ``h``). nets: ``"storm"``,
            STORM's BatchNorm conv stacks and heads (:mod:`reverie.models.storm_nets`), or ``"dreamer"``.
        loss_layout: ``"storm"`` (STORM's world-model losses over a window of ``T - 1`` steps,
            :meth:`reverie.models.world_model.WorldModel.storm_loss`; checked against STORM's own update by
            tests/goldens/test_storm_world_model.py) or ``"dreamer"`` (DreamerV3's, every row); None: ``"storm"``
            for a dynamics with STORM's window pass (the transformer, ``agent=storm``'s), else ``"dreamer"``.
        horizon: imagined steps (STORM ``ImagineBatchLength: 16``).
        imag_contexts, imag_context: imagination starts per update and the replayed steps each is observed from
            (``ImagineBatchSize: 1024``, ``ImagineContextLength: 8``); ``imag_contexts=0``: start from the training
            window's posteriors instead (its last ``imag_last`` rows, as ``agent=dreamerv3``).
        act_on: ``"prior"`` (STORM: the action of step ``t`` from ``cat(h_t, z_t ~ p(z_t | h_t))``, before
            ``o_t`` is seen) or ``"posterior"`` (DreamerV3's rule, ``z_t ~ q(z_t | h_t, o_t)``).
        gamma, lam, actor_entropy: STORM's 0.985, 0.95, 3e-4. ac_units, ac_layers: actor and critic MLPs (512, 2).
        ac_lr, ac_eps, ac_clip, slow_decay: the actor-critic's Adam, clip and slow critic (3e-5, 1e-5, 100, 0.98).

    Raises:
        ValueError: continuous actions (use ``agent=dreamerv3 dynamics=storm``); ``act_on`` not ``prior`` or
            ``posterior``, or ``prior`` with a dynamics that has no :meth:`prior` (an RSSM); a negative
            ``imag_contexts`` or an ``imag_context`` below 1; or as :class:`DreamerV3`.
    """

    optimizers = ("model_opt", "ac_opt")

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_spec, *, dynamics=None, units: int = 512,
                 layers: int = 2, mlp_units: int | None = None, mlp_layers: int | None = None, cnn_depth: int = 32,
                 cnn: dict | None = None, horizon: int = 16, imag_last: int = 8, imag_contexts: int = 1024,
                 imag_context: int = 8, act_on: str = "prior", gamma: float = 0.985,
                 lam: float = 0.95, actor_entropy: float = 3e-4, ac_units: int = 512, ac_layers: int = 2,
                 ac_lr: float = 3e-5, ac_eps: float = 1e-5, ac_clip: float = 100.0, slow_decay: float = 0.98,
                 loss_scales: dict[str, float] | None = None, model_lr: float = 1e-4, model_eps: float = 1e-8,
                 model_clip: float = 1000.0, device: str = "cpu", precision: str = "auto", kernels: str = "auto",
                 representation: str = "reconstruction", objectives: dict | None = None,
                 head_inputs: dict[str, str] | None = None, nets: str = "storm",
                 loss_layout: str | None = None):
        if not action_spec.discrete:
            raise ValueError("agent=storm: STORM's policy is a categorical over discrete actions (Atari); for "
                             "continuous actions use agent=dreamerv3 dynamics=storm")
        if act_on not in ("prior", "posterior"):
            raise ValueError(f"agent=storm: agent.module.act_on must be 'prior' (STORM's) or 'posterior', got "
                             f"{act_on!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (imag_contexts, imag_context)) or \
                imag_contexts < 0 or imag_context < 1:
            raise ValueError(f"agent=storm: need agent.module.imag_contexts >= 0 (0: start from the training "
                             f"window's posteriors) and agent.module.imag_context >= 1; got {imag_contexts}, "
                             f"{imag_context}")
        self.act_on, self.imag_contexts, self.imag_context = act_on, int(imag_contexts), int(imag_context)
        if loss_layout is None:  # a partial's class, or the RSSM (None)
            loss_layout = "storm" if hasattr(getattr(dynamics, "func", dynamics), "observe_storm") else "dreamer"
        self._ac_settings = dict(units=ac_units, layers=ac_layers, gamma=gamma, lam=lam, entropy=actor_entropy,
                                 lr=ac_lr, eps=ac_eps, clip=ac_clip, slow_decay=slow_decay)
        super().__init__(obs_shapes, action_spec, dynamics=dynamics, units=units, layers=layers, mlp_units=mlp_units,
                         mlp_layers=mlp_layers, cnn_depth=cnn_depth, cnn=cnn, horizon=horizon, imag_last=imag_last,
                         gamma=gamma, lam=lam, actor_entropy=actor_entropy, loss_scales=loss_scales,
                         model_lr=model_lr, model_eps=model_eps, model_clip=model_clip, ac_clip=ac_clip,
                         device=device, precision=precision, kernels=kernels, representation=representation,
                         objectives=objectives, head_inputs=head_inputs, nets=nets, loss_layout=loss_layout)
        if act_on == "prior" and not isinstance(self.wm.dynamics, HasPrior):
            raise ValueError(f"agent=storm: agent.module.act_on=prior needs a dynamics with a prior(state) method "
                             f"(TransformerDynamics); {type(self.wm.dynamics).__name__} has none: set "
                             f"agent.module.act_on=posterior")

    @property
    def imagine_batch(self) -> tuple[int, int] | None:
        """``(N, C + 1)``: the extra replay sample each update wants under ``batch["imagine"]`` (the loop draws it):
        ``N = imag_contexts`` windows of the ``C = imag_context`` context rows and the row after them, whose
        ``prev_action`` is the action taken after the last context row. None with ``imag_contexts=0``."""
        return (self.imag_contexts, self.imag_context + 1) if self.imag_contexts else None

    def update(self, batch: dict) -> UpdateResult:
        """One update (:meth:`DreamerV3.update`): the world model on ``batch``, then STORM's actor-critic on rollouts
        from the starts of ``batch["imagine"]`` (:meth:`context_starts`; a ``(C + 1, N, ...)`` replay sample), or
        from the window's posteriors when there is none (``imag_contexts=0``, or offline data)."""
        contexts = batch.get("imagine") if self.imag_contexts else None
        with autocast(self.device, self.compute_dtype):
            data = self._inputs(batch)
            metrics, post, skipped = self._model_step(data)
            if contexts is None:  # the window's last imag_last rows (0: every row), as agent=dreamerv3
                start, _ = self._posterior_starts(post, data)
            else:
                start = self.context_starts(self._inputs(contexts))
            behavior, behavior_skipped = self._behavior(start, None)
        return self._result(metrics | behavior, skipped + behavior_skipped)

    @torch.no_grad()
    def context_starts(self, contexts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """STORM's imagination starts (``world_models.py`` ``imagine_data``): observe the first ``C`` rows of each
        ``(C + 1, N, ...)`` context window without dropout or gradient, then one prior step with the action taken
        after row ``C`` (row ``C + 1``'s ``prev_action``): the state ``(N, ...)`` of the step after the context,
        its latent drawn from the prior. ``loss_layout: storm``: the ``C`` tokens ``(z_t, a_t)`` of STORM's
        context (:meth:`~reverie.models.dynamics.TransformerDynamics.observe_storm`, no start token, positions
        ``0 .. C-1``); ``dreamer``: row 0's start token, then ``C`` steps (row 0 counts as ``is_first``)."""
        dynamics, C = self.wm.dynamics, self.imag_context
        embed = self.wm.encode({k: contexts[k][:C] for k in self.obs_keys})  # (C, N, E)
        if self.wm.loss_layout == "storm":
            _, next_ = dynamics.observe_storm(embed, contexts["prev_action"][1:C + 1], contexts["is_first"][1:C + 1])
            return dynamics.truncate(next_)  # the prior after the token (z_{C-1}, a_{C-1})
        post, _ = dynamics.observe(embed, contexts["prev_action"][:C], contexts["is_first"][:C])
        return dynamics.img_step(dynamics.truncate(post), contexts["prev_action"][C])

    def _build_behavior(self, feat: int, units: int, layers: int, unimix: float) -> None:
        self.ac = StormActorCritic(feat, self.spec.dim, **self._ac_settings)

    def _behavior_optimizers(self, actor_lr: float, critic_lr: float, eps: float) -> None:
        self.ac_opt = self.ac.opt  # one Adam over actor and critic, built with them

    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """A one-hot action from the prior's latent (``act_on="prior"``) or the posterior's: sampled, or the most
        probable at ``"eval"`` (STORM ``sample(greedy=True)``)."""
        state = self.wm.dynamics.prior(post) if self.act_on == "prior" else post
        policy = self.ac.policy(self.wm.dynamics.features(state))
        index = policy.probs.argmax(-1) if mode == "eval" else policy.sample()
        return F.one_hot(index, self.spec.dim).float()

    def _behavior(self, start: dict[str, torch.Tensor],
                  start_cont: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], int]:
        """Imagine ``H`` steps from ``start`` ``(N, ...)`` with STORM's policy (no gradient, as STORM's
        ``imagine_data``), read the rewards and terminations (the continue head's mode, STORM's ``logits > 0``)
        the model predicts after each action, and run :meth:`StormActorCritic.update`. ``start_cont`` is unused:
        STORM's losses are not weighted by continuation."""
        dynamics = self.wm.dynamics

        def policy(state: dict[str, torch.Tensor]) -> torch.Tensor:
            feat = dynamics.features(state).to(self.compute_dtype)
            return F.one_hot(self.ac.policy(feat).sample(), self.spec.dim).to(torch.float32)

        with torch.no_grad():
            states, actions = dynamics.imagine(policy, start, self.horizon)  # (H+1, N, ...)
            feat = dynamics.features(states).to(self.compute_dtype)  # (H+1, N, F)
            reward = self.wm.reward(feat[1:]).mean  # (H, N): what the action at step t gave
            termination = 1.0 - self.wm.cont(feat[1:]).mode.to(reward.dtype)  # (H, N)
        metrics, skipped = self.ac.update(feat, actions[:-1].argmax(-1), reward, termination)
        return metrics | {"imagine/reward_mean": reward.mean(), "imagine/termination_mean": termination.mean()}, \
            skipped
