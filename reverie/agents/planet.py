"""PlaNet (Hafner et al. 2019): a Gaussian-latent world model and CEM planning in its latent space.

Defaults follow google-research/planet (``planet/scripts/configs.py``): deterministic 200, stochastic 30, hidden 200,
free nats 3, divergence scale 1, global prior scale 0, overshooting off, 5-bit images, Adam 1e-3 (eps 1e-4,
clip 1000), CEM horizon 12 / 1000 candidates / top 100 / 10 iterations, action noise 0.3. The training cycle
(seed episodes, then ``train_steps`` updates per collected episode) is :class:`reverie.replay.cycle.EpisodeCycle`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from reverie.agents.base import WorldModelAgent, adam
from reverie.agents.planning import WorldModelPlanning, make_planner
from reverie.models.dynamics import Dynamics, GaussianRSSM
from reverie.models.world_model import WorldModel
from reverie.runtime.precision import autocast
from reverie.types import ActionSpec


class PlaNet(WorldModelAgent):
    """PlaNet agent implementing the :class:`reverie.agents.base.Agent` protocol.

    Args:
        obs_shapes: ``{key: shape}`` of the observations the world model encodes and decodes.
        action_spec: :class:`reverie.types.ActionSpec`.
        dynamics: ``factory(action_dim, embed_dim) -> Dynamics`` (the config's ``agent.module.dynamics`` block: the
            latent sizes, ``min_std``, ``free_nats`` and ``overshooting`` live there); None: a
            :class:`reverie.models.dynamics.GaussianRSSM` with the reference's values (200, 30, hidden 200, min std
            0.1, free nats 3, no overshooting).
        units: hidden width of the vector encoder/decoder and the reward/continue heads (200). layers: their
            depth (2).
        cnn_depth, cnn: image encoder/decoder (see :class:`reverie.models.conv.ConvEncoder`; depth 32).
        decoder_std: fixed std of the observation and reward likelihoods (1.0). image_bits: 5.
        divergence_scale: scale of KL(posterior || prior) (1.0). global_divergence_scale: scale of
            KL(posterior || N(0, 1)) (0.0). overshooting_scale: scale of the latent overshooting loss (1.0).
            reward_scale: 1.0. cont_scale: continue head (1.0). Other losses of a dynamics: 1.0.
        planner: ``"auto"``, ``"gaussian"`` or ``"categorical"`` (:func:`reverie.agents.planning.make_planner`).
        horizon, candidates, top_k, iterations: CEM (12, 1000, 100, 10). plan_gamma: discount of planned
            rewards (1.0). plan_sample: sample prior latents while planning (True, as the reference).
            plan_cont: weight planned rewards by the continue head (True; off saves time where nothing terminates).
        action_noise: Gaussian exploration noise at ``explore`` (0.3), clipped into ``[-1, 1]``; for Discrete
            spaces the epsilon of epsilon-greedy exploration.
        model_lr, model_eps, model_clip: Adam (1e-3, 1e-4, 1000).
        device, precision: as :class:`reverie.agents.DreamerV3` (default float32).
        kernels: as :class:`reverie.agents.DreamerV3`; PlaNet's own modules have none (a dynamics' own fast paths
            take the value from the config's ``dynamics`` block).
        actor_lr, critic_lr: not PlaNet settings; accepted only to reject DreamerV3 presets with a clear error.

    Raises:
        ValueError: ``planner="gaussian"`` with a Discrete action space (and the other errors of
            :func:`make_planner`), or DreamerV3-only settings (``actor_lr``/``critic_lr``) from an ``exp``
            preset written for DreamerV3.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_spec: ActionSpec, *,
                 dynamics: Callable[..., Dynamics] | None = None, units: int = 200, layers: int = 2,
                 cnn_depth: int = 32, cnn: dict | None = None, decoder_std: float = 1.0, image_bits: int = 5,
                 divergence_scale: float = 1.0, global_divergence_scale: float = 0.0, overshooting_scale: float = 1.0,
                 reward_scale: float = 1.0, cont_scale: float = 1.0,
                 planner: str = "auto", horizon: int = 12, candidates: int = 1000, top_k: int = 100,
                 iterations: int = 10, plan_gamma: float = 1.0, plan_sample: bool = True, plan_cont: bool = True,
                 action_noise: float = 0.3,
                 model_lr: float = 1e-3, model_eps: float = 1e-4, model_clip: float = 1000.0, device: str = "cpu",
                 precision: str = "float32", kernels: str = "auto"):
        super().__init__()
        self.spec, self.action_noise, self.model_clip = action_spec, action_noise, model_clip
        self.obs_keys = sorted(obs_shapes)
        self.wm = WorldModel(obs_shapes, action_spec.dim, dynamics or partial(GaussianRSSM), units=units,
                             layers=layers, likelihood="gaussian", decoder_std=decoder_std, image_bits=image_bits,
                             cnn_depth=cnn_depth, cnn=dict(cnn) if cnn else None, kernels=kernels)
        self.planner = make_planner(action_spec, planner, -1.0, 1.0, horizon=horizon, candidates=candidates,
                                    top_k=top_k, iterations=iterations, gamma=plan_gamma)
        self.plan_model = WorldModelPlanning(self.wm, sample=plan_sample, use_cont=plan_cont)
        scales = {"reward": reward_scale, "cont": cont_scale, "kl": divergence_scale,
                  "global_kl": global_divergence_scale, "overshooting": overshooting_scale}
        self.loss_scales = {k: scales.get(k, 1.0) for k in self.wm.loss_keys}  # one scale per loss the model returns
        self._place(device, precision)
        self.model_opt = adam(self.wm.parameters(), lr=model_lr, eps=model_eps)

    # ----------------------------------------------------------------------------------------------- acting
    @torch.inference_mode()
    def act(self, obs: dict[str, np.ndarray], state: Any = None, mode: str = "explore") -> tuple[np.ndarray, Any]:
        """Filter the observation into the posterior, then plan with CEM from it (Agent protocol).

        Args:
            obs: ``(N, ...)`` arrays with the observation keys and ``is_first (N,)``.
            state: from :meth:`initial_state` or the previous call; None starts fresh.
            mode: ``"explore"`` (plan + action noise, clipped into the bounds), ``"eval"`` (the plan) or
                ``"sample"`` (the plan; Discrete: a draw from the elite frequencies).

        Returns:
            ``(action (N, A) float32, state)``: one-hot for Discrete spaces, ``[-1, 1]`` for Box.

        Raises:
            ValueError: unknown ``mode``.
        """
        data, latent, prev_action = self._act_inputs(obs, state, mode)
        with autocast(self.device, self.compute_dtype):
            post = self.wm.posterior_step(data, prev_action, latent)
            action = self.planner.act(self.plan_model, post, mode, self.action_noise).float()
        return action.cpu().numpy().astype(np.float32), (post, action)

    # ----------------------------------------------------------------------------------------------- learning
    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
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
            losses, _, info = self.wm.loss(data)
            model_loss = sum(self.loss_scales[k] * v.mean() for k, v in losses.items())
        grad_norm, skipped = self._step(self.model_opt, model_loss, self.wm.parameters(), self.model_clip)
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics |= {"loss/model": model_loss.detach(), "grad_norm/model": grad_norm} | info
        return self._metric_floats(metrics | {"guard/nonfinite": torch.tensor(float(skipped))})

    #: the world-model-only update of offline pretraining (the Agent protocol's optional ``update_model``): PlaNet's
    #: whole update (it plans; there is no policy to train)
    update_model = update

