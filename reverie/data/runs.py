"""Another run's replay as a dataset: the rows of its newest checkpoint's replay snapshot, cut into episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reverie.data.episodes import DatasetError, Episode
from reverie.state.checkpoint import list_checkpoints, load_checkpoint


def is_run(path: str | Path) -> bool:
    """True for a run directory with checkpoints (or a checkpoint file)."""
    path = Path(path)
    return (path.is_file() and path.suffix == ".pt") or bool(list_checkpoints(path / "checkpoints"))


def read_run(path: str | Path) -> list[Episode]:
    """The replay of a run's newest readable checkpoint (rank 0's shard) as episodes: each env column in time order,
    cut before every ``is_first`` row. A column's first piece may start mid-episode (overwritten, or filled from a
    dataset) and gets ``is_first`` at row 0, as the 2023 reference marks every replayed window; the last piece may
    lack ``is_last``. DatasetError: the checkpoint has no replay snapshot."""
    from reverie.replay import Replay, is_latent_key

    path = Path(path)
    payload = load_checkpoint(path)
    if "replay_dir" not in payload:
        raise DatasetError(f"dataset error: the checkpoint {payload['checkpoint_path']} holds no replay snapshot; pass "
                           f"a run directory written by `reverie train` or `reverie pretrain`, or (init_from) set "
                           f"init.keep_data=false to start from its weights alone (e.g. an imported official "
                           f"checkpoint)")
    folder = Path(payload["replay_dir"])
    meta = Replay.verify(folder)
    # the replay context's stored latents are training state, not data: a dataset's rows have none
    arrays = {key: np.load(folder / f"{key}.npy", mmap_mode="r") for key in meta["keys"]
              if not is_latent_key(key)}  # (L, N, ...)
    fill, length = int(meta["fill"]), int(meta["length"])
    order = (np.arange(fill) + (int(meta["cursor"]) if meta["wrapped"] else 0)) % length  # oldest row first
    episodes = []
    for col in range(int(meta["num_envs"])):
        rows = {key: np.asarray(array[order, col]) for key, array in arrays.items()}  # (fill, ...)
        cuts = sorted({0, *np.flatnonzero(rows["is_first"]).tolist()})
        for start, stop in zip(cuts, [*cuts[1:], fill]):
            piece = {key: value[start:stop].copy() for key, value in rows.items()}
            piece["is_first"][0] = True
            episodes.append(Episode(f"{path.name} column {col} rows {start}-{stop - 1}", piece))
    return episodes
