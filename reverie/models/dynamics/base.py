"""The ``Dynamics`` protocol (docs/architecture.md, "The Dynamics interface") and the pieces implementations share.

A state is a dict of tensors: ``(N, ...)`` for one step, ``(T, B, ...)`` for a sequence, ``(H+1, N, ...)`` for
imagination. The prior ``p(s_t | s_{t-1}, prev_action_t)`` is ``img_step``/``imagine``, the posterior
``q(s_t | s_{t-1}, prev_action_t, e_t)`` is ``observe`` (PlaNet section 3); nothing crosses ``is_first``. Code
outside a dynamics never names a state entry: ``starts``, ``truncate``, ``feature_keys`` and ``context_spec`` say
what it needs (danijar/dreamerv3 e3f0224 ``dreamerv3/rssm.py``: ``starts``, ``truncate``, ``entry_space``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Callable, Protocol

import numpy as np
import torch

State = dict[str, torch.Tensor]
Policy = Callable[[State], torch.Tensor]
#: per-row replay entries of a dynamics' context: name -> (shape without the batch dim, numpy dtype)
ContextSpec = dict[str, tuple[tuple[int, ...], np.dtype]]

#: the members every dynamics has (:func:`check_dynamics`): attributes, then methods
MEMBERS = ("feat_dim", "loss_keys", "feature_keys", "initial", "observe", "img_step", "imagine", "features", "loss",
           "starts", "truncate", "context_spec", "context_rows", "context_state")


class Dynamics(Protocol):
    """A latent dynamics ``nn.Module``, built as ``factory(action_dim=A, embed_dim=E)`` from ``agent.module.dynamics``.

    ``feat_dim``: ``F``, the width of :meth:`features`; ``loss_keys``: the losses :meth:`loss` returns;
    ``feature_keys``: the entries :meth:`features` reads, all that imagination stacks over the horizon.
    """

    feat_dim: int
    loss_keys: tuple[str, ...]
    feature_keys: tuple[str, ...]

    def initial(self, batch: int) -> State:
        """The state before the first step of ``batch`` sequences, ``(batch, ...)``; what ``is_first`` resets to."""

    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """``embed (T, B, E)``, ``prev_action (T, B, A)``, ``is_first (T, B)``, carry ``state (B, ...)`` (None:
        :meth:`initial`) -> ``(posterior, prior)`` ``(T, B, ...)``; ``sample=False`` takes the latents' mode."""

    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One open-loop (prior) step: state ``(N, ...)`` and action ``(N, A)`` -> the next state ``(N, ...)``."""

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior ``horizon`` steps from ``start (N, ...)`` with ``policy``: ``states (H+1, N, ...)`` (at
        least :attr:`feature_keys`), ``actions (H+1, N, A)`` (the last never executed); see :func:`rollout`."""

    def features(self, state: State) -> torch.Tensor:
        """The model features ``(..., F)`` that the decoders, reward and continue heads, actor and critic read."""

    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``(losses {k: (T, B)}`` for :attr:`loss_keys` (free nats applied), ``info`` scalar diagnostics)."""

    def starts(self, post: State, last: int = 0) -> State:
        """Imagination starts ``(N, ...)`` from ``post (T, B, ...)``: every row (``N = T*B``) or the last ``last``,
        start ``i*B + b`` from row ``i`` (e3f0224 ``rssm.py`` ``starts``); ValueError for ``last`` not in ``[0, T]``."""

    def truncate(self, post: State) -> State:
        """The carry ``(B, ...)`` after the last row of ``post (T, B, ...)`` (e3f0224 ``rssm.py`` ``truncate``)."""

    def context_spec(self) -> ContextSpec:
        """Replay-context entries ``{name: (shape, numpy dtype)}`` (e3f0224 ``agent.py:312-340``); empty: none."""

    def context_rows(self, post: State) -> dict[str, torch.Tensor]:
        """What the replay stores per row of ``post (T, B, ...)``: ``{name: (T, B, *shape)}`` float32."""

    def context_state(self, rows: Mapping[str, torch.Tensor]) -> State:
        """The carry ``(B, ...)`` after stored ``rows {name: (B, *shape)}``, as ``truncate(post[:t+1])``."""


def check_dynamics(dynamics: object) -> None:
    """Raise TypeError when ``dynamics`` lacks members of the protocol (:data:`MEMBERS`)."""
    missing = [name for name in MEMBERS if not hasattr(dynamics, name)]
    if missing:
        raise TypeError(f"the dynamics {type(dynamics).__name__} lacks the Dynamics members {missing} "
                        f"(reverie/models/dynamics/base.py, docs/architecture.md 'The Dynamics interface'); a "
                        f"recurrent dynamics whose state row is its whole carry can take starts, truncate and "
                        f"context_* from reverie.models.dynamics.RowState")


def row_starts(post: State, last: int = 0) -> State:
    """Rows of ``post (T, B, ...)`` as starts ``(N, ...)``, as :meth:`Dynamics.starts` (ValueError included)."""
    T = next(iter(post.values())).shape[0]
    if not 0 <= last <= T:
        raise ValueError(f"starts: last must be in [0, T] = [0, {T}] (0: every row), got {last}")
    rows = slice(T - last if last else 0, T)
    return {k: v[rows].flatten(0, 1) for k, v in post.items()}  # (K, B, ...) -> (K*B, ...), start i*B + b


class RowState:
    """Window members for a dynamics whose row is its whole carry (an RSSM; e3f0224 ``rssm.py``). The subclass
    sets ``feature_keys`` and ``carry_keys`` (what ``observe(state=)`` and ``img_step`` read; the replay context)."""

    feature_keys: tuple[str, ...]
    carry_keys: tuple[str, ...]

    def starts(self, post: State, last: int = 0) -> State:
        """:func:`row_starts`."""
        return row_starts(post, last)

    def truncate(self, post: State) -> State:
        """The last row ``(B, ...)`` of ``post`` ``(T, B, ...)``."""
        return {k: v[-1] for k, v in post.items()}

    def context_spec(self) -> ContextSpec:
        """``{key: (initial(1)[key].shape[1:], float32)}`` for the :attr:`carry_keys`."""
        with torch.no_grad():
            init = self.initial(1)  # type: ignore[attr-defined]
        return {k: (tuple(int(d) for d in init[k].shape[1:]), np.dtype(np.float32)) for k in self.carry_keys}

    def context_rows(self, post: State) -> dict[str, torch.Tensor]:
        """The :attr:`carry_keys` entries of ``post`` ``(T, B, ...)`` in float32."""
        return {k: post[k].float() for k in self.carry_keys}

    def context_state(self, rows: Mapping[str, torch.Tensor]) -> State:
        """The :attr:`carry_keys` entries of a stored row ``{key: (B, ...)}``."""
        return {k: rows[k] for k in self.carry_keys}


def rollout(img_step: Callable[[State, torch.Tensor], State], policy: Policy, start: State, horizon: int,
            keys: Iterable[str]) -> tuple[State, torch.Tensor]:
    """:meth:`Dynamics.imagine` from ``img_step``, stacking ``keys`` only (DreamerV3 section 4). Each step keeps only
    ``keys`` (a step's other entries, e.g. the ``(N, S, K)`` logits, are freed as the rollout goes), and each key's
    steps are freed once that key is stacked (two copies of one key at a time, not of all keys plus the logits)."""
    state, kept, actions = start, [{k: start[k] for k in keys}], []
    for t in range(horizon + 1):
        if t > 0:
            state = img_step(state, actions[-1])
            kept.append({k: state[k] for k in keys})
        actions.append(policy(state))
    del state
    stacked = {}
    for k in keys:  # (H+1) x (N, ...) -> (H+1, N, ...)
        stacked[k] = torch.stack([step.pop(k) for step in kept])
    return stacked, torch.stack(actions)  # (H+1) x (N, A) -> (H+1, N, A)


def free_bits(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(free_nats, kl)``: no gradient below ``free_nats`` (DreamerV3 eq. 5 "free bits"; PlaNet "free nats")."""
    return torch.clamp(kl, min=free_nats)


def reset(state: State, init: State, first: torch.Tensor) -> State:
    """``state * (1 - first) + init * first`` per entry, ``first (B, 1)``: a learned ``init`` gets the gradient."""
    out = {}
    for key, value in state.items():
        mask = first.reshape(first.shape[0], *([1] * (value.dim() - 1)))  # (B, 1) -> (B, 1, ...)
        out[key] = value * (1.0 - mask) + init[key] * mask
    return out
