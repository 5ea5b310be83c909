"""Checkpoints of a data-parallel run: each rank's own state, rank 0's agent (docs/resume.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from reverie.runtime.collectives import broadcast_int, param_digest
from reverie.state.checkpoint import list_checkpoints, load_checkpoint
from reverie.runtime.process_group import DistInfo

def checkpoint_dir(run_dir: str | Path, info: DistInfo) -> Path:
    """Where this rank's checkpoints go: ``run_dir/checkpoints`` for rank 0 (with the agent: what ``reverie eval``
    reads), ``run_dir/rank<r>/checkpoints`` for the others (replay, RNG, env and loop state only)."""
    run_dir = Path(run_dir)
    return run_dir / "checkpoints" if info.is_main else run_dir / f"rank{info.rank}" / "checkpoints"


def load_rank_checkpoint(run_dir: str | Path, info: DistInfo) -> dict[str, Any] | None:
    """This rank's checkpoint to resume from, or None for a fresh run; every rank resumes rank 0's env step.

    Rank ``r`` loads its own checkpoint of that step with rank 0's agent (identical replicas, checked with
    :func:`check_digest`). Raises RuntimeError when rank ``r`` has no checkpoint of that step.
    """
    run_dir = Path(run_dir)
    if not info.distributed:
        return load_checkpoint(run_dir) if list_checkpoints(run_dir / "checkpoints") else None
    saved = None
    if info.is_main and list_checkpoints(run_dir / "checkpoints"):
        saved = load_checkpoint(run_dir)
    step = broadcast_int(-1 if saved is None else int(saved["counters"]["env_steps"]), info)
    if step < 0 or info.is_main:
        return saved
    mine = checkpoint_dir(run_dir, info) / f"ckpt_{step:010d}.pt"
    if not mine.is_file():
        raise RuntimeError(f"rank {info.rank}: rank 0 resumes from env step {step}, but {mine} is missing; every "
                           f"rank needs its own checkpoint of that step (resume with the run's trainer.nproc, and "
                           f"keep the rank<r>/ folders), or start a new run in another run_dir")
    saved = load_checkpoint(mine)
    saved["agent"] = load_checkpoint(run_dir / "checkpoints" / mine.name)["agent"]
    return saved


def check_digest(module: nn.Module, expected: str | None, info: DistInfo) -> None:
    """Raise RuntimeError unless ``module``'s :func:`param_digest` equals ``expected`` (None: nothing to check)."""
    if expected is not None and param_digest(module) != expected:
        raise RuntimeError(f"rank {info.rank}: its saved agent digest differs from rank 0's checkpoint of the same "
                           f"step; the replicas had diverged before that checkpoint, so it cannot be resumed exactly")

