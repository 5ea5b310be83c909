"""Crash-safe checkpoints: everything a run needs to continue exactly (issue 6; docs/resume.md).

Layout under ``<run_dir>/checkpoints/``: ``ckpt_<env_step>.pt`` (one torch.save payload: agent state, counters, RNG
states, config, ...), ``ckpt_<env_step>.replay/`` (the replay snapshot, :meth:`reverie.replay.Replay.save`) and
``best.pt`` (weights at the best evaluation). Writes are atomic, the ``.pt`` rename being the commit marker; the
newest ``keep`` readable checkpoints are kept (issue 20) and loading falls back from an unreadable one.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from reverie.replay.files import fsync_path

CKPT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
REPLAY_SUFFIX = ".replay"
BEST_FILE = "best.pt"  # the weights of the best evaluation so far (save_best)

#: What this process learnt about checkpoint files: ``(path, size, mtime_ns) -> None`` (readable) or the reason it
#: is not. Files this process wrote or loaded are not read again to prune, and an unreadable one is warned about once.
_READABLE: dict[tuple[str, int, int], str | None] = {}


def replay_dir_for(checkpoint: str | Path) -> Path:
    """The replay snapshot folder of a checkpoint file: ``ckpt_<step>.pt`` -> ``ckpt_<step>.replay``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + REPLAY_SUFFIX)


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 3,
                    replay: Any = None) -> Path:
    """Write ``payload`` (and ``replay``'s snapshot) as checkpoint ``step``, atomically; keep the newest ``keep``.

    ``directory`` is the run's ``checkpoints/`` (created if missing); the file is ``ckpt_<step:010d>.pt`` (saving a
    step again replaces it); ``replay`` has ``save(directory) -> dict``, stored as ``payload["replay_meta"]``.
    Returns the ``.pt`` path. Raises ValueError when ``keep`` < 1.
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
    _atomic_save(payload, path)
    _READABLE[_file_key(path)] = None
    _prune(directory, keep)
    kept = {replay_dir_for(p).name for p in list_checkpoints(directory)}
    for stale in directory.glob(f"ckpt_*{REPLAY_SUFFIX}*"):  # leftovers of interrupted writes or removed steps
        if stale.name not in kept and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return path


def _atomic_save(payload: dict[str, Any], path: Path) -> None:
    """``torch.save`` to ``<path>.tmp``, fsync, rename onto ``path``, fsync the folder."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def save_best(directory: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (weights, config, step and evaluation return) as ``best.pt`` in ``directory``, atomically.
    Not resumable (no optimiser, replay or RNG state) and never pruned; ``load_run(checkpoint="best")`` reads it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / BEST_FILE
    _atomic_save(payload, path)
    return path


def _prune(directory: Path, keep: int) -> None:
    """Keep the newest ``keep`` readable checkpoints; remove older ones and every unreadable one (with a note)."""
    readable = 0
    for candidate in reversed(list_checkpoints(directory)):  # newest first
        reason = None if readable >= keep else unreadable_reason(candidate)
        if reason is None and readable < keep:
            readable += 1
            continue
        if reason is not None:
            print(f"[reverie] removing unreadable checkpoint {candidate} ({reason}); kept the newest {keep} readable")
        candidate.unlink(missing_ok=True)
        shutil.rmtree(replay_dir_for(candidate), ignore_errors=True)


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _read(candidate: Path, map_location: str | torch.device) -> dict[str, Any]:
    """Load one checkpoint file and check its replay snapshot; any failure raises."""
    payload = torch.load(candidate, map_location=map_location, weights_only=False)
    if not isinstance(payload, dict):
        raise ValueError(f"holds a {type(payload).__name__}, not a checkpoint dict")
    _verify_replay(candidate, payload)
    return payload


def unreadable_reason(path: str | Path) -> str | None:
    """None when the checkpoint ``path`` loads (its ``.pt`` and its replay snapshot), else why not. Remembered per
    file (path, size, modification time) for this process, so each file is read at most once here."""
    path = Path(path)
    try:
        key = _file_key(path)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    if key not in _READABLE:
        try:
            _read(path, "cpu")
            _READABLE[key] = None
        except Exception as err:  # noqa: BLE001 - any failure to read means unreadable
            _READABLE[key] = f"{type(err).__name__}: {err}"
    return _READABLE[key]


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
    """The newest checkpoint file of a run directory, its ``checkpoints/`` folder or a checkpoint file (not checked
    for readability); FileNotFoundError when there is none."""
    return _candidates(path)[0]


def _verify_replay(checkpoint: Path, payload: dict) -> None:
    if "replay_meta" not in payload:
        return
    from reverie.replay import Replay  # local: the checkpoint module stays importable without replay code

    Replay.verify(replay_dir_for(checkpoint))


class _Known(Exception):
    """A checkpoint this process already found unreadable (and warned about)."""


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load the newest readable checkpoint under ``path`` (see :func:`find_checkpoint`).

    An unreadable one (truncated or corrupt ``.pt``, missing or partial replay snapshot) is skipped with a
    ``UserWarning`` (once per file and process) and the previous one tried. Returns the payload plus
    ``"checkpoint_path"`` and, with a replay snapshot, ``"replay_dir"``. Raises FileNotFoundError (no checkpoint)
    and RuntimeError (none readable; the reasons are listed).
    """
    errors = []
    for candidate in _candidates(path):
        key = _file_key(candidate)
        known = _READABLE.get(key)
        try:
            if known is not None:  # found unreadable before by this process: warned then
                raise _Known(known)
            payload = _read(candidate, map_location)
        except Exception as err:  # noqa: BLE001 - any failure to read means: use the previous checkpoint
            reason = str(err) if isinstance(err, _Known) else f"{type(err).__name__}: {err}"
            errors.append(f"{candidate.name}: {reason}")
            if not isinstance(err, _Known):
                _READABLE[key] = reason
                warnings.warn(f"checkpoint {candidate} is unreadable ({reason}); trying the previous one",
                              stacklevel=2)
            continue
        _READABLE[key] = None
        payload["checkpoint_path"] = str(candidate)
        if "replay_meta" in payload:
            payload["replay_dir"] = str(replay_dir_for(candidate))
        return payload
    raise RuntimeError(f"no readable checkpoint under {path}:\n  " + "\n  ".join(errors))
