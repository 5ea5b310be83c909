"""Contract wrappers that turn a supported Gymnasium env into one speaking reverie's data contract.

Applied innermost first, after the user's wrappers: :class:`ActionRepeat`, :func:`normalize_action` (agent actions
in ``[-1, 1]`` or ``0..n-1``), :class:`DictObservation`, Gymnasium's ``TimeLimit`` (agent steps, a truncation),
:class:`SeededReset`. Other spaces raise :class:`UnsupportedSpaceError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import RescaleAction, TransformAction

SUPPORTED_SPACES = (
    "supported observation spaces: Box vectors (0-2 dims, any numeric dtype; stored as float32 'vector' (F,)), "
    "uint8 Box images of shape (H, W, 3) (stored as uint8 'image' (3, H, W)), or a Dict of those; "
    "supported action spaces: Discrete(n), or a float Box of shape (A,) with finite bounds"
)


class UnsupportedSpaceError(ValueError):
    """An observation or action space the data contract cannot carry; the message lists what is supported."""

    def __init__(self, what: str, space: Any, reason: str):
        super().__init__(
            f"unsupported {what} {space!r}: {reason}. {SUPPORTED_SPACES}. "
            "Add a wrapper to env.wrappers that converts it."
        )
        self.space = space


class ActionRepeat(gym.Wrapper):
    """Repeat every action ``repeat`` times (an int >= 1, else ValueError), summing rewards; stops at an episode end,
    so the last observation is the true final one."""

    def __init__(self, env: gym.Env, repeat: int):
        if isinstance(repeat, bool) or not isinstance(repeat, (int, np.integer)) or repeat < 1:
            raise ValueError(f"action_repeat must be an int >= 1, got {repeat!r}; set env.action_repeat=1 for none")
        super().__init__(env)
        self.repeat = int(repeat)

    def step(self, action):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def normalize_action(env: gym.Env) -> gym.Env:
    """``env`` with agent actions ``Discrete(n)`` (start 0) or ``Box(-1, 1, (A,))``: other Box bounds via Gymnasium's
    ``RescaleAction`` (a ``[-1, 1]`` Box is left untouched, bit-exact), ``Discrete(n, start=s)`` shifted by ``s``.
    Raises UnsupportedSpaceError: another space, or a Box not 1-D, not float or with infinite bounds."""
    space = env.action_space
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        if start == 0:
            return env
        return TransformAction(env, lambda a: np.int64(a) + start, spaces.Discrete(int(space.n)))
    if isinstance(space, spaces.Box):
        if len(space.shape) != 1:
            raise UnsupportedSpaceError("action space", space, f"Box actions must have shape (A,), got {space.shape}")
        if not np.issubdtype(space.dtype, np.floating):
            raise UnsupportedSpaceError("action space", space, f"Box actions must be floating point, got {space.dtype}")
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise UnsupportedSpaceError(
                "action space", space, "Box actions need finite low and high bounds to rescale [-1, 1] onto"
            )
        if np.all(space.low == -1) and np.all(space.high == 1):
            return env
        ones = np.ones(space.shape, space.dtype)  # bounds in the env's dtype: no precision-loss warning
        return RescaleAction(env, min_action=-ones, max_action=ones)
    raise UnsupportedSpaceError("action space", space, f"{type(space).__name__} actions are not supported")


def _converter(name: str, space: spaces.Space) -> tuple[spaces.Box, Callable[[np.ndarray], np.ndarray]]:
    """Contract space and conversion function for one observation entry (``name`` is used in errors)."""
    if not isinstance(space, spaces.Box):
        raise UnsupportedSpaceError(f"observation space {name!r}", space, f"{type(space).__name__} is not a Box")
    shape = tuple(space.shape)
    if len(shape) == 3:
        if space.dtype != np.uint8 or shape[-1] != 3:
            raise UnsupportedSpaceError(
                f"observation space {name!r}",
                space,
                f"3-dim observations must be uint8 (H, W, 3) images, got dtype {space.dtype} shape {shape}",
            )
        h, w, _ = shape
        new = spaces.Box(0, 255, (3, h, w), np.uint8)
        return new, lambda x: np.ascontiguousarray(np.transpose(np.asarray(x, dtype=np.uint8), (2, 0, 1)))
    if len(shape) > 3 or (space.dtype == np.uint8 and len(shape) == 2):
        raise UnsupportedSpaceError(
            f"observation space {name!r}", space, f"shape {shape} is neither a vector nor a (H, W, 3) image"
        )
    if not np.issubdtype(space.dtype, np.number):
        raise UnsupportedSpaceError(f"observation space {name!r}", space, f"dtype {space.dtype} is not numeric")
    low = np.asarray(space.low, dtype=np.float32).reshape(-1)
    high = np.asarray(space.high, dtype=np.float32).reshape(-1)
    new = spaces.Box(low, high, (int(np.prod(shape, dtype=np.int64)),), np.float32)
    return new, lambda x: np.asarray(x, dtype=np.float32).reshape(-1)


class DictObservation(gym.ObservationWrapper):
    """Observations as a dict (:mod:`reverie.types`): a numeric ``Box`` of 0-2 dims (not 2-dim uint8) -> ``vector``
    float32 ``(F,)``; a uint8 ``(H, W, 3)`` Box -> ``image`` uint8 ``(3, H, W)``; a ``Dict`` of those -> its keys.
    Raises UnsupportedSpaceError for anything else."""

    def __init__(self, env: gym.Env):
        space = env.observation_space
        if isinstance(space, spaces.Dict):
            items = list(space.spaces.items())
        elif isinstance(space, spaces.Box):
            items = [("image" if len(space.shape) == 3 else "vector", space)]
        else:
            raise UnsupportedSpaceError("observation space", space, f"{type(space).__name__} is not a Box or Dict")
        converted = {name: _converter(name, sub) for name, sub in items}
        super().__init__(env)
        self._dict_input = isinstance(space, spaces.Dict)
        self._key = items[0][0]
        self._fns = {name: fn for name, (_, fn) in converted.items()}
        self.observation_space = spaces.Dict({name: sub for name, (sub, _) in converted.items()})

    def observation(self, observation) -> dict[str, np.ndarray]:
        if not self._dict_input:
            return {self._key: self._fns[self._key](observation)}
        return {name: fn(observation[name]) for name, fn in self._fns.items()}


def derive_seed(seed: int, index: int) -> int:
    """The reset seed of env copy ``index``: ``SeedSequence(seed, spawn_key=(index,)).generate_state(1)[0]`` (=
    ``SeedSequence(seed).spawn(index + 1)[index]``), a uint32. ValueError: ``seed`` or ``index`` negative."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and env index must be >= 0, got seed={seed} index={index}")
    return int(np.random.SeedSequence(int(seed), spawn_key=(int(index),)).generate_state(1)[0])


class SeededReset(gym.Wrapper):
    """Seed the first ``reset`` without a seed, and the action space, with ``seed``; later resets continue the env's
    own stream, and an explicit ``reset(seed=...)`` wins."""

    def __init__(self, env: gym.Env, seed: int):
        super().__init__(env)
        self.seed = int(seed)
        self._seeded = False
        self.action_space.seed(self.seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None and not self._seeded:
            seed = self.seed
        self._seeded = True
        return self.env.reset(seed=seed, options=options)
