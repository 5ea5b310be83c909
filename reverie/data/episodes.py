"""Logged episodes as replay rows, and their validation against an env config (docs/offline.md).

An episode is a dict of ``(T, ...)`` arrays in the timing of the replay rows (:mod:`reverie.types`): row ``t`` holds
``obs_t`` (``vector`` float ``(T, F)``, ``image`` uint8 ``(T, 3, H, W)``, or a Dict space's keys), ``reward_t``
(received on arriving at ``obs_t``; 0 at row 0), the flags ``(T,)`` bool (or 0/1) and ``action_t`` ``(T, A)``
(one-hot for ``Discrete(A)``, or indices ``(T,)``; in ``[-1, 1]`` for ``Box``; unused on an ``is_last`` row).
:func:`validate` checks every episode before anything is filled into a replay (nothing is loaded half).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from reverie.types import FLAG_KEYS, STEP_KEYS, is_image_key

Spec = Mapping[str, tuple[tuple[int, ...], np.dtype]]


class DatasetError(ValueError):
    """A dataset that cannot be loaded as asked: the message names the episode, the key and the fix."""


@dataclass
class Episode:
    """One episode's replay rows: ``name`` for messages (``episode_000003.npz``), ``rows`` key -> ``(T, ...)``."""

    name: str
    rows: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.rows["reward"])


@dataclass
class Dataset:
    """Validated episodes, in fill order, for :func:`reverie.data.fill.fill_replay`; ``source``: a path or
    ``minari:<id>``."""

    source: str
    episodes: list[Episode]

    @property
    def steps(self) -> int:
        """Rows over all episodes."""
        return sum(len(e) for e in self.episodes)

    def returns(self) -> list[float]:
        """Each episode's sum of rewards (float64)."""
        return [float(np.sum(e.rows["reward"], dtype=np.float64)) for e in self.episodes]

    def describe(self) -> str:
        """The line ``record``, ``pretrain`` and ``init_from`` print: ``30 episodes (29 finished), 743 steps, mean
        return 24.8`` (finished: the last row has ``is_last``)."""
        finished = sum(bool(np.asarray(e.rows["is_last"])[-1]) for e in self.episodes if len(e))
        returns = self.returns()
        mean = f", mean return {sum(returns) / len(returns):.1f}" if returns else ""
        return f"{len(self.episodes)} episodes ({finished} finished), {self.steps} steps{mean}"


def fail(episode: str, key: str | None, problem: str) -> DatasetError:
    """The error for ``problem`` with ``key`` of ``episode`` (``key`` None: the episode as a whole)."""
    where = f"episode {episode!r}" + (f", key {key!r}" if key else "")
    return DatasetError(f"dataset error: {where}: {problem}")


def validate(episodes: Sequence[Episode], spec: Spec, discrete: bool, env: str = "the env config") -> list[Episode]:
    """Check every episode against the replay ``spec`` (:meth:`reverie.replay.Replay.spec_for`) and return copies
    in canonical dtypes: observations as the spec, ``action`` ``(T, A)`` float32 (indices become one-hot rows when
    ``discrete``), ``reward`` float32, flags bool. ``env`` names the env config in messages.

    Raises DatasetError (naming the episode, key and row): no episodes, a missing key, unequal lengths, an empty
    episode, a wrong shape or dtype, NaN or infinity, actions outside the space, or flags that are not booleans,
    ``is_first`` other than at row 0 or ``is_last`` before the last row."""
    if not episodes:
        raise DatasetError("dataset error: the dataset holds no episodes")
    return [_validate_one(e, spec, discrete, env) for e in episodes]


def _validate_one(episode: Episode, spec: Spec, discrete: bool, env: str) -> Episode:
    name, rows = episode.name, episode.rows
    missing = [k for k in spec if k not in rows]
    if missing:
        raise fail(name, missing[0], f"missing (every episode needs {', '.join(spec)}; it has "
                                     f"{', '.join(sorted(rows)) or 'nothing'})")
    lengths = {k: len(np.asarray(rows[k])) if np.ndim(rows[k]) else 0 for k in spec}
    if len(set(lengths.values())) > 1:
        counts = list(lengths.values())
        common = max(set(counts), key=counts.count)  # the length most keys have
        other = next(k for k in spec if lengths[k] != common)
        raise fail(name, other, f"has {lengths[other]} rows but the episode has {common} steps; every key needs one "
                                f"row per step ({', '.join(f'{k} {n}' for k, n in lengths.items())})")
    if lengths["reward"] == 0:
        raise fail(name, None, "has no rows")
    out = {k: _observation(name, k, np.asarray(rows[k]), *spec[k], env) for k in spec if k not in STEP_KEYS}
    out["reward"] = _finite(name, "reward", _shaped(name, "reward", np.asarray(rows["reward"]), ()), np.float32)
    for key in FLAG_KEYS:
        out[key] = _flag(name, key, np.asarray(rows[key]))
    _check_flags(name, out)
    out["action"] = _action(name, np.asarray(rows["action"]), spec["action"][0][0], discrete, out["is_last"], env)
    return Episode(name, out)


def _shaped(name: str, key: str, value: np.ndarray, shape: tuple[int, ...], env: str = "") -> np.ndarray:
    if value.shape[1:] != tuple(shape):
        where = f"the observation space of {env} has" if env else "the format needs"
        raise fail(name, key, f"has rows of shape {value.shape[1:]}, but {where} {tuple(shape)}")
    return value


def _finite(name: str, key: str, value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``value`` cast to ``dtype`` after checking it is numeric and has no NaN or infinity (naming the first row)."""
    if not (np.issubdtype(value.dtype, np.number) or value.dtype == bool):
        raise fail(name, key, f"has dtype {value.dtype}, not a number")
    if np.issubdtype(value.dtype, np.floating):
        bad = ~np.isfinite(value.reshape(len(value), -1)).all(axis=1)  # (T, ...) -> (T,)
        if bad.any():
            row = int(np.argmax(bad))
            what = "NaN" if np.isnan(value[row]).any() else "an infinite value"
            raise fail(name, key, f"holds {what} at row {row}; drop or repair the episode")
    return value.astype(dtype, copy=False)


def _observation(name: str, key: str, value: np.ndarray, shape: tuple[int, ...], dtype: np.dtype,
                 env: str) -> np.ndarray:
    value = _shaped(name, key, value, shape, env)
    if is_image_key(tuple(shape), dtype) and value.dtype != np.uint8:
        raise fail(name, key, f"is an image key, so its pixels must be uint8 (0-255, shape (3, H, W)), got "
                              f"{value.dtype}")
    return _finite(name, key, value, dtype)


def _flag(name: str, key: str, value: np.ndarray) -> np.ndarray:
    _shaped(name, key, value, ())
    if value.dtype != bool:
        if not np.issubdtype(value.dtype, np.number) or not np.isin(value, (0, 1)).all():
            raise fail(name, key, f"must hold booleans (or 0/1), got dtype {value.dtype}")
    return value.astype(bool)


def _check_flags(name: str, rows: dict[str, np.ndarray]) -> None:
    if not rows["is_first"][0]:
        raise fail(name, "is_first", "row 0 must be True: an episode starts with its reset observation (reward 0)")
    if rows["is_first"][1:].any():
        row = 1 + int(np.argmax(rows["is_first"][1:]))
        raise fail(name, "is_first", f"is True at row {row}: only row 0 starts an episode; split the file there")
    if rows["is_last"][:-1].any():
        row = int(np.argmax(rows["is_last"][:-1]))
        raise fail(name, "is_last", f"is True at row {row}, before the last row {len(rows['is_last']) - 1}: an "
                                    f"episode ends at its last row; split the file there")


def _action(name: str, value: np.ndarray, dim: int, discrete: bool, is_last: np.ndarray, env: str) -> np.ndarray:
    """``(T, A)`` float32 actions checked against the space; an ``is_last`` row may be all zeros (never used)."""
    if discrete and value.ndim == 1 and np.issubdtype(value.dtype, np.integer):  # indices (T,) -> one-hot (T, A)
        bad = (value < 0) | (value >= dim)
        if bad.any():
            row = int(np.argmax(bad))
            raise fail(name, "action", f"row {row} is index {value[row]}, outside Discrete({dim}) of {env} "
                                       f"(indices 0..{dim - 1})")
        return np.eye(dim, dtype=np.float32)[value]
    value = _finite(name, "action", _shaped(name, "action", value, (dim,)), np.float32)
    zero_last = is_last & (value == 0).all(axis=1)  # (T,)
    if discrete:
        one_hot = np.isin(value, (0.0, 1.0)).all(axis=1) & (value.sum(axis=1) == 1)  # (T,)
        bad = ~(one_hot | zero_last)
        if bad.any():
            row = int(np.argmax(bad))
            raise fail(name, "action", f"row {row} is {value[row].tolist()}, not a one-hot action of Discrete({dim}) "
                                       f"of {env} (or store indices (T,) as integers)")
        return value
    bad = (np.abs(value) > 1.0).any(axis=1)  # (T,)
    if bad.any():
        row = int(np.argmax(bad))
        raise fail(name, "action", f"row {row} is {value[row].tolist()}, outside the action space Box(-1, 1, "
                                   f"({dim},)) of {env}: reverie stores Box actions rescaled to [-1, 1] (the env's "
                                   f"low -> -1, high -> 1)")
    return value
