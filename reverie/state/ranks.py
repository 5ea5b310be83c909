"""Checkpoints of a data-parallel run: each rank's own state, rank 0's agent (docs/resume.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from reverie.runtime.collectives import broadcast_int, param_digest
from reverie.state.checkpoint import list_checkpoints, load_checkpoint
from reverie.runtime.process_group import DistInfo

def checkpoint_dir(run_dir: str | Path, info: DistInfo) -> Path:
    """Where this rank's checkpoints go: ``run_dir/checkpoints`` for rank 0 (the run's checkpoint, with the agent,
    what ``reverie eval`` and ``load_run`` read), ``run_dir/rank<r>/checkpoints`` for the other ranks (their
    replay, RNG, env and loop state; the agent is rank 0's)."""
    run_dir = Path(run_dir)
    return run_dir / "checkpoints" if info.is_main else run_dir / f"rank{info.rank}" / "checkpoints"


def load_rank_checkpoint(run_dir: str | Path, info: DistInfo) -> dict[str, Any] | None:
    """This rank's checkpoint to resume from, or None for a fresh run; every rank resumes the same env step.

    Rank 0 takes its newest readable checkpoint (:func:`reverie.state.checkpoint.load_checkpoint`) and tells the others
    its env step; rank ``r`` loads its own checkpoint of that step and rank 0's agent of that step (the replicas
    are identical; the digest stored by rank ``r`` is checked against it with :func:`check_digest`).

    Raises:
        RuntimeError: rank 0 has a checkpoint at a step for which rank ``r`` has none (its files were removed or
            the run was started with fewer processes); the message names the file and the fix.
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
    """Raise unless ``module``'s :func:`param_digest` equals ``expected`` (None: nothing to check).

    Raises:
        RuntimeError: the replica this rank saved differs from rank 0's agent of the same step.
    """
    if expected is not None and param_digest(module) != expected:
        raise RuntimeError(f"rank {info.rank}: its saved agent digest differs from rank 0's checkpoint of the same "
                           f"step; the replicas had diverged before that checkpoint, so it cannot be resumed exactly")

