"""Checkpoints: what a run needs to act again (and, with issue 6, to continue exactly).

A checkpoint is one ``torch.save`` file written atomically (temporary file, fsync, rename) under
``<run_dir>/checkpoints/ckpt_<env_step>.pt``; the newest ``keep`` are kept.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

CKPT_PATTERN = re.compile(r"ckpt_(\d+)\.pt$")


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 3) -> Path:
    """Write ``payload`` to ``directory/ckpt_<step>.pt`` atomically and drop all but the newest ``keep``.

    Returns:
        The path written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{step:010d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Checkpoint files in ``directory``, oldest first (by the step in their name)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := CKPT_PATTERN.search(p.name))]
    return [p for _, p in sorted(found)]


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a run directory, its ``checkpoints/`` folder or a checkpoint file to the newest checkpoint file.

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint there.
    """
    path = Path(path)
    if path.is_file():
        return path
    for folder in (path / "checkpoints", path):
        found = list_checkpoints(folder)
        if found:
            return found[-1]
    raise FileNotFoundError(f"no checkpoint (checkpoints/ckpt_*.pt) found under {path}; pass a run directory "
                            f"written by `reverie train` or a checkpoint file")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load the newest checkpoint under ``path`` (see :func:`find_checkpoint`)."""
    return torch.load(find_checkpoint(path), map_location=map_location, weights_only=False)
