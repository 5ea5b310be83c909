"""Start-up check that a run fits: replay bytes (uint8 images) and model memory against RAM and disk (issue 6).

Estimates replay (``capacity`` x bytes per step, in RAM for ``replay.storage=memory``, on disk for ``memmap``),
model (parameters and buffers x 4; activations not counted, so a lower bound) and checkpoints
(``train.checkpoint_keep`` x (held replay rows, issue 20, + saved model + envs, issue 27)); a run that exceeds
``MemAvailable`` or the free disk is refused with the numbers and the fix (docs/resume.md, "Preflight").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

GIB = 1 << 30


class PreflightError(ValueError):
    """The run cannot fit in RAM or on disk; the message gives the estimate, what is available and the fix."""


def step_bytes(spec: Mapping[str, tuple[tuple[int, ...], Any]]) -> int:
    """Bytes one env step takes in replay for a ``Replay`` spec (``{key: (shape, dtype)}``)."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in spec.values())


def model_bytes(agent: Any) -> int:
    """Parameters and buffers of ``agent`` (an ``nn.Module``) x 4: values, gradients, two Adam moments."""
    params = getattr(agent, "parameters", None)
    if params is None:
        return 0
    total = sum(p.numel() * p.element_size() for p in agent.parameters())
    total += sum(b.numel() * b.element_size() for b in agent.buffers())
    return 4 * total


def saved_model_bytes(agent: Any) -> int:
    """Bytes ``agent.state_dict()`` holds once trained: parameters and buffers once, plus two optimiser moments
    (Adam's, LaProp's) per trainable parameter; the slow critic's copies count once."""
    params = getattr(agent, "parameters", None)
    if params is None:
        return 0
    values = sum(p.numel() * p.element_size() for p in agent.parameters())
    values += sum(b.numel() * b.element_size() for b in agent.buffers())
    return values + 2 * sum(p.numel() * p.element_size() for p in agent.parameters() if p.requires_grad)


def available_ram() -> int:
    """Bytes of memory available to a new process (``MemAvailable`` of /proc/meminfo; sysconf elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_disk(path: str | os.PathLike) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def held_steps(capacity: int, num_envs: int, steps: int | None) -> int:
    """The most env steps the replay holds during a run of ``steps`` env steps: ``min(L, ceil(steps / N)) x N``
    with ``L = capacity // N`` rows per env (``steps`` None: the capacity)."""
    n = max(int(num_envs), 1)
    rows = int(capacity) // n
    if steps is not None:
        rows = min(rows, -(-int(steps) // n))
    return rows * n


STEPS_BOUND = "min(replay.capacity, train.steps)"
"""Where the replay's most rows come from in an online run; a dataset-filled replay is bounded by its capacity."""


def preflight(spec: Mapping[str, tuple[tuple[int, ...], Any]], capacity: int, agent: Any, storage: str,
              replay_dir: str | os.PathLike, checkpoint_dir: str | os.PathLike, keep: int,
              ram: int | None = None, disk: int | None = None, steps: int | None = None,
              num_envs: int = 1, bound: str = STEPS_BOUND, env_bytes: int = 0) -> dict[str, int]:
    """Estimate the run's memory and disk needs and refuse a run that cannot fit.

    ``spec`` is ``Replay.spec_for``'s, ``capacity`` replay steps over all envs, ``storage`` ``"memory"`` or
    ``"memmap"``; ``ram``/``disk`` are measured when None. A checkpoint holds at most :func:`held_steps` of ``steps``
    (``bound`` names that limit in messages) plus ``env_bytes`` (envs' state, observation rows, random states,
    config; measured by the caller). Returns the byte counts (``replay_bytes``, ``held_bytes``, ``model_bytes``,
    ``saved_model_bytes``, ``checkpoint_bytes``, ``ram_needed``, ``disk_free``, ...). Raises PreflightError when RAM
    or disk is too small, suggesting ``replay.storage=memmap`` or a smaller ``replay.capacity``/``checkpoint_keep``.
    """
    per_step = step_bytes(spec)
    replay = int(capacity) * per_step
    held_n = held_steps(capacity, num_envs, steps)
    held = held_n * per_step
    model = model_bytes(agent)
    saved_model = saved_model_bytes(agent)
    env_bytes = int(env_bytes)
    ram_needed = model + (replay if storage == "memory" else 0)
    ram_available = available_ram() if ram is None else int(ram)
    checkpoint = held + saved_model + env_bytes
    disk_needed = checkpoint * int(keep) + (held if storage == "memmap" else 0)
    same_fs = _device(replay_dir) == _device(checkpoint_dir)
    disk_free = (free_disk(checkpoint_dir) if disk is None else int(disk))
    report = {"replay_bytes": replay, "held_bytes": held, "held_steps": held_n, "model_bytes": model,
              "saved_model_bytes": saved_model, "env_bytes": env_bytes, "checkpoint_bytes": checkpoint,
              "keep": int(keep), "ram_needed": ram_needed,
              "ram_available": ram_available, "disk_needed": disk_needed, "disk_free": disk_free}
    what = (f"replay {replay / GIB:.2f} GiB ({capacity:,} steps x {per_step:,} bytes) + model ~{model / GIB:.2f} "
            f"GiB (parameters, gradients, Adam moments)")
    if ram_needed > ram_available:
        fits = max(0, (ram_available - model) // max(per_step, 1))
        raise PreflightError(
            f"preflight: this run needs about {ram_needed / GIB:.2f} GiB of RAM ({what}) but only "
            f"{ram_available / GIB:.2f} GiB is available. Keep the replay on disk with replay.storage=memmap, "
            f"or lower replay.capacity (about {fits:,} steps fit). replay.preflight=false skips this check.")
    if disk_needed > disk_free:
        where = checkpoint_dir if same_fs else f"{checkpoint_dir} (checkpoints) and {replay_dir} (replay)"
        per_held = per_step * (int(keep) + (storage == "memmap"))
        fits = max(0, (disk_free - (saved_model + env_bytes) * int(keep)) // max(per_held, 1))
        raise PreflightError(
            f"preflight: this run needs about {disk_needed / GIB:.2f} GiB of disk under {where}: "
            f"{describe(report, bound)}"
            f"{' + the live memmap files' if storage == 'memmap' else ''}; only {disk_free / GIB:.2f} GiB is free. "
            f"Lower replay.capacity (about {fits:,} steps fit) or train.checkpoint_keep, or free disk space. "
            f"replay.preflight=false skips this check.")
    return report


def size_text(nbytes: float) -> str:
    """``"1.21 GiB"`` from 1 GiB up, else ``"12.3 MiB"``."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.1f} MiB"


def describe(report: Mapping[str, int], bound: str = STEPS_BOUND) -> str:
    """The checkpoint cost in words: ``"checkpoints up to 1.21 GiB each (replay of at most 100,000 steps ...)"``;
    ``bound`` names where the held steps come from (``"replay.capacity"`` when a dataset fills the replay)."""
    per_step = report["held_bytes"] // max(report["held_steps"], 1)
    return (f"checkpoints up to {size_text(report['checkpoint_bytes'])} each (replay of at most "
            f"{report['held_steps']:,} steps = {bound} x {per_step:,} bytes, "
            f"{size_text(report['held_bytes'])}; model {size_text(report['saved_model_bytes'])}; envs and the "
            f"rest {size_text(report['env_bytes'])}), x "
            f"train.checkpoint_keep={report['keep']}: {size_text(report['keep'] * report['checkpoint_bytes'])}")


def _device(path: str | os.PathLike) -> int:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return os.stat(path).st_dev
