"""PlaNet (Hafner et al. 2019): a Gaussian-latent world model and CEM planning in its latent space.

Defaults follow google-research/planet (``planet/scripts/configs.py`` at c04226b; docs/planet.md has the table of
what still differs): deterministic 200, stochastic 30, hidden 200, ReLU; ``conv_ha`` image networks and 3 x 300
ReLU reward head (:mod:`reverie.models.planet_nets`); free nats 3 (``max(0, KL - 3)``), divergence scale 1, global
prior scale 0, reward scale 10, overshooting off; 5-bit images; Adam 1e-3 with TensorFlow's epsilon 1e-4, global
norm clip 1000; CEM horizon 12 / 1000 candidates / top 100 / 10 iterations, action noise 0.3. The training cycle
(seed episodes, then ``train_steps`` updates per collected episode) is :class:`reverie.replay.cycle.EpisodeCycle`.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from reverie.agents import objectives
from reverie.agents.base import UpdateResult, WorldModelAgent, adam, loss_scale_table
from reverie.agents.dreamer_planning import PLANNERS
from reverie.agents.planning import WorldModelPlanning, make_planner
from reverie.models.dynamics import Dynamics, GaussianRSSM, check_dynamics
from reverie.models.kernels import install
from reverie.models.world_model import WorldModel
from reverie.runtime.precision import autocast
from reverie.types import ActionSpec


class PlaNet(WorldModelAgent):
    """PlaNet agent implementing the :class:`reverie.agents.base.Agent` protocol.

    Args:
        obs_shapes: ``{key: shape}`` of the observations the world model encodes and decodes.
        action_spec: :class:`reverie.types.ActionSpec`.
        dynamics: ``factory(action_dim, embed_dim) -> Dynamics`` (the config's ``agent.module.dynamics`` block: the
            latent sizes, ``min_std``, ``free_nats``, ``overshooting`` and the RSSM's ``act`` live there); None: a
            :class:`reverie.models.dynamics.GaussianRSSM` with the reference's values (200, 30, hidden 200, min std
            0.1, free nats 3, no overshooting) and this agent's ``act``.
        act: activation of the heads (``relu``, reference ``activation``).
        head_units, head_layers: the reward/continue heads and vector encoder/decoder (300, 3: reference
            ``num_units``/``num_layers``). cnn_depth: channel multiplier of the image networks (32).
        planet_dreamer_nets: False (default): PlaNet's networks (``conv_ha`` for 64x64 images, ReLU feed-forward
            heads). True: the DreamerV3 stacks reverie used before (conv stack of ``cnn``, LayerNorm + SiLU MLPs of
            ``units x layers``); with the dynamics' ``act="elu"`` the model is the one of before this option existed.
        units, layers, cnn: width (200) and depth (2) of those MLPs and the conv stack (see
            :class:`reverie.models.conv.ConvEncoder`), with ``planet_dreamer_nets`` only.
        decoder_std: fixed std of the observation and reward likelihoods (1.0). image_bits: 5.
        divergence_scale: scale of KL(posterior || prior) (1.0). global_divergence_scale: scale of
            KL(posterior || N(0, 1)) (0.0). overshooting_scale: scale of the latent overshooting loss (1.0).
            reward_scale: 10.0 (reference default). cont_scale: continue head (1.0; the reference has none). Other
            losses of a dynamics: 1.0.
        planner: ``"auto"``, ``"gaussian"`` or ``"categorical"`` (:func:`reverie.agents.planning.make_planner`).
        horizon, candidates, top_k, iterations: CEM (12, 1000, 100, 10). plan_gamma: discount of planned
            rewards (1.0). plan_sample: sample prior latents while planning (True, as the reference).
            plan_cont: weight planned rewards by the continue head (True; off saves time where nothing terminates).
        action_noise: Gaussian exploration noise at ``explore`` (0.3), clipped into ``[-1, 1]``; for Discrete
            spaces the epsilon of epsilon-greedy exploration.
        model_lr, model_eps, model_clip: Adam (1e-3, 1e-4, 1000); ``model_eps`` is TensorFlow's epsilon (see
            :func:`tf_adam_epsilon`), the clip a global norm.
        device, precision: as :class:`reverie.agents.DreamerV3` (default float32).
        kernels: as :class:`reverie.agents.DreamerV3`; PlaNet's own modules have none (a dynamics' own fast paths
            take the value from the config's ``dynamics`` block).
        actor_lr, critic_lr: not PlaNet settings; accepted only to reject DreamerV3 presets with a clear error.

    Raises:
        ValueError: ``planner="gaussian"`` with a Discrete action space (and the other errors of
            :func:`make_planner`), ``planner`` ``"cem"``/``"mppi"``/``"actor"`` (DreamerV3's choices, named so),
            or DreamerV3-only settings (``actor_lr``/``critic_lr``) from an ``exp``
            preset written for DreamerV3.
        TypeError: a dynamics without the members of :class:`reverie.models.dynamics.Dynamics`.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_spec: ActionSpec, *,
                 dynamics: Callable[..., Dynamics] | None = None, act: str = "relu", head_units: int = 300,
                 head_layers: int = 3, cnn_depth: int = 32, planet_dreamer_nets: bool = False, units: int = 200,
                 layers: int = 2, cnn: dict | None = None, decoder_std: float = 1.0, image_bits: int = 5,
                 divergence_scale: float = 1.0, global_divergence_scale: float = 0.0, overshooting_scale: float = 1.0,
                 reward_scale: float = 10.0, cont_scale: float = 1.0,
                 planner: str = "auto", horizon: int = 12, candidates: int = 1000, top_k: int = 100,
                 iterations: int = 10, plan_gamma: float = 1.0, plan_sample: bool = True, plan_cont: bool = True,
                 action_noise: float = 0.3,
                 model_lr: float = 1e-3, model_eps: float = 1e-4, model_clip: float = 1000.0, device: str = "cpu",
                 precision: str = "float32", kernels: str = "auto"):
        super().__init__()
        self.spec, self.action_noise, self.model_clip = action_spec, action_noise, model_clip
        self.obs_keys = sorted(obs_shapes)
        self.wm = WorldModel(obs_shapes, action_spec.dim, dynamics or partial(GaussianRSSM, act=act), units=units,
                             layers=layers, likelihood="gaussian", decoder_std=decoder_std, image_bits=image_bits,
                             cnn_depth=cnn_depth, cnn=dict(cnn) if cnn else None, kernels=kernels,
                             nets="dreamer" if planet_dreamer_nets else "planet", head_units=head_units,
                             head_layers=head_layers, act=act)
        check_dynamics(self.wm.dynamics)
        if planner in PLANNERS:  # DreamerV3's choice, same key: docs/planning.md's `agent.module.planner=cem`
            raise ValueError(f"PlaNet always plans with CEM; its agent.module.planner picks the CEM's distribution: "
                             f"auto, gaussian or categorical, got {planner!r} ({', '.join(PLANNERS)} are DreamerV3's "
                             f"choices: agent=dreamerv3 agent.module.planner={planner})")
        self.planner = make_planner(action_spec, planner, -1.0, 1.0, horizon=horizon, candidates=candidates,
                                    top_k=top_k, iterations=iterations, gamma=plan_gamma)
        self.plan_model = WorldModelPlanning(self.wm, sample=plan_sample, use_cont=plan_cont)
        # one scale per loss, checked as a set: the decoders 1 (the reference scales none of them); the overshooting
        # scale is read when the dynamics has that term (overshooting D > 0)
        scales = {"rec": 1.0, "reward": reward_scale, "cont": cont_scale, "kl": divergence_scale,
                  "global_kl": global_divergence_scale, "overshooting": overshooting_scale}
        self.loss_scales = loss_scale_table(
            None, self.wm.representation, self.wm.loss_keys, "PlaNet", defaults=scales,
            fix="PlaNet scales the decoders, reward, cont, kl, global_kl and overshooting only (agent.module."
                "reward_scale, cont_scale, divergence_scale, global_divergence_scale, overshooting_scale); give the "
                "dynamics those loss keys")
        install(self, kernels)  # a dynamics' own fast paths (reverie.models.kernels); PlaNet's modules have none
        self._place(device, precision)
        self.model_opt = adam(self.wm.parameters(), lr=model_lr, eps=model_eps)
        self.model_opt.register_step_pre_hook(partial(_tf_adam_epsilon_hook, eps=model_eps))

    # ----------------------------------------------------------------------------------------------- acting
    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """Plan with CEM from the posterior: ``"explore"`` (plan + action noise, clipped into the bounds), ``"eval"``
        (the plan) or ``"sample"`` (the plan; Discrete: a draw from the elite frequencies)."""
        return self.planner.act(self.plan_model, post, mode, self.action_noise).float()

    # ----------------------------------------------------------------------------------------------- learning
    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """One world-model update (PlaNet has no actor or critic).

        Args:
            batch: replay sample with observation keys, ``prev_action (T, B, A)``, ``reward``, ``is_first``,
                ``is_terminal`` ``(T, B)``.

        Returns:
            metrics: ``loss/<key>`` per loss of :attr:`loss_scales`, ``loss/model``, ``kl`` (unclipped),
            entropies, ``prior_std``, ``grad_norm/model``, ``guard/nonfinite`` (1 when the step was skipped).
        """
        data = self._update_inputs(batch)
        with autocast(self.device, self.compute_dtype):
            model_loss, losses, info = self.model_loss(data)
        grad_norm, skipped = self._step(self.model_opt, model_loss, self.wm.parameters(), self.model_clip)
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics |= {"loss/model": model_loss.detach(), "grad_norm/model": grad_norm} | info
        return self._result(metrics, skipped)

    #: the world-model-only update of offline pretraining (the Agent protocol's optional ``update_model``): PlaNet's
    #: whole update (it plans; there is no policy to train)
    update_model = update

    def model_loss(self, data: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
        """The scaled world-model loss on tensors ``(T, B, ...)`` (:meth:`WorldModel.loss`'s batch):
        ``sum_k loss_scales[k] * mean over (T, B) of losses[k]`` (reference ``training/utility.py:233-257``: each
        objective's ``reduce_mean``, times its scale, summed). Returns ``(loss, losses (T, B) each, info)``."""
        losses, _, info = self.wm.loss(data)
        return objectives.weighted_sum(losses, self.loss_scales, "PlaNet"), losses, info


def tf_adam_epsilon(opt: torch.optim.Adam, eps: float) -> None:
    """Set ``opt``'s ``eps`` for its next step so that the step is TensorFlow 1's ``AdamOptimizer(epsilon=eps)``.

    TensorFlow adds ``eps`` to ``sqrt(v)`` (the bias-uncorrected second moment) and folds the bias corrections into
    the learning rate: ``lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``; torch adds it to ``sqrt(v / (1 -
    b2^t))``. The two agree with torch's ``eps = eps / sqrt(1 - b2^t)`` at step ``t`` (3.2e-3 instead of 1e-4 at
    the first step, 1e-4 after a few thousand). PlaNet: ``tf.train.AdamOptimizer(epsilon=1e-4)``
    (google-research/planet ``scripts/configs.py:195``). ``t`` is the step about to be taken (the parameters' step
    count plus 1). :class:`PlaNet` calls it from a step pre-hook, so the guarded step
    (:meth:`reverie.agents.base.WorldModelAgent._step`) stays the one for every optimiser and a skipped step does
    not advance ``t``.
    """
    for group in opt.param_groups:
        steps = [opt.state[p]["step"] for p in group["params"] if "step" in opt.state.get(p, {})]
        t = 1.0 + (float(max(steps)) if steps else 0.0)
        group["eps"] = eps / math.sqrt(1.0 - group["betas"][1] ** t)


def _tf_adam_epsilon_hook(opt: torch.optim.Adam, args: Any, kwargs: Any, eps: float) -> None:
    """Step pre-hook form of :func:`tf_adam_epsilon`."""
    tf_adam_epsilon(opt, eps)
