"""DreamerV3 (Hafner et al. 2023): world model learning + actor-critic learning in imagination.

Defaults are the 2023 reference configuration (``danijar/dreamerv3`` at commit 8fa35f8, ``configs.yaml``);
size presets set the widths.
"""

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

#: reference ``loss_scales`` (8fa35f8 ``configs.yaml:72``: image/vector 1, reward 1, cont 1, dyn 0.5, rep 0.1; ``rec``
#: scales every decoded key), with the decoder-free objectives' (R2-Dreamer ``configs/model/_base_.yaml:22-23``:
#: barlow 0.05, infonce 1.0); the table is checked against the world model's losses as a set (``loss_scale_table``)
LOSS_SCALES = {"rec": 1.0, "barlow": 0.05, "infonce": 1.0, "reward": 1.0, "cont": 1.0, "dyn": 0.5, "rep": 0.1}
IMAG_CONT = ("mode", "prob")  # how imagination reads the continue head (DreamerV3 imag_cont)
ACTOR_GRAD_DISC = ("reinforce", "backprop")  # how a discrete actor learns (2023 reference actor_grad_disc)


class Actor(nn.Module):
    """Policy ``pi(a_t | s_t)`` on features ``(..., F)``.

    Discrete: :class:`UnimixCategorical` over ``A`` one-hot actions (unimix 1%). Continuous:
    :class:`BoundedNormal` with ``tanh`` mean and std in ``[0.1, 1.0]`` (reference ``actor.minstd/maxstd``).
    ``net``: the network from features to ``A`` (discrete) or ``2A`` outputs; None builds the 2023 :class:`MLP`.
    """

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

    def sample(self, out: torch.Tensor, fast: bool = False) -> torch.Tensor:
        """A sample ``(..., A)`` of :meth:`dist` ``(out)`` without building the distribution object (the
        imagination rollout's hot path, one call per step). Discrete: a one-hot draw of the unimix categorical
        (:func:`reverie.models.distributions.unimix_sample`, the same law as ``dist(out).sample()``; ``fast``: its
        sampling kernel); continuous: ``dist(out).sample()``."""
        if self.spec.discrete:
            return unimix_sample(out.detach(), self.unimix, fast=fast)
        return self.dist(out).sample()


class DreamerV3(WorldModelAgent):
    """DreamerV3 agent implementing the :class:`reverie.agents.base.Agent` protocol.

    Args:
        obs_shapes: ``{key: shape}`` of the observations the world model encodes and decodes.
        action_spec: :class:`reverie.types.ActionSpec`.
        dynamics: ``factory(action_dim, embed_dim) -> Dynamics`` (the config's ``agent.module.dynamics`` block;
            e.g. ``functools.partial(CategoricalRSSM, deter=256, stoch=32, classes=32, units=256)``); None: a
            :class:`CategoricalRSSM` with the reference's sizes (deter 512, 32 x 32 latents, units 512).
        units, layers: width and depth of the MLPs of the heads, actor and critic (size presets).
        mlp_units, mlp_layers: width and depth of the vector encoder and decoder (reference 1024 x 5 at every size,
            ``configs.yaml`` ``encoder.mlp_units``); None: ``units`` / ``layers``.
        cnn_depth: channel multiplier of the image encoder/decoder (size preset ``cnn_depth``; s=32).
        cnn: further conv-stack arguments (``channels``, ``kernel``, ``stride``, ``padding``, ``min_res``,
            ``norm``, ``act``; see :class:`reverie.models.conv.ConvEncoder`); None for the reference stack.
        horizon: imagination horizon ``H`` (15). gamma: ``1 - 1/333``. lam: 0.95. unimix: the actor's uniform
            mix (0.01).
        imag_last: imagine from the posterior states of the last ``K`` rows of each replayed sequence only
            (``N = K*B`` starts); 0 (the 2023 reference) starts from every row (2025 ``imag_last``).
        imag_cont: how imagination reads the continue head: ``"mode"`` (2023 ``agent.py:194``, 1 or 0) or
            ``"prob"`` (its probability, 2025 ``agent.py:206``; docs/dreamerv3.md, 'CartPole under exp=classic').
        actor_grad_disc: a discrete actor's gradient estimator (2023 ``configs.yaml:84``): ``"reinforce"`` (the
            default) or ``"backprop"`` (straight-through one-hot samples, the return's gradient through the
            imagined dynamics); continuous actions always use backprop (:mod:`reverie.agents.objectives`).
        loss_scales: world-model loss scales by key, over :data:`LOSS_SCALES` (reference: rec 1 for every decoded
            key, reward 1, cont 1, dyn 0.5, rep 0.1; barlow 0.05, infonce 1.0 for the decoder-free objectives);
            after ``rec`` is spread over the decoded keys (an observation key's own entry wins) and the other
            objectives' entries are dropped, the keys must be the world model's losses, as a set.
        representation: the world model's representation objective (:mod:`reverie.models.representation`):
            ``"reconstruction"`` (the reference's decoders), ``"r2"`` (R2-Dreamer's Barlow Twins objective, no
            decoder) or ``"infonce"`` (contrastive, no decoder). objectives: their settings
            (``{"r2": {"lambd": 5e-4}}``; docs/representation.md).
        actor_entropy: entropy scale (3e-4). slow_critic_fraction: EMA step of the slow critic (0.02).
        slow_reg: scale of the critic regulariser towards the slow critic (1.0).
        model_lr/model_eps/model_clip: world-model Adam (1e-4, 1e-8, 1000).
        actor_lr, critic_lr / ac_eps / ac_clip: actor and critic Adam (3e-5, 1e-5, 100).
        device: torch device for parameters and updates.
        precision: ``"auto"`` (bfloat16 where the hardware runs it natively), ``"float32"`` or ``"bfloat16"``;
            parameters and distributions stay float32 (see :mod:`reverie.runtime.precision`). ``"float64"``:
            everything in float64 (exactness tests).
        compile: ``torch.compile`` the dynamics' cell and the MLP heads (:mod:`reverie.runtime.compiling`; turns
            the kernels off; a ``RuntimeWarning`` and eager execution where it cannot run). Off by default.
        kernels: ``"auto"`` (the hand-written fast paths of :mod:`reverie.models.kernels` where they apply: the
            two-hot losses, the policy's draw and the default dynamics' own) or ``"off"`` (plain autograd over the
            readable modules); the same losses up to float rounding.
        planner: how the agent acts: ``"actor"`` (the reference) or ``"cem"``/``"mppi"``, planning over the world
            model with the critic as value bootstrap (:mod:`reverie.agents.dreamer_planning`; a reverie addition).
        plan: the planner's settings (:data:`reverie.agents.dreamer_planning.PLAN_DEFAULTS`); unused with the actor.

    Raises:
        ValueError: a world-model loss without a scale or a ``loss_scales`` key that is no loss; an unknown
            ``imag_cont``, ``actor_grad_disc``, ``representation``, objective setting, ``kernels``, ``planner`` or
            ``plan`` setting.
        TypeError: a dynamics without the members of :class:`reverie.models.dynamics.Dynamics`.
    """

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
                 actor_grad_disc: str = "reinforce"):
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
        # the actor's gradient estimator, chosen once (reverie.agents.objectives): REINFORCE for discrete actions
        # by default, backprop for continuous ones always and for discrete ones with actor_grad_disc=backprop
        self.estimator = "reinforce" if action_spec.discrete and actor_grad_disc == "reinforce" else "backprop"
        self.planner = make_dreamer_planner(action_spec, planner, plan)  # None: the actor acts
        self.actor_entropy, self.slow_fraction, self.slow_reg = actor_entropy, slow_critic_fraction, slow_reg
        self.model_clip, self.ac_clip = model_clip, ac_clip
        self.obs_keys = sorted(obs_shapes)
        kernels = "auto" if resolve(kernels) and not compile else "off"  # compile traces the readable modules
        self.fast = False  # install (below): the kernels in this agent's own losses and draws
        self.wm = WorldModel(obs_shapes, action_spec.dim, dynamics or partial(CategoricalRSSM, kernels=kernels),
                             units=units, layers=layers, mlp_units=mlp_units, mlp_layers=mlp_layers,
                             cnn_depth=cnn_depth, cnn=dict(cnn) if cnn else None, kernels=kernels,
                             representation=representation, objectives=objectives)
        check_dynamics(self.wm.dynamics)
        self._build_behavior(self.wm.dynamics.feat_dim, units, layers, unimix)
        # the world model's one loss: one scale per loss key, checked as a set (loss_scale_table)
        self.loss_scales = loss_scale_table(loss_scales, self.wm.representation, self.wm.loss_keys, "DreamerV3",
                                            defaults=LOSS_SCALES)
        # the kernels, into every module built above (the dynamics too, whatever its factory set; one built with its
        # own kernels="off" stays readable): the agent's setting reaches them all
        install(self, kernels)
        self._place(device, precision)
        self.model_opt = adam(self.wm.parameters(), lr=model_lr, eps=model_eps)
        self._behavior_optimizers(actor_lr, critic_lr, ac_eps)
        self.compiled = bool(compile) and self._compile()

    def _build_behavior(self, feat: int, units: int, layers: int, unimix: float) -> None:
        """The actor, critic, slow critic and return normaliser on features of width ``feat`` (before the kernels
        are installed and the modules placed)."""
        self.actor = Actor(feat, self.spec, units, layers, unimix)
        self.critic = MLP(feat, 255, units=units, layers=layers, out_scale=0.0)
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.retnorm = ReturnNormalizer()

    def _behavior_optimizers(self, actor_lr: float, critic_lr: float, eps: float) -> None:
        """The actor's and the critic's Adam (after the modules are placed)."""
        self.actor_opt = adam(self.actor.parameters(), lr=actor_lr, eps=eps)
        self.critic_opt = adam(self.critic.parameters(), lr=critic_lr, eps=eps)

    def _compile(self) -> bool:
        """Compile the hot callables in place (``compile=True``); False where torch.compile cannot run here.

        The dynamics' cell (``_cell`` where it has one: input layer + GRU, run once per step of the observe scan
        and of imagination), its prior net and every MLP forward; the per-step Python loops stay eager, so shapes
        stay fixed per call site (B for the scan, T*B for imagination, N envs for acting), each compiled once.
        """
        wm, dynamics = self.wm, self.wm.dynamics
        modules = {"actor": self.actor.net, "critic": self.critic, "slow critic": self.slow_critic,
                   "reward head": wm.reward_head, "continue head": wm.cont_head,
                   "prior net": getattr(dynamics, "prior_net", None), "vector encoder": wm.encoder,
                   "vector decoder": wm.decoder, "image encoder": wm.image_encoder, "image decoder": wm.image_decoder}
        targets = {name: (m, "forward") for name, m in modules.items() if m is not None}
        if hasattr(dynamics, "_cell"):
            targets["dynamics cell"] = (dynamics, "_cell")
        return compile_callables(targets, self.device.type)

    # ----------------------------------------------------------------------------------------------- acting
    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """``"explore"``/``"sample"`` sample the actor, ``"eval"`` takes its mode (clipped to ``[-1, 1]`` for Box).
        With a planner: its plan (``"explore"``: plus its noise; ``"sample"``: Discrete draws from the elite
        frequencies)."""
        if self.planner is not None:
            return self.planner.act(self, post, mode)
        dist = self.actor(self.wm.dynamics.features(post))
        action = dist.mode if mode == "eval" else dist.sample()
        return action if self.spec.discrete else action.clamp(-1.0, 1.0)

    # ----------------------------------------------------------------------------------------------- learning
    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """One DreamerV3 update: world model, then actor and critic on imagined trajectories.

        Args:
            batch: replay sample with observation keys, ``prev_action (T, B, A)``, ``reward``, ``is_first``,
                ``is_terminal`` ``(T, B)``.

        Returns:
            metrics: world-model losses (``loss/<key>``), ``kl``, entropies, actor/critic losses, return and
            advantage statistics, gradient norms; ``skipped``: optimiser steps skipped (of 3).
        """
        with autocast(self.device, self.compute_dtype):
            metrics, skipped = self._update(self._inputs(batch))
        return self._result(metrics, skipped)

    def update_model(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """The world-model step of :meth:`update` alone (offline pretraining, ``reverie pretrain``): the same loss,
        optimiser step and guard; actor, critic, slow critic and return normaliser are left as they are.

        Returns:
            the world-model metrics of :meth:`update`; ``skipped``: 1 when the step was skipped.
        """
        with autocast(self.device, self.compute_dtype):
            metrics, _, skipped = self._model_step(self._inputs(batch))
        return self._result(metrics, skipped)

    def _inputs(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        data = self._update_inputs(batch)
        # every replay window starts from the initial state with a zero previous action: row 0 counts as is_first
        # (2023 reference: embodied/replay/generic.py `_sample` sets seq['is_first'][0] = True)
        data["is_first"] = torch.cat([torch.ones_like(data["is_first"][:1]), data["is_first"][1:]])
        return data

    def _model_step(self, data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                                                                   int]:
        """World model (eq. 4-5): losses, one guarded optimiser step; returns ``(metrics, posterior, skipped)``."""
        losses, post, info = self.wm.loss(data)
        model_loss = objectives.weighted_sum(losses, self.loss_scales, "DreamerV3")
        grad_norm, skipped = self._step(self.model_opt, model_loss, self.wm.parameters(), self.model_clip)
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics |= {"loss/model": model_loss.detach(), "grad_norm/model": grad_norm} | info
        return metrics, post, skipped

    def _update(self, data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        metrics, post, skipped = self._model_step(data)
        # --- imagination from every posterior state (section 4), or from the last imag_last rows ---
        last = min(self.imag_last, data["is_first"].shape[0])  # K rows (0: all T)
        start = {k: v.detach() for k, v in self.wm.dynamics.starts(post, last).items()}  # (K*B, ...), time-major
        rows = slice(-last, None) if last else slice(None)
        start_cont = 1.0 - data["is_terminal"][rows].flatten(0, 1).to(data["reward"].dtype)  # (K, B) -> (K*B,)
        behavior, behavior_skipped = self._behavior(start, start_cont)
        return metrics | behavior, skipped + behavior_skipped

    def _estimator(self) -> Reinforce | Backprop:
        """This update's actor gradient estimator, of the kind chosen at construction (:attr:`estimator`)."""
        if self.estimator == "reinforce":
            return Reinforce(self.actor, fast=self.fast)
        return Backprop(self.actor)

    def _behavior(self, start: dict[str, torch.Tensor],
                  start_cont: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
        """Actor and critic steps on an imagined rollout of horizon ``H`` from ``start`` ``(N, ...)``
        (2023 ``agent.py`` ``ImagActorCritic``; :mod:`reverie.agents.objectives`); returns ``(metrics, skipped)``."""
        dynamics, estimator = self.wm.dynamics, self._estimator()
        with torch.set_grad_enabled(estimator.grad):  # REINFORCE: no gradient; backprop: through the rollout
            states, actions = dynamics.imagine(lambda s: estimator.act(dynamics.features(s).to(self.compute_dtype)),
                                               start, self.horizon)  # (H+1, N, ...)
            feat = dynamics.features(states).to(self.compute_dtype)  # (H+1, N, F)
            reward = torch.cat([torch.zeros_like(start_cont)[None], self.wm.reward(feat[1:]).mean])  # (H+1, N)
            cont_dist = self.wm.cont(feat[1:])  # Bernoulli over (H, N)
            cont_step = cont_dist.mode if self.imag_cont == "mode" else cont_dist.mean  # 0/1 or the probability
            cont = torch.cat([start_cont[None], cont_step.to(start_cont.dtype)])  # start's own flag is known
        critic_out = self.critic(feat.detach())  # (H+1, N, 255): the critic loss's pass (gradient into the critic)
        value = estimator.value(self.critic, feat, critic_out)  # (H+1, N)
        ret = lambda_return(reward, value, cont, self.gamma, self.lam)  # (H, N)
        weight = imagination_weights(cont.detach(), self.gamma)[:-1]  # (H, N)

        # --- actor ---
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

        # --- critic ---
        with torch.no_grad():
            slow_target = TwoHotSymlog(self.slow_critic(feat[:-1].detach())).mean
        critic_dist = TwoHotSymlog(critic_out[:-1], fast=self.fast)
        critic_loss = objectives.critic_loss(critic_dist, ret, slow_target, weight, self.slow_reg).mean()
        critic_norm, critic_skipped = self._step(self.critic_opt, critic_loss, self.critic.parameters(), self.ac_clip)
        if not critic_skipped:  # the slow critic follows a critic step that was taken, as the 2025 agent's value
            # the first step taken copies the critic (2023 jaxutils.SlowUpdater: mix 1 at its first call), every
            # later one moves by slow_fraction; the count is the critic optimiser's, so it resumes with it
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
