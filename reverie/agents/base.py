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
      float metrics.
    - ``state_dict()`` / ``load_state_dict()``: everything the agent needs to continue (parameters,
      optimisers, slow networks, normalisers).
    """

    def initial_state(self, batch: int) -> Any: ...

    def act(self, obs: dict[str, np.ndarray], state: Any, mode: str = "explore") -> tuple[np.ndarray, Any]: ...

    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...
