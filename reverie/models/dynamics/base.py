"""The ``Dynamics`` protocol: what a latent dynamics model gives the world model, the agents, the planners and the
visualisations, and the pieces every implementation shares.

A dynamics model keeps a latent state per sequence and moves it with actions, with or without an observation
(Hafner et al. 2019, PlaNet section 3: "filtering" and "open-loop prediction"). A state is a dict of tensors, every
entry batch-first: ``(N, ...)`` for one step, ``(T, B, ...)`` for a sequence, ``(H+1, N, ...)`` for imagination.
Timing (:mod:`reverie.types`)::

    s_t = step(s_{t-1}, prev_action_t)               prev_action_t = action_{t-1}, zero where is_first_t
    prior     p(s_t | s_{t-1}, prev_action_t)        img_step / imagine (no observation)
    posterior q(s_t | s_{t-1}, prev_action_t, e_t)   observe (e_t: the encoder's embedding of obs_t)

Where ``is_first_t`` is set, nothing crosses the episode boundary: a recurrent dynamics replaces the state by the
initial one and the previous action by zero (:func:`reset`), a dynamics with a context (a transformer's tokens) may
mask the context before the boundary instead. Code outside a dynamics may index, repeat, concatenate, detach and move
state entries generically (planners repeat states for their candidates, play keeps one state per env) but never
names an entry: where imagination starts (:meth:`Dynamics.starts`), what continues after a window
(:meth:`Dynamics.truncate`), what imagination keeps (:attr:`Dynamics.feature_keys`) and what the replay context
stores (:meth:`Dynamics.context_spec`) are the dynamics' own (danijar/dreamerv3 e3f0224 ``dreamerv3/rssm.py``:
``starts``, ``truncate``, ``entry_space``). Three implementations ship: :class:`reverie.models.dynamics.CategoricalRSSM`
(DreamerV3 2023), :class:`reverie.models.dynamics.GaussianRSSM` (PlaNet) and
:class:`reverie.models.dynamics.BlockRSSM` (the current official DreamerV3, ``agent=dreamerv3_2025``); all three take
the window members from :class:`RowState`. A new one is an ``nn.Module`` with the members of :class:`Dynamics`, named
in the config by its ``_target_`` (docs/architecture.md, "A new dynamics").
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
    """A latent dynamics model (an ``nn.Module``). Built by :class:`reverie.models.world_model.WorldModel` as
    ``factory(action_dim=A, embed_dim=E)``, the factory being the config's ``agent.module.dynamics`` (a ``_target_``
    with ``_partial_: true`` and the model's own settings).

    Attributes:
        feat_dim: ``F``, the width of :meth:`features` (what every head reads).
        loss_keys: names of the losses :meth:`loss` returns (e.g. ``("dyn", "rep")``); the agent scales each.
        feature_keys: the state entries :meth:`features` reads; :func:`rollout` stacks only these over the horizon.
    """

    feat_dim: int
    loss_keys: tuple[str, ...]
    feature_keys: tuple[str, ...]

    def initial(self, batch: int) -> State:
        """The state before the first step of ``batch`` sequences, ``(batch, ...)``; what ``is_first`` resets to."""

    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Filter observed sequences: ``embed (T, B, E)``, ``prev_action (T, B, A)``, ``is_first (T, B)`` bool and
        the state before the first step (``(B, ...)``: :meth:`truncate` of the previous window or
        :meth:`context_state` of a stored row; None: :meth:`initial`) -> ``(posterior, prior)`` states
        ``(T, B, ...)``; the prior of step ``t`` is predicted from the posterior of ``t - 1``. ``sample``: draw the
        latents (training) or take their mode (deterministic summaries)."""

    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One open-loop (prior) step: state ``(N, ...)`` and action ``(N, A)`` -> the next state ``(N, ...)``."""

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior ``horizon`` steps from ``start`` ``(N, ...)`` (:meth:`starts`) with
        ``action_t = policy(state_t)`` ``(N, A)``. Returns ``(states, actions)``: states ``(H+1, N, ...)`` with
        ``start`` at index 0, holding at least the :attr:`feature_keys` (a context is not stacked over ``H``),
        ``actions (H+1, N, A)`` (``actions[t]`` chosen at ``states[t]``; the last is never executed). Gradients flow
        through it when autograd records (DreamerV3's continuous actions). :func:`rollout` is the plain
        implementation."""

    def features(self, state: State) -> torch.Tensor:
        """The model features ``(..., F)`` that the decoders, reward and continue heads, actor and critic read."""

    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The dynamics' own losses on an observed batch: ``(losses, info)`` with ``losses[k]`` ``(T, B)`` for ``k``
        in :attr:`loss_keys` (KL terms, already free-nats clipped) and ``info`` scalar diagnostics (no gradient),
        e.g. the unclipped ``kl`` and the latent entropies."""

    def starts(self, post: State, last: int = 0) -> State:
        """The imagination starts ``(N, ...)`` taken from an observed window's posterior ``post`` ``(T, B, ...)``:
        every row (``last = 0``: ``N = T*B``) or the last ``last`` rows (``N = last*B``, rows ``T-last .. T-1``),
        time-major: start ``i*B + b`` comes from the ``i``-th of those rows, column ``b``. Each start holds what
        :meth:`imagine` and :meth:`img_step` need to continue from its row, its context included (a transformer's
        tokens before that row). The agent detaches the result; the dynamics does not. danijar/dreamerv3 e3f0224
        ``rssm.py`` ``starts``.

        Raises:
            ValueError: ``last`` outside ``[0, T]``.
        """

    def truncate(self, post: State) -> State:
        """The carry ``(B, ...)`` that continues after the last row of an observed window's posterior ``post``
        ``(T, B, ...)``: what ``observe(..., state=)`` takes next and what an acting loop keeps between steps (the
        agents' ``posterior_step``). For an RSSM the last row. danijar/dreamerv3 e3f0224 ``rssm.py`` ``truncate``."""

    def context_spec(self) -> ContextSpec:
        """The replay context's per-row entries (the current official DreamerV3's ``replay_context``, e3f0224
        ``agent.py:312-340``): ``{name: (shape without the batch dim, numpy dtype)}``, stored in replay as
        ``posterior_<name>`` (:func:`reverie.replay.latent_key`). Empty: this dynamics cannot start a window from
        a stored row (an agent then refuses ``replay_context > 0``). Draws no random numbers."""

    def context_rows(self, post: State) -> dict[str, torch.Tensor]:
        """What the replay stores for each row of ``post`` ``(T, B, ...)``: ``{name: (T, B, *shape)}`` float32 for
        every name of :meth:`context_spec`. ``post`` is an observed window's posterior, or (``T = 1``) an acting
        carry of :meth:`truncate` with a time dim added (the row the agent just acted on)."""

    def context_state(self, rows: Mapping[str, torch.Tensor]) -> State:
        """The carry ``(B, ...)`` that continues after a stored row: ``rows`` ``{name: (B, *shape)}`` as
        :meth:`context_rows` stored them (on the model's device, floats in its dtype) -> what
        ``observe(..., state=)`` takes. ``context_state(context_rows(post)[t])`` continues as
        ``truncate(post[:t+1])`` does."""


def check_dynamics(dynamics: object) -> None:
    """Refuse a dynamics that lacks members of the protocol (:data:`MEMBERS`), before anything trains.

    Raises:
        TypeError: the members it lacks, and where to get them.
    """
    missing = [name for name in MEMBERS if not hasattr(dynamics, name)]
    if missing:
        raise TypeError(f"the dynamics {type(dynamics).__name__} lacks the Dynamics members {missing} "
                        f"(reverie/models/dynamics/base.py, docs/architecture.md 'The Dynamics interface'); a "
                        f"recurrent dynamics whose state row is its whole carry can take starts, truncate and "
                        f"context_* from reverie.models.dynamics.RowState")


def row_starts(post: State, last: int = 0) -> State:
    """:meth:`Dynamics.starts` of a dynamics whose every posterior row is a state to continue from: every row
    (``last = 0``) or the last ``last`` rows of ``post`` ``(T, B, ...)``, flattened time-major ``(N, ...)``.

    Raises:
        ValueError: ``last`` outside ``[0, T]``.
    """
    T = next(iter(post.values())).shape[0]
    if not 0 <= last <= T:
        raise ValueError(f"starts: last must be in [0, T] = [0, {T}] (0: every row), got {last}")
    rows = slice(T - last if last else 0, T)
    return {k: v[rows].flatten(0, 1) for k, v in post.items()}  # (K, B, ...) -> (K*B, ...), start i*B + b


class RowState:
    """The window members of :class:`Dynamics` for a dynamics whose state at a row is all it needs to continue
    (a recurrent state space model: the carry is the last row), as danijar/dreamerv3 e3f0224 ``rssm.py`` has them:
    :meth:`starts` the rows, :meth:`truncate` the last row, and a replay context of the :attr:`carry_keys` entries
    of a row, shaped as in :meth:`initial`.

    Attributes (set by the subclass):
        feature_keys: the entries its ``features`` reads.
        carry_keys: the entries ``observe(..., state=)`` and ``img_step`` read from a state; what the replay
            context stores.
    """

    feature_keys: tuple[str, ...]
    carry_keys: tuple[str, ...]

    def starts(self, post: State, last: int = 0) -> State:
        """Every row (``last = 0``) or the last ``last`` rows of ``post`` ``(T, B, ...)`` as starts ``(N, ...)``,
        time-major (:func:`row_starts`).

        Raises:
            ValueError: ``last`` outside ``[0, T]``.
        """
        return row_starts(post, last)

    def truncate(self, post: State) -> State:
        """The last row ``(B, ...)`` of ``post`` ``(T, B, ...)``."""
        return {k: v[-1] for k, v in post.items()}

    def context_spec(self) -> ContextSpec:
        """``{key: (shape of initial(1)[key] without the batch dim, float32)}`` for the :attr:`carry_keys`."""
        with torch.no_grad():
            init = self.initial(1)  # type: ignore[attr-defined]
        return {k: (tuple(int(d) for d in init[k].shape[1:]), np.dtype(np.float32)) for k in self.carry_keys}

    def context_rows(self, post: State) -> dict[str, torch.Tensor]:
        """The :attr:`carry_keys` entries of ``post`` ``(T, B, ...)`` in float32."""
        return {k: post[k].float() for k in self.carry_keys}

    def context_state(self, rows: Mapping[str, torch.Tensor]) -> State:
        """The stored row ``{key: (B, ...)}`` as the state to continue from: its :attr:`carry_keys` entries."""
        return {k: rows[k] for k in self.carry_keys}


def rollout(img_step: Callable[[State, torch.Tensor], State], policy: Policy, start: State, horizon: int,
            keys: Iterable[str]) -> tuple[State, torch.Tensor]:
    """:meth:`Dynamics.imagine` from a dynamics' ``img_step``: ``horizon`` prior steps from ``start`` ``(N, ...)``
    with the policy's actions; states ``(H+1, N, ...)`` of the entries ``keys`` alone (the dynamics'
    :attr:`Dynamics.feature_keys`), actions ``(H+1, N, A)`` (DreamerV3 section 4)."""
    state, states, actions = start, [start], []
    for t in range(horizon + 1):
        if t > 0:
            state = img_step(state, actions[-1])
            states.append(state)
        actions.append(policy(state))
    stacked = {k: torch.stack([s[k] for s in states]) for k in keys}  # (H+1) x (N, ...) -> (H+1, N, ...)
    return stacked, torch.stack(actions)  # (H+1) x (N, A) -> (H+1, N, A)


def free_bits(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(free_nats, kl)`` elementwise: no gradient below ``free_nats`` (DreamerV3 eq. 5 "free bits"; PlaNet's
    "free nats")."""
    return torch.clamp(kl, min=free_nats)


def reset(state: State, init: State, first: torch.Tensor) -> State:
    """``state`` ``(B, ...)`` with the rows where ``first`` ``(B, 1)`` is 1 replaced by ``init`` ``(B, ...)``:
    ``x * (1 - first) + init * first`` per entry (a learned initial state receives the gradient of those rows). A
    helper for recurrent dynamics (every entry shaped as in ``init``), not a protocol member."""
    out = {}
    for key, value in state.items():
        mask = first.reshape(first.shape[0], *([1] * (value.dim() - 1)))  # (B, 1) -> (B, 1, ...)
        out[key] = value * (1.0 - mask) + init[key] * mask
    return out
