"""Crash-safe checkpoints: everything a run needs to continue exactly (issue 6).

Layout under ``<run_dir>/checkpoints/``::

    ckpt_<env_step>.pt        one torch.save payload: agent state, counters, RNG states, config, ... (small)
    ckpt_<env_step>.replay/   the replay at that step: one <key>.npy per key + replay.json (Replay.save)

Writes are atomic: the replay snapshot goes to ``.replay.tmp/`` and is renamed, then the payload goes to
``.pt.tmp``, is fsync'ed and renamed; the ``.pt`` file is the commit marker, so a run killed mid-write leaves
the previous checkpoint intact. The newest ``keep`` checkpoints are kept (with their replay snapshots).
Loading a run directory tries the newest checkpoint first and falls back, with a warning, to the previous
one when a file is truncated or unreadable or its replay snapshot is incomplete.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from reverie.replay.buffer import fsync_path

CKPT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
REPLAY_SUFFIX = ".replay"


def replay_dir_for(checkpoint: str | Path) -> Path:
    """The replay snapshot folder of a checkpoint file: ``ckpt_<step>.pt`` -> ``ckpt_<step>.replay``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + REPLAY_SUFFIX)


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 3,
                    replay: Any = None) -> Path:
    """Write ``payload`` (and ``replay``'s snapshot) as checkpoint ``step``, atomically; keep the newest ``keep``.

    Args:
        directory: the run's ``checkpoints/`` folder (created if missing).
        step: env step, used in the file name (``ckpt_<step:010d>.pt``); saving a step again replaces it.
        payload: picklable state (tensors, numpy arrays, plain Python).
        keep: checkpoints kept (>= 1; older ones and their replay snapshots are deleted).
        replay: an object with ``save(directory) -> dict`` (:class:`reverie.replay.Replay`), or None. Its
            metadata is stored in the payload as ``"replay_meta"``.

    Returns:
        The path of the ``.pt`` file written.

    Raises:
        ValueError: ``keep`` < 1.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (checkpoints kept), got {keep}: set train.checkpoint_keep >= 1")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{step:010d}.pt"
    payload = dict(payload)
    if replay is not None:
        final = replay_dir_for(path)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        payload["replay_meta"] = replay.save(tmp)
        fsync_path(tmp)
        if final.exists():  # the same step saved again (e.g. a periodic and the final checkpoint)
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
        shutil.rmtree(replay_dir_for(old), ignore_errors=True)
    kept = {replay_dir_for(p).name for p in list_checkpoints(directory)}
    for stale in directory.glob(f"ckpt_*{REPLAY_SUFFIX}*"):  # leftovers of interrupted writes or removed steps
        if stale.name not in kept and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return path


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Checkpoint files in ``directory``, oldest first (by the step in their name)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := CKPT_PATTERN.search(p.name))]
    return [p for _, p in sorted(found)]


def _candidates(path: str | Path) -> list[Path]:
    """Checkpoint files for ``path``, newest first: the file itself, or those of a run dir / checkpoints dir."""
    path = Path(path)
    if path.is_file():
        return [path]
    for folder in (path / "checkpoints", path):
        found = list_checkpoints(folder)
        if found:
            return found[::-1]
    raise FileNotFoundError(f"no checkpoint (checkpoints/ckpt_*.pt) found under {path}; pass a run directory "
                            f"written by `reverie train` or a checkpoint file")


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a run directory, its ``checkpoints/`` folder or a checkpoint file to the newest checkpoint file
    (without checking that it is readable; :func:`load_checkpoint` does).

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint there.
    """
    return _candidates(path)[0]


def _verify_replay(checkpoint: Path, payload: dict) -> None:
    if "replay_meta" not in payload:
        return
    from reverie.replay import Replay  # local: the checkpoint module stays importable without replay code

    Replay.verify(replay_dir_for(checkpoint))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load the newest readable checkpoint under ``path`` (see :func:`find_checkpoint`).

    A checkpoint that cannot be read (truncated or corrupt ``.pt``, missing or partial replay snapshot) is
    skipped with a ``UserWarning`` naming it and the reason, and the previous one is tried.

    Returns:
        The payload, plus ``"checkpoint_path"`` (the ``.pt`` used) and, when it has a replay snapshot,
        ``"replay_dir"`` (its folder, for :meth:`reverie.replay.Replay.load`).

    Raises:
        FileNotFoundError: no checkpoint under ``path``.
        RuntimeError: checkpoints exist but none is readable (the reasons are listed).
    """
    errors = []
    for candidate in _candidates(path):
        try:
            payload = torch.load(candidate, map_location=map_location, weights_only=False)
            if not isinstance(payload, dict):
                raise ValueError(f"holds a {type(payload).__name__}, not a checkpoint dict")
            _verify_replay(candidate, payload)
        except Exception as err:  # noqa: BLE001 - any failure to read means: use the previous checkpoint
            errors.append(f"{candidate.name}: {type(err).__name__}: {err}")
            warnings.warn(f"checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); trying the "
                          f"previous one", stacklevel=2)
            continue
        payload["checkpoint_path"] = str(candidate)
        if "replay_meta" in payload:
            payload["replay_dir"] = str(replay_dir_for(candidate))
        return payload
    raise RuntimeError(f"no readable checkpoint under {path}:\n  " + "\n  ".join(errors))
