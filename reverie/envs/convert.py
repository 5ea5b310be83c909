"""Between an env's own spaces (below the contract wrappers: :func:`reverie.envs.factory.make_raw_env`) and
reverie's data contract, both ways, for Minari datasets. :class:`SpaceConverter` applies the contract wrappers' own
rules, so a converted dataset holds exactly the rows ``reverie train`` would have stored for the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from reverie.envs.factory import _plain, action_spec, make_raw_env
from reverie.envs.wrappers import DictObservation, normalize_action


class SpaceConverter:
    """Raw env observations and actions <-> contract rows for one env config: ``raw_observation_space`` and
    ``raw_action_space`` (the env's own), ``observation_space`` (the contract's ``Dict``), ``action_spec``, ``env_id``.
    Raises UnsupportedSpaceError as :func:`reverie.envs.make_env`."""

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

    def observations(self, raw: Any) -> dict[str, np.ndarray]:
        """Raw observations of ``T`` steps (``(T, ...)``, or a dict of them) -> contract keys, each ``(T, ...)``."""
        if isinstance(raw, Mapping):
            length = len(next(iter(raw.values())))
            steps = [{k: v[t] for k, v in raw.items()} for t in range(length)]
        else:
            steps = list(raw)
        converted = [self._observation(step) for step in steps]
        # T x (...) -> (T, ...) per key
        return {key: np.stack([c[key] for c in converted]) for key in self.observation_space.spaces}

    def raw_observations(self, obs: Mapping[str, np.ndarray]) -> Any:
        """Inverse of :meth:`observations`: contract keys ``(T, ...)`` -> the env's own observations ``(T, ...)``."""
        raw = self.raw_observation_space
        if isinstance(raw, spaces.Dict):
            return {key: _raw_entry(obs[key], sub) for key, sub in raw.spaces.items()}
        (key,) = self.observation_space.spaces
        return _raw_entry(obs[key], raw)

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
        """Raw actions ``(T, ...)`` inside the space -> model actions ``(T, A)`` float32: one-hot ``index - start``
        (``Discrete``), ``2 (a - low) / (high - low) - 1`` in float64 (the inverse of Gymnasium's ``RescaleAction``),
        or the values of a ``Box`` already in ``[-1, 1]``."""
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
