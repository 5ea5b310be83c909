"""The Agent protocol the training loop knows, and what agents share: Adam, the guarded step, acting, checkpoints."""

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
    """What ``update`` returns: the metrics ``{name: float}`` (this dict, ``guard/nonfinite`` among them), ``skipped``
    (steps the guard skipped; the loop reads this) and ``replay_writes`` (``{replay key: (T, B, ...)}`` or None)."""

    def __init__(self, metrics: dict[str, float], skipped: int = 0, replay_writes: dict | None = None):
        super().__init__(metrics)
        self.skipped, self.replay_writes = int(skipped), replay_writes

    @classmethod
    def of(cls, result: dict[str, float]) -> UpdateResult:
        """``result`` itself, or a plain dict of metrics as a result with nothing skipped."""
        return result if isinstance(result, cls) else cls(result)


class Agent(Protocol):
    """What ``reverie.train`` needs from an agent.

    - ``initial_state(batch)``: the recurrent state of ``batch`` envs before their first step.
    - ``act(obs, state, mode)``: ``obs`` ``(N, ...)`` numpy arrays with ``is_first``; ``mode`` ``"explore"``, ``"eval"``
      or ``"sample"``; returns ``(action (N, A) float32, new_state)``, under ``torch.inference_mode``.
    - ``update(batch)``: one update on ``(T, B, ...)`` numpy arrays -> :class:`UpdateResult`; a step with a non-finite
      loss or gradient norm changes nothing (``tests/agents/test_guard.py``) and counts in ``skipped``.
    - ``state_dict()`` / ``load_state_dict()``: everything to continue exactly (draws only from the global generators).
    - Optional (docs/offline.md): ``update_model(batch)``, the world-model part of ``update``, for ``reverie pretrain``;
      ``load_pretrained(state, behavior)`` for ``reverie train init_from=RUN``."""

    def initial_state(self, batch: int) -> Any: ...

    def act(self, obs: dict[str, np.ndarray], state: Any, mode: str = "explore") -> tuple[np.ndarray, Any]: ...

    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult | dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


def loss_scale_table(given: dict[str, float] | None, representation: Any, loss_keys: Iterable[str], owner: str,
                     defaults: dict[str, float] | None = None, config_key: str = "agent.module.loss_scales",
                     fix: str | None = None) -> dict[str, float]:
    """An agent's one scale per loss: ``given`` over ``defaults``, the representation objective's entry spread over its
    losses (``rec`` over every decoded key, official ``agent.py:80-83``; a loss's own entry wins), other objectives'
    entries dropped (R2-Dreamer ``configs/model/_base_.yaml:21-34``). Returns ``{loss key: scale}`` for ``loss_keys``.
    Raises ValueError naming ``config_key`` (and ``fix``) for a loss without a scale or a given scale of no loss (the
    official ``agent.py:237-238`` asserts it)."""
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
    """Step post-hook of a fused optimiser: bump the parameters' version counters, as any in-place op would."""
    increment_version([p for group in opt.param_groups for p in group["params"]])


def _clear_autocast_cache(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Step post-hook: drop autocast's cached low-precision parameter copies (``tests/agents/test_adam.py``)."""
    torch.clear_autocast_cache()


def adam(params: Iterable[nn.Parameter], lr: float, eps: float) -> torch.optim.Adam:
    """``torch.optim.Adam(params, lr, eps=eps)`` (Kingma and Ba 2015, Algorithm 1), fused where this torch has it for
    the device (docs/changelog.md round 2); after each step autocast's cached casts are dropped (new parameters)."""
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
    """Backpropagate the scalar ``loss`` into ``params``, average over ranks, clip to ``clip`` (ref ``*_opt.clip``)
    and step unless loss or norm is non-finite on any rank or ``ok`` is False. Returns ``(grad_norm, skipped 0/1)``."""
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
    """What the agents share around their world model ``self.wm``: acting, update inputs and checkpoint state.
    Subclasses set ``wm``, ``spec``, ``device``, ``obs_keys`` and one optimiser per name in :attr:`optimizers`."""

    #: attribute names of the optimisers saved next to the module state (``state_dict``)
    optimizers: tuple[str, ...] = ("model_opt",)

    def _place(self, device: str, precision: str) -> None:
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
        """``slow <- slow + mix (fast - slow)`` per parameter (2023 ``jaxutils.SlowUpdater``; 2025 ``slowvalue``)."""
        for s, f in zip(slow.parameters(), fast.parameters()):
            s.lerp_(f, mix)

    def initial_state(self, batch: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(dynamics state (N, ...), prev_action (N, A))`` before the first step of ``batch`` envs."""
        dtype = next(self.wm.parameters()).dtype  # float64 runs act in float64
        with torch.inference_mode():
            return self.wm.dynamics.initial(batch), torch.zeros(batch, self.spec.dim, device=self.device, dtype=dtype)

    def act(self, obs: dict[str, np.ndarray], state: Any = None, mode: str = "explore") -> tuple[np.ndarray, Any]:
        """One step for ``N`` envs: filter ``obs`` ``(N, ...)`` (with ``is_first``) into the posterior, :meth:`_choose`.
        Returns ``(action (N, A) float32, state)``: one-hot, or in ``[-1, 1]``; ValueError for an unknown ``mode``."""
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
        """After each :meth:`act`."""

    def _act_inputs(self, obs: dict[str, np.ndarray], state: Any,
                    mode: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
        if mode not in ("explore", "eval", "sample"):
            raise ValueError(f"act: mode must be 'explore', 'eval' or 'sample', got {mode!r}")
        latent, prev_action = state if state is not None else self.initial_state(len(obs["is_first"]))
        return self.wm.tensors({k: obs[k] for k in (*self.obs_keys, "is_first")}), latent, prev_action

    def _update_inputs(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        keys = (*self.obs_keys, "prev_action", "reward", "is_first", "is_terminal")
        return self.wm.tensors({k: batch[k] for k in keys})

    @staticmethod
    def _result(metrics: dict[str, torch.Tensor], skipped: int, replay_writes: dict | None = None) -> UpdateResult:
        """Metrics as floats with one host sync, ``skipped`` also logged as ``guard/nonfinite``."""
        metrics = metrics | {"guard/nonfinite": torch.tensor(float(skipped))}
        values = torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in metrics.values()]).tolist()
        return UpdateResult(dict(zip(metrics.keys(), values)), skipped, replay_writes)

    def state_dict(self, *args, **kwargs) -> dict:  # type: ignore[override]
        """``{"modules": module state, <optimiser name>: its state, ...}``; with arguments, plain ``nn.Module``."""
        if args or kwargs:
            return super().state_dict(*args, **kwargs)
        return {"modules": super().state_dict(), **{name: getattr(self, name).state_dict() for name in self.optimizers}}

    def load_pretrained(self, state: dict, behavior: bool) -> list[str]:
        """Start from another run's :meth:`state_dict` of the same config and spaces: everything (``behavior``) or the
        world model and ``model_opt`` only. Returns what was loaded, for the log; RuntimeError when it does not fit."""
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
