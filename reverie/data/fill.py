"""Fill an empty replay with a dataset's episodes, split over its ``N`` env columns."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reverie.data.episodes import DatasetError, Episode


def column_rows(steps: int, capacity: int, num_envs: int) -> int:
    """Rows per env column, ``steps // N``; DatasetError below ``N`` rows or above the replay's rows per column."""
    per_column, rows = steps // num_envs, capacity // num_envs
    if per_column < 1:
        raise DatasetError(f"dataset error: {steps} steps cannot fill {num_envs} env columns (env.num_envs); record "
                           f"more episodes")
    if per_column > rows:
        raise DatasetError(f"dataset error: the dataset has {steps:,} steps but replay.capacity={capacity:,} holds "
                           f"{rows:,} rows per env column ({num_envs} columns): set replay.capacity >= "
                           f"{per_column * num_envs:,}")
    return per_column


def fill_replay(replay, episodes: Sequence[Episode]) -> dict[str, int]:
    """Write validated episodes into an empty ``replay``: joined in order, cut into ``N`` pieces of ``steps // N`` rows,
    one per env column (the last ``steps mod N`` left out), each column starting with ``is_first`` (docs/offline.md).
    Returns ``{"rows_per_column", "steps", "left_out"}``. DatasetError: a non-empty replay or a dataset too large;
    ValueError: rows that do not match the replay's spec."""
    if len(replay):
        raise DatasetError(f"dataset error: the replay already holds {len(replay)} steps; a dataset fills an empty one")
    n = replay.num_envs
    steps = sum(len(e) for e in episodes)
    per_column = column_rows(steps, replay.capacity, n)
    used = per_column * n
    block = {}
    for key in replay.spec:
        if key in replay.optional and not all(key in e.rows for e in episodes):
            continue  # e.g. the replay context's latents: a dataset's rows have none (zeros, Replay.extend)
        stream = np.concatenate([e.rows[key] for e in episodes])[:used]  # (steps, ...) -> (N*K, ...)
        block[key] = stream.reshape(n, per_column, *stream.shape[1:]).swapaxes(0, 1)  # (N*K, ...) -> (K, N, ...)
    block["is_first"][0] = True  # every column starts a stream
    replay.extend(block)
    return {"rows_per_column": per_column, "steps": used, "left_out": steps - used}
