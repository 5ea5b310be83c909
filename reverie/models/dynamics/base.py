"""The ``Dynamics`` protocol: what a latent dynamics model gives the world model, the agents, the planners and the
visualisations, and the pieces every implementation shares.

A dynamics model keeps a latent state per sequence and moves it with actions, with or without an observation
(Hafner et al. 2019, PlaNet section 3: "filtering" and "open-loop prediction"). A state is a dict of tensors with
shared leading dims, e.g. ``(B, ...)`` for one step or ``(T, B, ...)`` for a sequence. Timing (:mod:`reverie.types`)::

    s_t = step(s_{t-1}, prev_action_t)               prev_action_t = action_{t-1}, zero where is_first_t
    prior     p(s_t | s_{t-1}, prev_action_t)        img_step / imagine (no observation)
    posterior q(s_t | s_{t-1}, prev_action_t, e_t)   observe (e_t: the encoder's embedding of obs_t)

Where ``is_first_t`` is set, a state's history is replaced by the initial state and the previous action by zero,
so nothing crosses an episode boundary. Three implementations ship: :class:`reverie.models.dynamics.CategoricalRSSM`
(DreamerV3 2023), :class:`reverie.models.dynamics.GaussianRSSM` (PlaNet) and
:class:`reverie.models.dynamics.BlockRSSM` (the current official DreamerV3, ``agent=dreamerv3_2025``).
A new one is an ``nn.Module`` with the
members of :class:`Dynamics`, named in the config by its ``_target_`` (docs/architecture.md, "A new dynamics").
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

State = dict[str, torch.Tensor]
Policy = Callable[[State], torch.Tensor]


class Dynamics(Protocol):
    """A latent dynamics model (an ``nn.Module``). Built by :class:`reverie.models.world_model.WorldModel` as
    ``factory(action_dim=A, embed_dim=E)``, the factory being the config's ``agent.module.dynamics`` (a ``_target_``
    with ``_partial_: true`` and the model's own settings).

    Attributes:
        feat_dim: ``F``, the width of :meth:`features` (what every head reads).
        loss_keys: names of the losses :meth:`loss` returns (e.g. ``("dyn", "rep")``); the agent scales each.
    """

    feat_dim: int
    loss_keys: tuple[str, ...]

    def initial(self, batch: int) -> State:
        """The state before the first step of ``batch`` sequences, ``(batch, ...)``; what ``is_first`` resets to."""

    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Filter observed sequences: ``embed (T, B, E)``, ``prev_action (T, B, A)``, ``is_first (T, B)`` bool and
        the state before the first step (``(B, ...)``, None: :meth:`initial`) -> ``(posterior, prior)`` states
        ``(T, B, ...)``; the prior of step ``t`` is predicted from the posterior of ``t - 1``. ``sample``: draw the
        latents (training) or take their mode (deterministic summaries)."""

    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One open-loop (prior) step: state ``(N, ...)`` and action ``(N, A)`` -> the next state ``(N, ...)``."""

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior ``horizon`` steps from ``start`` ``(N, ...)`` with ``action_t = policy(state_t)``
        ``(N, A)``. Returns ``(states, actions)``: states ``(H+1, N, ...)`` with ``start`` at index 0 (holding at
        least what :meth:`features` reads), ``actions (H+1, N, A)`` (``actions[t]`` chosen at ``states[t]``; the
        last is never executed). Gradients flow through it when autograd records (DreamerV3's continuous actions).
        :func:`rollout` is the plain implementation."""

    def features(self, state: State) -> torch.Tensor:
        """The model features ``(..., F)`` that the decoders, reward and continue heads, actor and critic read."""

    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The dynamics' own losses on an observed batch: ``(losses, info)`` with ``losses[k]`` ``(T, B)`` for ``k``
        in :attr:`loss_keys` (KL terms, already free-nats clipped) and ``info`` scalar diagnostics (no gradient),
        e.g. the unclipped ``kl`` and the latent entropies."""


def rollout(img_step: Callable[[State, torch.Tensor], State], policy: Policy, start: State,
            horizon: int) -> tuple[State, torch.Tensor]:
    """:meth:`Dynamics.imagine` from a dynamics' ``img_step``: ``horizon`` prior steps from ``start`` ``(N, ...)``
    with the policy's actions; states ``(H+1, N, ...)``, actions ``(H+1, N, A)`` (DreamerV3 section 4)."""
    state, states, actions = start, [start], []
    for t in range(horizon + 1):
        if t > 0:
            state = img_step(state, actions[-1])
            states.append(state)
        actions.append(policy(state))
    stacked = {k: torch.stack([s[k] for s in states]) for k in start}  # (H+1) x (N, ...) -> (H+1, N, ...)
    return stacked, torch.stack(actions)  # (H+1) x (N, A) -> (H+1, N, A)


def free_bits(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(free_nats, kl)`` elementwise: no gradient below ``free_nats`` (DreamerV3 eq. 5 "free bits"; PlaNet's
    "free nats")."""
    return torch.clamp(kl, min=free_nats)


def reset(state: State, init: State, first: torch.Tensor) -> State:
    """``state`` ``(B, ...)`` with the rows where ``first`` ``(B, 1)`` is 1 replaced by ``init`` ``(B, ...)``:
    ``x * (1 - first) + init * first`` per entry (a learned initial state receives the gradient of those rows)."""
    out = {}
    for key, value in state.items():
        mask = first.reshape(first.shape[0], *([1] * (value.dim() - 1)))  # (B, 1) -> (B, 1, ...)
        out[key] = value * (1.0 - mask) + init[key] * mask
    return out
