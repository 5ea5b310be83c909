"""PlaNet (Hafner et al. 2019): a Gaussian-latent world model and CEM planning in its latent space. Defaults follow
google-research/planet (``planet/scripts/configs.py`` at c04226b; docs/planet.md has them and what still differs);
the training cycle is :class:`reverie.replay.cycle.EpisodeCycle`."""

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
    """PlaNet agent implementing the :class:`reverie.agents.base.Agent` protocol; defaults are the reference's.
    ``dynamics``: ``factory(action_dim, embed_dim) -> Dynamics``; None: a :class:`reverie.models.dynamics.GaussianRSSM`
    with this ``act``. ``planet_dreamer_nets``: DreamerV3's conv stack and MLPs (``units``, ``layers``, ``cnn``) instead
    of PlaNet's. ``*_scale``: the loss scales. ``planner``: :func:`reverie.agents.planning.make_planner`'s ``kind``;
    ``action_noise``: Gaussian std or Discrete epsilon at ``explore``; ``model_eps``: TF's (:func:`tf_adam_epsilon`).
    ``representation``, ``objectives``: the world model's objective (docs/representation.md; not in the reference:
    a decoder-free PlaNet, ``r2`` or ``infonce``, for the Atari study), scaled by ``representation_scale`` (None:
    R2-Dreamer's 0.05 for ``barlow``, 1.0 for ``infonce``; the reconstruction's decoders are scaled 1).
    Raises ValueError for :func:`make_planner`'s errors or DreamerV3's ``planner`` choices, TypeError for a dynamics
    without the :class:`reverie.models.dynamics.Dynamics` members."""

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
                 precision: str = "float32", kernels: str = "auto", representation: str = "reconstruction",
                 objectives: dict | None = None, representation_scale: float | None = None):
        super().__init__()
        self.spec, self.action_noise, self.model_clip = action_spec, action_noise, model_clip
        self.obs_keys = sorted(obs_shapes)
        self.wm = WorldModel(obs_shapes, action_spec.dim, dynamics or partial(GaussianRSSM, act=act), units=units,
                             layers=layers, likelihood="gaussian", decoder_std=decoder_std, image_bits=image_bits,
                             cnn_depth=cnn_depth, cnn=dict(cnn) if cnn else None, kernels=kernels,
                             nets="dreamer" if planet_dreamer_nets else "planet", head_units=head_units,
                             head_layers=head_layers, act=act, representation=representation,
                             objectives=objectives)
        check_dynamics(self.wm.dynamics)
        if planner in PLANNERS:  # DreamerV3's choice, same key: docs/planning.md's `agent.module.planner=cem`
            raise ValueError(f"PlaNet always plans with CEM; its agent.module.planner picks the CEM's distribution: "
                             f"auto, gaussian or categorical, got {planner!r} ({', '.join(PLANNERS)} are DreamerV3's "
                             f"choices: agent=dreamerv3 agent.module.planner={planner})")
        self.planner = make_planner(action_spec, planner, -1.0, 1.0, horizon=horizon, candidates=candidates,
                                    top_k=top_k, iterations=iterations, gamma=plan_gamma)
        self.plan_model = WorldModelPlanning(self.wm, sample=plan_sample, use_cont=plan_cont)
        # the decoders 1 (the reference scales none); overshooting is read when the dynamics has it (D > 0)
        scales = {"rec": 1.0, "reward": reward_scale, "cont": cont_scale, "kl": divergence_scale,
                  "global_kl": global_divergence_scale, "overshooting": overshooting_scale}
        rep = self.wm.representation
        if not rep.decodes:  # a decoder-free objective: R2-Dreamer's scale unless given
            scales[rep.scale_key] = rep.default_scale if representation_scale is None else float(representation_scale)
        self.loss_scales = loss_scale_table(
            None, self.wm.representation, self.wm.loss_keys, "PlaNet", defaults=scales,
            fix="PlaNet scales the decoders, reward, cont, kl, global_kl and overshooting only (agent.module."
                "reward_scale, cont_scale, divergence_scale, global_divergence_scale, overshooting_scale); give the "
                "dynamics those loss keys")
        install(self, kernels)  # a dynamics' own fast paths (reverie.models.kernels); PlaNet's modules have none
        self._place(device, precision)
        self.model_opt = adam(self.wm.parameters(), lr=model_lr, eps=model_eps)
        self.model_opt.register_step_pre_hook(partial(_tf_adam_epsilon_hook, eps=model_eps))

    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """The CEM's action from the posterior (``"explore"``: plus action noise); float32 (float64 in float64 runs)."""
        action = self.planner.act(self.plan_model, post, mode, self.action_noise)
        return action.to(torch.promote_types(action.dtype, torch.float32))

    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """One world-model update on a replay batch ``(T, B, ...)`` (no actor or critic); returns ``loss/<key>``,
        ``loss/model``, ``kl`` (unclipped), entropies, ``prior_std``, ``grad_norm/model`` and ``guard/nonfinite``."""
        data = self._update_inputs(batch)
        with autocast(self.device, self.compute_dtype):
            model_loss, losses, info = self.model_loss(data)
        grad_norm, skipped = self._step(self.model_opt, model_loss, self.wm.parameters(), self.model_clip)
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics |= {"loss/model": model_loss.detach(), "grad_norm/model": grad_norm} | info
        return self._result(metrics, skipped)

    #: the Agent protocol's optional ``update_model``: PlaNet's whole update (it has no policy to train)
    update_model = update

    def model_loss(self, data: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
        """``(sum_k loss_scales[k] * mean of losses[k], losses (T, B) each, info)`` on tensors ``(T, B, ...)``
        (reference ``training/utility.py:233-257``)."""
        losses, _, _, info = self.wm.loss(data)
        return objectives.weighted_sum(losses, self.loss_scales, "PlaNet"), losses, info


def tf_adam_epsilon(opt: torch.optim.Adam, eps: float) -> None:
    """Set ``opt``'s ``eps`` to ``eps / sqrt(1 - b2^t)`` for step ``t`` so that it is TensorFlow 1's
    ``AdamOptimizer(epsilon=eps)``, which adds ``eps`` to the uncorrected ``sqrt(v)`` (google-research/planet
    ``scripts/configs.py:195``). Called from a step pre-hook: a skipped step does not advance ``t``."""
    for group in opt.param_groups:
        steps = [opt.state[p]["step"] for p in group["params"] if "step" in opt.state.get(p, {})]
        t = 1.0 + (float(max(steps)) if steps else 0.0)
        group["eps"] = eps / math.sqrt(1.0 - group["betas"][1] ** t)


def _tf_adam_epsilon_hook(opt: torch.optim.Adam, args: Any, kwargs: Any, eps: float) -> None:
    """Step pre-hook form of :func:`tf_adam_epsilon`."""
    tf_adam_epsilon(opt, eps)
