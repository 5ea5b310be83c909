"""The Agent protocol the training loop knows (it never names an algorithm), and what the two agents share: the
Adam optimiser, the guarded optimiser step :meth:`WorldModelAgent._step`, acting state and checkpoint state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.autograd.graph import increment_version

from reverie.models.representation import SCALE_KEYS
from reverie.runtime.collectives import all_finite, average_gradients
from reverie.runtime.precision import autocast, resolve_precision


class UpdateResult(dict):
    """What ``update`` returns: the metrics ``{name: float}`` (this dict; ``guard/nonfinite`` among them for the
    logs), ``skipped`` (optimiser steps the guard skipped in this update: the loop reads this, not the metric) and
    ``replay_writes`` (``{replay key: (T, B, ...) array}`` to write back into the sampled rows, or None)."""

    def __init__(self, metrics: dict[str, float], skipped: int = 0, replay_writes: dict | None = None):
        super().__init__(metrics)
        self.skipped, self.replay_writes = int(skipped), replay_writes

    @classmethod
    def of(cls, result: dict[str, float]) -> UpdateResult:
        """``result`` itself, or a plain dict of metrics (another agent's) as a result with nothing skipped."""
        return result if isinstance(result, cls) else cls(result)


class Agent(Protocol):
    """What ``reverie.train`` needs from an agent.

    - ``initial_state(batch)``: recurrent state for ``batch`` envs before their first step.
    - ``act(obs, state, mode)``: ``obs`` is a dict of ``(N, ...)`` numpy arrays that includes ``is_first``;
      returns ``(action (N, A) float32 numpy, new_state)``. Runs under ``torch.inference_mode``; no side
      effects on parameters. ``mode`` is ``"explore"`` (training collection), ``"eval"`` (policy mode) or
      ``"sample"`` (evaluation with sampled actions).
    - ``update(batch)``: one gradient update on a replay batch of ``(T, B, ...)`` numpy arrays; returns an
      :class:`UpdateResult` (float metrics; a plain dict of metrics counts as nothing skipped, no writes). Guard
      (issue 6): an optimiser step whose loss or gradient norm is non-finite must be skipped (parameters,
      optimiser moments and step counts, normalisers and slow copies that follow the step: the whole saved state
      that step would change, ``tests/agents/test_guard.py``) and counted in ``UpdateResult.skipped``. ``train``
      warns on each such update and stops the run, with a checkpoint, after ``train.max_nonfinite_updates`` in a row.
    - ``state_dict()`` / ``load_state_dict()``: everything the agent needs to continue exactly (parameters,
      optimisers, slow networks, normalisers), as picklable tensors and plain values. The loop saves
      everything generic itself (replay, train_ratio clock, counters, RNG states, envs, the state ``act``
      returned last), so an agent holds no other state that outlives an update.

    Exact resume also asks that ``act`` and ``update`` draw randomness only from torch's global generator
    (or numpy's / python's global ones), which the checkpoint saves and restores.

    Optional, for learning from logged data (``reverie pretrain``, docs/offline.md); both agents here have them
    (:class:`WorldModelAgent`):

    - ``update_model(batch)``: the world-model part of ``update`` alone (same guard, same metrics minus the
      policy's), what ``reverie pretrain`` runs unless ``pretrain.behavior`` asks for the full ``update``.
    - ``load_pretrained(state, behavior)``: start from another run's ``state_dict()``: the world model and its
      optimiser only, or (``behavior`` True) everything; ``reverie train init_from=RUN`` calls it.
    """

    def initial_state(self, batch: int) -> Any: ...

    def act(self, obs: dict[str, np.ndarray], state: Any, mode: str = "explore") -> tuple[np.ndarray, Any]: ...

    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult | dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


def loss_scale_table(given: dict[str, float] | None, representation: Any, loss_keys: Iterable[str], owner: str,
                     defaults: dict[str, float] | None = None, config_key: str = "agent.module.loss_scales",
                     fix: str | None = None) -> dict[str, float]:
    """An agent's one scale per loss: the ``given`` table (its loss-scale config) over the agent's ``defaults``
    (those only for keys it has), with the representation objective's entry spread over that objective's losses
    (``rec`` over every decoded key, as the official ``agent.py:80-83``; an entry of the loss's own name, e.g. an
    observation key, wins) and the entries of the objectives not chosen dropped (one table holds all of them, as
    R2-Dreamer's ``configs/model/_base_.yaml:21-34``); then checked against the losses the agent's loss function
    returns as a set (the official ``agent.py:237-238`` asserts it): a loss without a scale, or a given scale of no
    loss, is an error at construction, so a new loss term cannot go unscaled and a misspelt scale cannot go unread.

    Args:
        given: ``{key: scale}`` as configured. representation: the world model's objective (``name``,
            ``scale_key``, ``loss_keys``). loss_keys: every key of the agent's loss function. owner: named in the
            error. defaults: the agent's own table (a default of no loss is left out, not an error).
        config_key, fix: the error's config key, and what it says to do about a missing scale (default: set
            ``<config_key>.<key>``).

    Returns:
        ``{loss key: scale}`` with exactly the keys of ``loss_keys``.

    Raises:
        ValueError: the keys differ; the message names the missing and the extra keys and the config key.
    """
    own, keys = representation.scale_key, list(loss_keys)

    def table(scales: dict[str, float]) -> dict[str, float]:
        scales = {k: v for k, v in scales.items() if k == own or k not in SCALE_KEYS}  # other objectives' entries
        if own in scales:  # spread over the objective's losses; a loss's own entry (e.g. `image`) wins
            value = scales.pop(own)
            scales = {k: value for k in representation.loss_keys} | scales
        return scales

    given_scales = table(dict(given or {}))
    scales = {k: v for k, v in table(dict(defaults or {})).items() if k in keys} | given_scales
    missing = [k for k in keys if scales.get(k) is None]
    extra = sorted(set(given_scales) - set(keys))
    if missing or extra:
        parts = []
        if missing:
            hint = fix or (f"set {', '.join(f'{config_key}.{k}' for k in missing)}"
                           + (f" (the objective {representation.name!r} reads {config_key}.{own})"
                              if set(missing) & set(representation.loss_keys) else ""))
            parts.append(f"no scale for the losses {missing}: {hint}")
        if extra:
            parts.append(f"{config_key} keys {extra} are not losses of this agent (its losses: {keys}); remove them")
        raise ValueError(f"{owner}: " + "; ".join(parts))
    return {k: float(scales[k]) for k in keys}


def _bump_versions(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Step post-hook of a fused optimiser: its kernel updates the parameters in place without bumping their
    version counters, which autograd's saved-tensor checks read; bump them as any
    in-place op would."""
    increment_version([p for group in opt.param_groups for p in group["params"]])


def _clear_autocast_cache(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Step post-hook: drop autocast's lower-precision copies of the parameters. Autocast casts each float32 leaf
    parameter once per outermost autocast region and reuses the copy, whatever happens to the parameter in
    between, so without this a DreamerV3 update (one region) would imagine with the bf16 world-model weights of
    before its own world-model step (``tests/agents/test_adam.py``)."""
    torch.clear_autocast_cache()


def adam(params: Iterable[nn.Parameter], lr: float, eps: float) -> torch.optim.Adam:
    """``torch.optim.Adam(params, lr, eps=eps)`` with the fused implementation (one kernel over all parameters
    instead of a loop of small ops per parameter: 4 ms instead of 12 ms per world-model step at size s on the
    2-core CPU, docs/changelog.md round 2), falling back to the default where this torch has no fused Adam
    for the device.
    The same update rule (Kingma and Ba 2015, Algorithm 1, with ``eps`` added to the root of the second moment).
    After each step autocast's cached casts are dropped, so later forward passes in the same autocast region
    read the new parameters."""
    params = list(params)
    try:
        opt = torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
        opt = torch.optim.Adam(params, lr=lr, eps=eps)
    else:
        opt.register_step_post_hook(_bump_versions)
    opt.register_step_post_hook(_clear_autocast_cache)
    return opt


def guarded_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: Iterable[nn.Parameter], clip: float,
                 ok: bool = True) -> tuple[torch.Tensor, int]:
    """One guarded optimiser step on ``loss`` (a scalar) for ``params``, the same for every optimiser of every
    agent: zero the gradients, backpropagate into ``params`` only (``backward(inputs=...)``: through other
    modules only the activation gradients on the way are computed), average them over data-parallel ranks,
    clip their total norm to ``clip`` (reference ``*_opt.clip``), and step unless the loss or the norm is
    non-finite on any rank or ``ok`` is False; a skipped step leaves parameters and optimiser moments untouched
    and drops the gradients (the Agent protocol's guard).

    Returns:
        ``(grad_norm, skipped)``: the total norm before clipping and 1 when the step was skipped, else 0.
    """
    params = list(params)
    optimizer.zero_grad(set_to_none=True)
    loss.backward(inputs=params)
    average_gradients(params)  # data parallel: the mean over ranks (no-op in one process)
    norm = nn.utils.clip_grad_norm_(params, clip)
    finite = all_finite(loss)  # every rank's loss; in one process, True (the check below is this process's)
    if ok and finite and bool(torch.isfinite(loss.detach()) & torch.isfinite(norm)):
        optimizer.step()
        return norm, 0
    optimizer.zero_grad(set_to_none=True)
    return norm, 1


class WorldModelAgent(nn.Module):
    """What DreamerV3 and PlaNet share around their world model ``self.wm``: the acting state, the filtering inputs
    of ``act`` and the checkpoint state. Subclasses set ``self.wm``, ``self.spec``, ``self.device``,
    ``self.obs_keys`` and one optimiser attribute per name in :attr:`optimizers`."""

    #: attribute names of the optimisers saved next to the module state (``state_dict``)
    optimizers: tuple[str, ...] = ("model_opt",)

    def _place(self, device: str, precision: str) -> None:
        """Set ``self.device`` and ``self.compute_dtype`` (:func:`reverie.runtime.precision.resolve_precision`) and
        move the modules there; ``"float64"`` also makes the parameters float64 (exactness tests, debugging)."""
        self.device = torch.device(device)
        self.compute_dtype = resolve_precision(precision, self.device)
        if self.compute_dtype == torch.float64:
            self.to(device=self.device, dtype=torch.float64)
        else:
            self.to(self.device)

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: Iterable[nn.Parameter],
              clip: float, ok: bool = True) -> tuple[torch.Tensor, int]:
        """:func:`guarded_step`, the one step of every optimiser of every agent."""
        return guarded_step(optimizer, loss, params, clip, ok)

    @staticmethod
    @torch.no_grad()
    def _follow(slow: nn.Module, fast: nn.Module, mix: float) -> None:
        """The slow copy moves ``mix`` of the way to ``fast``: ``slow <- slow + mix (fast - slow)`` per parameter
        (2023 ``jaxutils.SlowUpdater``; 2025 ``slowvalue``)."""
        for s, f in zip(slow.parameters(), fast.parameters()):
            s.lerp_(f, mix)

    def initial_state(self, batch: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(dynamics state (N, ...), prev_action (N, A))`` before the first step of ``batch`` envs."""
        with torch.inference_mode():
            return self.wm.dynamics.initial(batch), torch.zeros(batch, self.spec.dim, device=self.device)

    def act(self, obs: dict[str, np.ndarray], state: Any = None, mode: str = "explore") -> tuple[np.ndarray, Any]:
        """One step for ``N`` envs (Agent protocol): filter the observation into the posterior, then
        :meth:`_choose` the action from it.

        Args:
            obs: ``(N, ...)`` arrays with the observation keys and ``is_first (N,)``.
            state: from :meth:`initial_state` or the previous call; None starts fresh.
            mode: ``"explore"`` (training collection), ``"eval"`` (the policy's mode, or the plan) or ``"sample"``
                (evaluation with sampled actions).

        Returns:
            ``(action (N, A) float32, state)``; one-hot actions for discrete spaces, ``[-1, 1]`` for Box.

        Raises:
            ValueError: unknown ``mode``.
        """
        wm = self._acting_model()
        with torch.inference_mode():
            data, latent, prev_action = self._act_inputs(obs, state, mode)
            with autocast(self.device, self.compute_dtype):
                post = wm.posterior_step(data, prev_action, latent)
                action = self._choose(post, mode)
        self._acted()
        return action.float().cpu().numpy(), (post, action)

    def _acting_model(self) -> nn.Module:
        """The world model that filters the observations when acting (the 2025 agent's lagged copy)."""
        return self.wm

    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """The action ``(N, A)`` from the posterior: the policy, or a planner."""
        raise NotImplementedError

    def _acted(self) -> None:
        """After each :meth:`act` (the 2025 agent's lagged copy takes its pending parameters)."""

    def _act_inputs(self, obs: dict[str, np.ndarray], state: Any,
                    mode: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
        """``act``'s common start: check ``mode``, start fresh where ``state`` is None and move the observation
        ``(N, ...)`` (with ``is_first (N,)``) to tensors. Returns ``(data, dynamics_state, prev_action)``.

        Raises:
            ValueError: ``mode`` is not ``"explore"``, ``"eval"`` or ``"sample"``.
        """
        if mode not in ("explore", "eval", "sample"):
            raise ValueError(f"act: mode must be 'explore', 'eval' or 'sample', got {mode!r}")
        latent, prev_action = state if state is not None else self.initial_state(len(obs["is_first"]))
        return self.wm.tensors({k: obs[k] for k in (*self.obs_keys, "is_first")}), latent, prev_action

    def _update_inputs(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """``update``'s common start: the replay sample's observation keys, ``prev_action``, ``reward``,
        ``is_first`` and ``is_terminal`` ``(T, B, ...)`` as tensors on the device."""
        keys = (*self.obs_keys, "prev_action", "reward", "is_first", "is_terminal")
        return self.wm.tensors({k: batch[k] for k in keys})

    @staticmethod
    def _result(metrics: dict[str, torch.Tensor], skipped: int, replay_writes: dict | None = None) -> UpdateResult:
        """``update``'s common end: scalar tensors -> floats with one host sync for all of them, ``skipped`` also
        logged as ``guard/nonfinite``."""
        metrics = metrics | {"guard/nonfinite": torch.tensor(float(skipped))}
        values = torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in metrics.values()]).tolist()
        return UpdateResult(dict(zip(metrics.keys(), values)), skipped, replay_writes)

    def state_dict(self, *args, **kwargs) -> dict:  # type: ignore[override]
        """``{"modules": nn.Module state, <optimiser name>: its state, ...}``; with arguments, plain ``nn.Module``."""
        if args or kwargs:
            return super().state_dict(*args, **kwargs)
        return {"modules": super().state_dict(), **{name: getattr(self, name).state_dict() for name in self.optimizers}}

    def load_pretrained(self, state: dict, behavior: bool) -> list[str]:
        """Start from another run's :meth:`state_dict` (the Agent protocol's optional ``load_pretrained``).

        Args:
            state: a ``state_dict()`` of an agent built from the same ``agent.module`` config and env spaces.
            behavior: True: load everything (a run whose actor and critic were trained); False: the world model
                (``wm.*`` parameters and buffers) and its optimiser ``model_opt`` only, the rest stays as built.

        Returns:
            What was loaded (``["world model", ...]``), for the log.

        Raises:
            RuntimeError: the state does not fit this agent (other sizes or spaces).
        """
        if behavior:
            self.load_state_dict(state)
            return ["world model", *(name for name, _ in self.named_children() if name != "wm")]
        prefix = "wm."
        self.wm.load_state_dict({k[len(prefix):]: v for k, v in state["modules"].items() if k.startswith(prefix)})
        self.model_opt.load_state_dict(state["model_opt"])
        return ["world model"]

    def load_state_dict(self, state: dict, strict: bool = True) -> Any:  # type: ignore[override]
        """Inverse of :meth:`state_dict` (a plain module state dict loads as ``nn.Module`` does)."""
        if "modules" not in state:
            return super().load_state_dict(state, strict)
        super().load_state_dict(state["modules"], strict)
        for name in self.optimizers:
            getattr(self, name).load_state_dict(state[name])
        return None
