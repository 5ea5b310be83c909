"""The Agent protocol the training loop knows (DESIGN.md section 1): it never names an algorithm."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Agent(Protocol):
    """What ``reverie.train`` needs from an agent.

    - ``initial_state(batch)``: recurrent state for ``batch`` envs before their first step.
    - ``act(obs, state, mode)``: ``obs`` is a dict of ``(N, ...)`` numpy arrays that includes ``is_first``;
      returns ``(action (N, A) float32 numpy, new_state)``. Runs under ``torch.inference_mode``; no side
      effects on parameters. ``mode`` is ``"explore"`` (training collection), ``"eval"`` (policy mode) or
      ``"sample"`` (evaluation with sampled actions).
    - ``update(batch)``: one gradient update on a replay batch of ``(T, B, ...)`` numpy arrays; returns
      float metrics. Guard (issue 6): an optimiser step whose loss or gradient norm is non-finite must be
      skipped (parameters, optimiser moments and normalisers unchanged) and counted in the metric
      ``guard/nonfinite`` (skipped steps in this update; 0 or absent when none). ``train`` warns on each such
      update and stops the run, with a checkpoint, after ``train.max_nonfinite_updates`` in a row.
    - ``state_dict()`` / ``load_state_dict()``: everything the agent needs to continue exactly (parameters,
      optimisers, slow networks, normalisers), as picklable tensors and plain values. The loop saves
      everything generic itself (replay, train_ratio clock, counters, RNG states, envs, the state ``act``
      returned last), so an agent holds no other state that outlives an update.

    Exact resume also asks that ``act`` and ``update`` draw randomness only from torch's global generator
    (or numpy's / python's global ones), which the checkpoint saves and restores.
    """

    def initial_state(self, batch: int) -> Any: ...

    def act(self, obs: dict[str, np.ndarray], state: Any, mode: str = "explore") -> tuple[np.ndarray, Any]: ...

    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...
