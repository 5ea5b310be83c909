"""DreamerV3 (Hafner et al. 2023): world model learning + actor-critic learning in imagination. Defaults are the 2023
reference configuration (``danijar/dreamerv3`` at commit 8fa35f8, ``configs.yaml``); size presets set the widths."""

from __future__ import annotations

import copy
from functools import partial
from typing import Callable

import numpy as np
import torch
from torch import nn

from reverie.agents import objectives
from reverie.agents.base import UpdateResult, WorldModelAgent, adam, loss_scale_table
from reverie.agents.dreamer_planning import make_dreamer_planner
from reverie.agents.objectives import Backprop, Reinforce
from reverie.agents.returns import ReturnNormalizer, imagination_weights, lambda_return
from reverie.models.distributions import BoundedNormal, TwoHotSymlog, UnimixCategorical, unimix_sample
from reverie.models.dynamics import CategoricalRSSM, Dynamics, check_dynamics
from reverie.models.kernels import install
from reverie.models.switch import resolve
from reverie.models.networks import MLP
from reverie.models.world_model import WorldModel
from reverie.runtime.collectives import all_gather_cat
from reverie.runtime.compiling import compile_callables
from reverie.runtime.precision import autocast
from reverie.types import ActionSpec

#: reference ``loss_scales`` (8fa35f8 ``configs.yaml:72``); ``barlow``, ``infonce``: R2-Dreamer's
#: ``configs/model/_base_.yaml:22-23``
LOSS_SCALES = {"rec": 1.0, "barlow": 0.05, "infonce": 1.0, "reward": 1.0, "cont": 1.0, "dyn": 0.5, "rep": 0.1}
IMAG_CONT = ("mode", "prob")  # how imagination reads the continue head (DreamerV3 imag_cont)
ACTOR_GRAD_DISC = ("reinforce", "backprop")  # how a discrete actor learns (2023 reference actor_grad_disc)


class Actor(nn.Module):
    """Policy ``pi(a_t | s_t)`` on features ``(..., F)``: :class:`UnimixCategorical` over ``A`` one-hot actions, or
    :class:`BoundedNormal` with ``tanh`` mean and std in ``[min_std, max_std]`` (reference ``actor.minstd/maxstd``).
    ``net``: features to ``A`` or ``2A`` outputs; None builds the 2023 :class:`MLP`."""

    def __init__(self, feat_dim: int, spec: ActionSpec, units: int, layers: int, unimix: float = 0.01,
                 min_std: float = 0.1, max_std: float = 1.0, net: nn.Module | None = None):
        super().__init__()
        self.spec, self.unimix, self.min_std, self.max_std = spec, unimix, min_std, max_std
        self.net = net if net is not None else MLP(feat_dim, spec.dim if spec.discrete else 2 * spec.dim,
                                                   units=units, layers=layers)

    def forward(self, feat: torch.Tensor) -> torch.distributions.Distribution:
        return self.dist(self.net(feat))

    def dist(self, out: torch.Tensor) -> torch.distributions.Distribution:
        """The policy distribution from the network's output ``(..., A)`` (discrete) or ``(..., 2A)``."""
        if self.spec.discrete:
            return UnimixCategorical(out, self.unimix)
        mean, std = out.chunk(2, -1)
        return BoundedNormal(mean, std, self.min_std, self.max_std)

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """A sample ``(..., A)`` of ``dist(out)`` without building the distribution (imagination's hot path; discrete:
        :func:`reverie.models.distributions.unimix_sample`, the same law)."""
        if self.spec.discrete:
            return unimix_sample(out.detach(), self.unimix)
        return self.dist(out).sample()


class DreamerV3(WorldModelAgent):
    """DreamerV3 agent implementing the :class:`reverie.agents.base.Agent` protocol; defaults are the reference's.

    Args:
        dynamics: ``factory(action_dim, embed_dim) -> Dynamics`` (``agent.module.dynamics``); None: a
            :class:`CategoricalRSSM` with the reference's sizes (deter 512, 32 x 32 latents, units 512).
        units, layers: the heads, actor and critic; mlp_units, mlp_layers: the vector encoder and decoder (None:
            ``units``/``layers``); cnn_depth, cnn: the conv stacks (:class:`reverie.models.conv.ConvEncoder`).
        imag_last: imagine from the last ``K`` rows only (0: all). imag_cont: ``"mode"`` (2023 ``agent.py:194``) or
            ``"prob"`` (2025 ``agent.py:206``). actor_grad_disc: ``"reinforce"`` or ``"backprop"`` (2023
            ``configs.yaml:84``; continuous actions always use backprop).
        loss_scales: over :data:`LOSS_SCALES`; with ``rec`` spread over the decoded keys, the keys must be the world
            model's losses. representation, objectives: ``"reconstruction"``, ``"r2"`` or ``"infonce"`` and their
            settings (docs/representation.md). head_inputs: what the decoder, reward and continue heads read
            (:class:`reverie.models.world_model.WorldModel`; default ``cat(h, z)``). nets: the world model's
            networks, ``"dreamer"`` or ``"storm"`` (:func:`reverie.models.world_model.storm_nets`). loss_layout:
            ``"dreamer"`` (every row's losses) or ``"storm"`` (STORM's window, a transformer dynamics;
            :meth:`reverie.models.world_model.WorldModel.storm_loss`).
        precision: ``"auto"`` (bfloat16 where native), ``"float32"``, ``"bfloat16"`` or ``"float64"``
            (:mod:`reverie.runtime.precision`). compile: ``torch.compile`` the hot callables (turns the kernels off).
            kernels: ``"auto"`` or ``"off"`` (:mod:`reverie.models.kernels`; the same losses up to rounding).
        planner, plan: ``"actor"``, or ``"cem"``/``"mppi"`` and its settings (:mod:`reverie.agents.dreamer_planning`).

    Raises:
        ValueError: loss keys and scales that differ; an unknown ``imag_cont``, ``actor_grad_disc``,
            ``representation``, objective setting, ``kernels``, ``planner`` or ``plan`` setting.
        TypeError: a dynamics without the members of :class:`reverie.models.dynamics.Dynamics`."""

    optimizers = ("model_opt", "actor_opt", "critic_opt")  # saved with the module state (WorldModelAgent)

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_spec: ActionSpec, *,
                 dynamics: Callable[..., Dynamics] | None = None, units: int = 512, layers: int = 2,
                 mlp_units: int | None = 1024, mlp_layers: int | None = 5, cnn_depth: int = 32,
                 cnn: dict | None = None, horizon: int = 15, imag_last: int = 0, imag_cont: str = "mode",
                 gamma: float = 1.0 - 1.0 / 333.0, lam: float = 0.95, unimix: float = 0.01,
                 loss_scales: dict[str, float] | None = None, actor_entropy: float = 3e-4,
                 slow_critic_fraction: float = 0.02, slow_reg: float = 1.0, model_lr: float = 1e-4,
                 model_eps: float = 1e-8, model_clip: float = 1000.0, actor_lr: float = 3e-5, critic_lr: float = 3e-5,
                 ac_eps: float = 1e-5, ac_clip: float = 100.0, device: str = "cpu", precision: str = "auto",
                 compile: bool = False, kernels: str = "auto", planner: str = "actor", plan: dict | None = None,
                 representation: str = "reconstruction", objectives: dict | None = None,
                 actor_grad_disc: str = "reinforce", head_inputs: dict[str, str] | None = None,
                 nets: str = "dreamer", loss_layout: str = "dreamer"):
        super().__init__()
        if imag_last < 0:
            raise ValueError(f"DreamerV3: imag_last must be >= 0 (0: imagine from every replayed row), got {imag_last}")
        self.spec, self.horizon, self.gamma, self.lam = action_spec, horizon, gamma, lam
        self.imag_last = int(imag_last)
        if imag_cont not in IMAG_CONT:
            raise ValueError(f"DreamerV3: imag_cont must be one of {IMAG_CONT} (mode: the 2023 reference's 0/1 flag; "
                             f"prob: the continue probability, as the current official code), got {imag_cont!r}")
        self.imag_cont = imag_cont
        if actor_grad_disc not in ACTOR_GRAD_DISC:
            raise ValueError(f"DreamerV3: actor_grad_disc must be one of {ACTOR_GRAD_DISC} (reinforce: the 2023 "
                             f"reference's default; backprop: the return's gradient through the imagined dynamics "
                             f"with straight-through one-hot actions), got {actor_grad_disc!r}")
        self.actor_grad_disc = actor_grad_disc
        self.estimator = "reinforce" if action_spec.discrete and actor_grad_disc == "reinforce" else "backprop"
        self.planner = make_dreamer_planner(action_spec, planner, plan)  # None: the actor acts
        self.actor_entropy, self.slow_fraction, self.slow_reg = actor_entropy, slow_critic_fraction, slow_reg
        self.model_clip, self.ac_clip = model_clip, ac_clip
        self.obs_keys = sorted(obs_shapes)
        kernels = "auto" if resolve(kernels) and not compile else "off"  # compile traces the readable modules
        self.wm = WorldModel(obs_shapes, action_spec.dim, dynamics or partial(CategoricalRSSM, kernels=kernels),
                             units=units, layers=layers, mlp_units=mlp_units, mlp_layers=mlp_layers,
                             cnn_depth=cnn_depth, cnn=dict(cnn) if cnn else None, kernels=kernels,
                             representation=representation, objectives=objectives,
                             head_inputs=head_inputs, nets=nets, loss_layout=loss_layout)
        check_dynamics(self.wm.dynamics)
        self._build_behavior(self.wm.dynamics.feat_dim, units, layers, unimix)
        self.loss_scales = loss_scale_table(loss_scales, self.wm.representation, self.wm.loss_keys, "DreamerV3",
                                            defaults=LOSS_SCALES)
        # into every module built above, the dynamics too (one built with its own kernels="off" stays readable)
        install(self, kernels)
        self._place(device, precision)
        self.model_opt = adam(self.wm.parameters(), lr=model_lr, eps=model_eps)
        self._behavior_optimizers(actor_lr, critic_lr, ac_eps)
        self.compiled = bool(compile) and self._compile()

    def _build_behavior(self, feat: int, units: int, layers: int, unimix: float) -> None:
        """Actor, critic, slow critic and return normaliser on features of width ``feat``."""
        self.actor = Actor(feat, self.spec, units, layers, unimix)
        self.critic = MLP(feat, 255, units=units, layers=layers, out_scale=0.0, float32_out=True)  # two-hot logits
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.retnorm = ReturnNormalizer()

    def _behavior_optimizers(self, actor_lr: float, critic_lr: float, eps: float) -> None:
        self.actor_opt = adam(self.actor.parameters(), lr=actor_lr, eps=eps)
        self.critic_opt = adam(self.critic.parameters(), lr=critic_lr, eps=eps)

    def _compile(self) -> bool:
        """Compile the dynamics' cell, prior net and every MLP forward in place; False where torch.compile can't run."""
        wm, dynamics = self.wm, self.wm.dynamics
        modules = {"actor": self.actor.net, "critic": self.critic, "slow critic": self.slow_critic,
                   "reward head": wm.reward_head, "continue head": wm.cont_head,
                   "prior net": getattr(dynamics, "prior_net", None), "vector encoder": wm.encoder,
                   "vector decoder": wm.decoder, "image encoder": wm.image_encoder, "image decoder": wm.image_decoder}
        targets = {name: (m, "forward") for name, m in modules.items() if m is not None}
        if hasattr(dynamics, "_cell"):
            targets["dynamics cell"] = (dynamics, "_cell")
        return compile_callables(targets, self.device.type)

    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """Sample the actor (``"explore"``/``"sample"``) or take its mode (``"eval"``), clipped to ``[-1, 1]`` for Box;
        with a planner, its plan."""
        if self.planner is not None:
            return self.planner.act(self, post, mode)
        dist = self.actor(self.wm.dynamics.features(post))
        action = dist.mode if mode == "eval" else dist.sample()
        return action if self.spec.discrete else action.clamp(-1.0, 1.0)

    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """One DreamerV3 update on a replay batch ``(T, B, ...)`` (observation keys, ``prev_action``, ``reward``,
        ``is_first``, ``is_terminal``): world model, then actor and critic on imagined trajectories. Returns the metrics
        and ``skipped`` (of 3 steps)."""
        with autocast(self.device, self.compute_dtype):
            metrics, skipped = self._update(self._inputs(batch))
        return self._result(metrics, skipped)

    def update_model(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """The world-model step of :meth:`update` alone (``reverie pretrain``); actor, critic, slow critic and return
        normaliser are left as they are."""
        with autocast(self.device, self.compute_dtype):
            metrics, _, skipped = self._model_step(self._inputs(batch))
        return self._result(metrics, skipped)

    def _inputs(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        data = self._update_inputs(batch)
        # row 0 counts as is_first (2023 reference: embodied/replay/generic.py `_sample` sets seq['is_first'][0])
        data["is_first"] = torch.cat([torch.ones_like(data["is_first"][:1]), data["is_first"][1:]])
        return data

    def _model_step(self, data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                                                                   int]:
        """World model (eq. 4-5): losses, one guarded optimiser step; returns ``(metrics, posterior, skipped)``."""
        losses, post, _, info = self.wm.loss(data)
        model_loss = objectives.weighted_sum(losses, self.loss_scales, "DreamerV3")
        grad_norm, skipped = self._step(self.model_opt, model_loss, self.wm.parameters(), self.model_clip)
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics |= {"loss/model": model_loss.detach(), "grad_norm/model": grad_norm} | info
        return metrics, post, skipped

    def _update(self, data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        metrics, post, skipped = self._model_step(data)
        behavior, behavior_skipped = self._behavior(*self._posterior_starts(post, data))
        return metrics | behavior, skipped + behavior_skipped

    def _posterior_starts(self, post: dict[str, torch.Tensor],
                          data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(start (K*B, ...), start_cont (K*B,))``: the detached posteriors of the window's last ``K = imag_last``
        rows (0: all ``T``), time-major, and their continue flags ``1 - is_terminal``."""
        last = min(self.imag_last, data["is_first"].shape[0])
        start = {k: v.detach() for k, v in self.wm.dynamics.starts(post, last).items()}
        rows = slice(-last, None) if last else slice(None)
        start_cont = 1.0 - data["is_terminal"][rows].flatten(0, 1).to(data["reward"].dtype)  # (K, B) -> (K*B,)
        return start, start_cont

    def _estimator(self) -> Reinforce | Backprop:
        if self.estimator == "reinforce":
            return Reinforce(self.actor)
        return Backprop(self.actor)

    def _rollout(self, start: dict[str, torch.Tensor],
                 estimator: Reinforce | Backprop) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(states (H+1, N, ...), actions (H+1, N, A))``: ``dynamics.imagine`` for ``H = horizon`` steps from
        ``start`` ``(N, ...)``, each action drawn by ``estimator`` from the features in ``compute_dtype``; under the
        caller's grad mode and autocast (section 4; 2023 ``agent.py`` ``ImagActorCritic`` ``imagine``)."""
        dynamics = self.wm.dynamics
        return dynamics.imagine(lambda s: estimator.act(dynamics.features(s).to(self.compute_dtype)), start,
                                self.horizon)

    def _behavior(self, start: dict[str, torch.Tensor],
                  start_cont: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
        """Actor and critic steps on an imagined rollout of horizon ``H`` from ``start`` ``(N, ...)`` (section 4;
        2023 ``agent.py`` ``ImagActorCritic``; :mod:`reverie.agents.objectives`); returns ``(metrics, skipped)``."""
        dynamics, estimator = self.wm.dynamics, self._estimator()
        with torch.set_grad_enabled(estimator.grad):  # REINFORCE: no gradient; backprop: through the rollout
            states, actions = self._rollout(start, estimator)  # (H+1, N, ...)
            feat = dynamics.features(states).to(self.compute_dtype)  # (H+1, N, F)
            del states  # read only for feat: not held through the heads and the two backward passes
            reward = torch.cat([torch.zeros_like(start_cont)[None], self.wm.reward(feat[1:]).mean])  # (H+1, N)
            cont_dist = self.wm.cont(feat[1:])  # Bernoulli over (H, N)
            cont_step = cont_dist.mode if self.imag_cont == "mode" else cont_dist.mean  # 0/1 or the probability
            cont = torch.cat([start_cont[None], cont_step.to(start_cont.dtype)])  # start's own flag is known
        critic_out = self.critic(feat.detach())  # (H+1, N, 255): the critic loss's pass (gradient into the critic)
        value = estimator.value(self.critic, feat, critic_out)  # (H+1, N)
        ret = lambda_return(reward, value, cont, self.gamma, self.lam)  # (H, N)
        weight = imagination_weights(cont.detach(), self.gamma)[:-1]  # (H, N)

        all_ret = all_gather_cat(ret.detach().flatten())  # data parallel: every rank's returns, one global scale
        finite_ret = bool(torch.isfinite(all_ret).all())  # a non-finite return must not poison the normaliser's EMAs
        stats = self.retnorm.next(all_ret) if finite_ret else (self.retnorm.low, self.retnorm.high)
        scale = self.retnorm.scale(stats)  # stored below only if the actor's step is taken
        adv = objectives.advantage(ret, value[:-1], scale)  # (H, N); backprop: the baseline keeps its gradient
        actor_loss, entropy = estimator.loss(feat, actions, adv, weight, self.actor_entropy)
        actor_loss = actor_loss.mean()
        actor_norm, skipped = self._step(self.actor_opt, actor_loss, self.actor.parameters(), self.ac_clip,
                                         ok=finite_ret)
        estimator.close()
        if not skipped:  # a skipped step changes nothing (the Agent protocol's guard), the normaliser included
            self.retnorm.commit(stats)

        with torch.no_grad():
            slow_target = TwoHotSymlog(self.slow_critic(feat[:-1].detach())).mean
        critic_dist = TwoHotSymlog(critic_out[:-1])
        critic_loss = objectives.critic_loss(critic_dist, ret, slow_target, weight, self.slow_reg).mean()
        critic_norm, critic_skipped = self._step(self.critic_opt, critic_loss, self.critic.parameters(), self.ac_clip)
        if not critic_skipped:  # the slow critic follows a critic step that was taken, as the 2025 agent's value
            # the first step taken copies the critic (2023 jaxutils.SlowUpdater: mix 1 at its first call)
            steps = int(self.critic_opt.state[next(iter(self.critic.parameters()))]["step"])
            self._follow(self.slow_critic, self.critic, 1.0 if steps == 1 else self.slow_fraction)
        return {
            "loss/actor": actor_loss.detach(), "loss/critic": critic_loss.detach(),
            "grad_norm/actor": actor_norm, "grad_norm/critic": critic_norm,
            "actor/entropy": entropy.detach().mean(), "return/mean": ret.detach().mean(),
            "return/scale": scale.detach(), "advantage/mean": adv.detach().mean(), "advantage/std": adv.detach().std(),
            "value/mean": value.detach().mean(), "value/std": value.detach().std(),
            "return/low": self.retnorm.low.detach().clone(), "return/high": self.retnorm.high.detach().clone(),
            "imagine/reward_mean": reward.detach().mean(),
        }, skipped + critic_skipped
