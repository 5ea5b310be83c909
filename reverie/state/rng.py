"""Every random stream of a run (python, numpy, torch CPU/CUDA, the loop's generator): seed, capture, restore.

Checkpoints hold :func:`rng_state` so a resumed run draws exactly what it would have drawn (issue "runs that
survive"); :func:`preserved_rng` keeps evaluation and videos from moving the training streams.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from the run seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Every global random stream (python, numpy, torch CPU and CUDA) plus ``rng``'s, for a checkpoint."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if rng is not None:
        state["generator"] = rng.bit_generator.state
    return state


def set_rng_state(state: dict[str, Any], rng: np.random.Generator | None = None) -> None:
    """Restore what :func:`rng_state` captured (CUDA streams only when the device count matches)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    if rng is not None and "generator" in state:
        rng.bit_generator.state = state["generator"]


@contextlib.contextmanager
def preserved_rng():
    """Run a block (evaluation, videos) without moving the training random streams, so eval cadence (a safe
    resume change) never changes what training does."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
