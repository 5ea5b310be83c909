"""Between an env's own spaces and reverie's data contract, both ways: what reading and writing Minari datasets needs.

A Minari dataset records what the env itself takes and returns (CartPole: a ``Box(4,)`` array and ``Discrete(2)``
integers; Pendulum: a torque in ``[-2, 2]``); reverie's replay rows hold the contract's values (``vector`` float32
``(F,)``, ``image`` uint8 ``(3, H, W)``, one-hot or ``[-1, 1]`` actions: :mod:`reverie.types`). A
:class:`SpaceConverter` is built from an env config and converts with the contract wrappers' own rules
(:class:`reverie.envs.wrappers.DictObservation`, :func:`reverie.envs.wrappers.normalize_action`), so a dataset
converted here holds exactly the rows ``reverie train`` would have stored for the same steps.

"The env's own spaces" are those below reverie's contract wrappers: after ``env.wrappers`` and the action repeat
(:func:`reverie.envs.factory.make_raw_env`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from reverie.envs.factory import _plain, action_spec, make_raw_env
from reverie.envs.wrappers import DictObservation, normalize_action


class SpaceConverter:
    """Raw env observations and actions <-> contract rows, for one env config.

    Attributes:
        raw_observation_space, raw_action_space: the env's own spaces (what a Minari dataset of it records).
        observation_space: the contract's ``Dict`` space (``reverie.envs.make_env(cfg).observation_space``).
        action_spec: :class:`reverie.types.ActionSpec` of the contract's actions.
        env_id: the env's ``id`` (or ``task``), for messages.

    Raises:
        reverie.envs.UnsupportedSpaceError: a space the contract cannot carry (as :func:`reverie.envs.make_env`).
    """

    def __init__(self, env_cfg: Mapping):
        cfg = _plain(env_cfg)
        self.env_id = str(cfg.get("id") or cfg.get("task") or "?")
        raw = make_raw_env(cfg)
        try:
            self.raw_observation_space = raw.observation_space
            self.raw_action_space = raw.action_space
            contract = DictObservation(normalize_action(raw))
            self.observation_space = contract.observation_space
            self.action_spec = action_spec(contract.action_space)
            self._observation = contract.observation  # one step's conversion (pure: no env call)
        finally:
            raw.close()

    # ------------------------------------------------------------------------------------------ observations
    def observations(self, raw: Any) -> dict[str, np.ndarray]:
        """Raw observations of ``T`` steps (an array ``(T, ...)``, or a dict of them for a ``Dict`` space) -> the
        contract's keys, each ``(T, ...)`` (one :class:`DictObservation` conversion per step)."""
        if isinstance(raw, Mapping):
            length = len(next(iter(raw.values())))
            steps = [{k: v[t] for k, v in raw.items()} for t in range(length)]
        else:
            steps = list(raw)
        converted = [self._observation(step) for step in steps]
        # T x (...) -> (T, ...) per key
        return {key: np.stack([c[key] for c in converted]) for key in self.observation_space.spaces}

    def raw_observations(self, obs: Mapping[str, np.ndarray]) -> Any:
        """Inverse of :meth:`observations`: contract keys ``(T, ...)`` -> the env's own observations ``(T, ...)``
        (images ``(3, H, W)`` back to ``(H, W, 3)``, vectors reshaped and cast to the env's dtype)."""
        raw = self.raw_observation_space
        if isinstance(raw, spaces.Dict):
            return {key: _raw_entry(obs[key], sub) for key, sub in raw.spaces.items()}
        (key,) = self.observation_space.spaces
        return _raw_entry(obs[key], raw)

    # ----------------------------------------------------------------------------------------------- actions
    def action_error(self, raw: np.ndarray) -> str | None:
        """Why raw actions ``(T, ...)`` are outside the env's action space (naming the first bad row), or None."""
        raw, space = np.asarray(raw), self.raw_action_space
        if isinstance(space, spaces.Discrete):
            flat = raw.reshape(len(raw), -1)  # (T,) or (T, 1) -> (T, 1)
            if flat.shape[1] != 1:
                return f"Discrete actions are one integer per step, got rows of shape {raw.shape[1:]}"
            start, n = int(space.start), int(space.n)
            values = flat[:, 0]
            bad = ~np.isfinite(values.astype(np.float64)) | (values != np.round(values)) | (values < start) \
                | (values >= start + n)
            if bad.any():
                row = int(np.argmax(bad))
                return f"row {row} is {values[row].item()}, outside {space} (integers {start}..{start + n - 1})"
            return None
        if raw.shape[1:] != space.shape:
            return f"rows have shape {raw.shape[1:]}, the env's {space} has {space.shape}"
        values = raw.astype(np.float64)
        bad = ~np.isfinite(values) | (values < space.low) | (values > space.high)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            return (f"row {row} holds {values[row, col].item()} at index {col}, outside {space} "
                    f"(bounds [{space.low[col]}, {space.high[col]}])")
        return None

    def actions(self, raw: np.ndarray) -> np.ndarray:
        """Raw actions ``(T, ...)`` (inside the space: :meth:`action_error` is None) -> model actions ``(T, A)``
        float32: one-hot ``index - start`` for ``Discrete``, ``2 (a - low) / (high - low) - 1`` for a ``Box`` that
        :func:`normalize_action` rescales (computed in float64, the inverse of Gymnasium's ``RescaleAction``),
        the values themselves for a ``Box`` already in ``[-1, 1]``."""
        raw, space = np.asarray(raw), self.raw_action_space
        if isinstance(space, spaces.Discrete):
            index = raw.reshape(len(raw)).astype(np.int64) - int(space.start)  # (T, 1) or (T,) -> (T,)
            return np.eye(int(space.n), dtype=np.float32)[index]
        if np.all(space.low == -1) and np.all(space.high == 1):
            return raw.astype(np.float32)
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        return (2.0 * (raw.astype(np.float64) - low) / (high - low) - 1.0).astype(np.float32)

    def raw_actions(self, action: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`actions`: model actions ``(T, A)`` -> what the env takes ``(T, ...)`` (Discrete:
        ``argmax + start`` int64; Box: Gymnasium's ``RescaleAction`` rule in float64, cast to the space's dtype)."""
        action, space = np.asarray(action), self.raw_action_space
        if isinstance(space, spaces.Discrete):
            return np.argmax(action, axis=-1).astype(np.int64) + int(space.start)
        if np.all(space.low == -1) and np.all(space.high == 1):
            return action.astype(space.dtype)
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        return (low + (high - low) * (action.astype(np.float64) + 1.0) / 2.0).astype(space.dtype)


def _raw_entry(value: np.ndarray, space: spaces.Box) -> np.ndarray:
    """One contract key ``(T, ...)`` -> the env's own entry ``(T, *space.shape)`` of ``space.dtype``."""
    value = np.asarray(value)
    if len(space.shape) == 3:  # (T, 3, H, W) -> (T, H, W, 3)
        return np.ascontiguousarray(np.transpose(value, (0, 2, 3, 1))).astype(space.dtype)
    return value.reshape(len(value), *space.shape).astype(space.dtype)  # (T, F) -> (T, *shape)
