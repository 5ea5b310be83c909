"""The npz folder format: one ``episode_<n>.npz`` per episode, ``np.savez`` of its replay rows
(:mod:`reverie.data.episodes`; docs/offline.md). Files are read in name order; other files are ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from reverie.data.episodes import Episode, fail

PATTERN = re.compile(r"^episode_(\d+)\.npz$")


def is_npz_folder(path: str | Path) -> bool:
    """True for a folder holding at least one ``.npz`` file."""
    path = Path(path)
    return path.is_dir() and any(path.glob("*.npz"))


def read_npz(folder: str | Path) -> list[Episode]:
    """Every ``*.npz`` file of ``folder`` (name order) as an :class:`Episode` named by its file; DatasetError for a
    file that is not a readable npz archive."""
    episodes = []
    for path in sorted(Path(folder).glob("*.npz")):
        try:
            with np.load(path, allow_pickle=False) as archive:
                rows = {key: archive[key] for key in archive.files}
        except Exception as err:  # noqa: BLE001 - a damaged or foreign file: name it
            raise fail(path.name, None, f"is not a readable .npz archive ({type(err).__name__}: {err}). Drop the "
                       f"file ({path}; the other episodes load without it) or record it again into that folder "
                       f"(`reverie record --out {path.parent} ...` adds episodes)") from err
        episodes.append(Episode(path.name, rows))
    return episodes


def next_index(folder: str | Path) -> int:
    """The number the next ``episode_<n>.npz`` in ``folder`` gets: one past the highest there (0 when none)."""
    found = [int(m.group(1)) for p in Path(folder).glob("episode_*.npz") if (m := PATTERN.match(p.name))]
    return max(found, default=-1) + 1


def write_npz(folder: str | Path, episodes: Iterable[Episode]) -> list[Path]:
    """Write each episode to ``folder/episode_<n>.npz`` (compressed; numbered after the files there, so recordings
    append; written whole, then renamed into place). Returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index, written = next_index(folder), []
    for episode in episodes:
        path = folder / f"episode_{index:06d}.npz"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **episode.rows)
        os.replace(tmp, path)
        written.append(path)
        index += 1
    return written
