"""The data contract shared by envs, replay, models, agents and the training loop (docs/shapes.md: shapes, timing).

Observations are dicts of numpy arrays, ``(N, ...)`` for ``N`` envs: images uint8 ``(3, 64, 64)`` (any 3-dim uint8
key), ``vector`` float32 ``(F,)``. Replay row ``t``, time-first: ``obs_t``, ``reward_t`` (received on arriving at
``obs_t``, 0 where ``is_first``), ``is_first_t``, ``is_last_t`` (the episode ended, terminated or truncated; the row
holds the true final observation), ``is_terminal_t`` (the MDP ended; continue target ``1 - is_terminal``) and
``action_t``; the model's ``prev_action_t`` is ``action_{t-1}``, 0 where ``is_first_t``. Actions are float32 ``(A,)``:
one-hot for ``Discrete(A)``, in ``[-1, 1]`` for ``Box`` (rescaled by the env layer)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Keys every replay row carries besides the observation keys.
FLAG_KEYS = ("is_first", "is_last", "is_terminal")
STEP_KEYS = ("reward", *FLAG_KEYS, "action")


def is_image_key(value: np.ndarray | tuple, dtype=None) -> bool:
    """True for image observations: 3 dims (C, H, W) and uint8."""
    if isinstance(value, tuple):
        return len(value) == 3 and np.dtype(dtype) == np.uint8
    return value.ndim == 3 and value.dtype == np.uint8


@dataclass(frozen=True)
class ActionSpec:
    """The action space as the agent sees it: ``discrete`` (one-hot vectors of size ``dim``) or not (values in
    ``[-1, 1]``, shape ``(dim,)``); ``dim`` is ``A``."""

    discrete: bool
    dim: int
