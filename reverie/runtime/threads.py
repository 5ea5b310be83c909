"""How many intra-op threads a run gets: ``threads=N``, or the cores idle now (torch's one per core can be tens of
times slower on a busy machine: docs/speed.md, "Threads")."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROBE_S = 0.3  # seconds the idle probe watches /proc/stat


def allowed_cores() -> list[int]:
    """The CPU ids this process may run on (its affinity mask; all of ``os.cpu_count()`` where unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_times(path: str | Path = "/proc/stat") -> dict[int, tuple[int, int]]:
    """``{cpu id: (idle + iowait ticks, total ticks)}`` from ``/proc/stat``; empty where it cannot be read."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields]
            out[int(name[3:])] = (ticks[3] + (ticks[4] if len(ticks) > 4 else 0), sum(ticks[:8]))
    return out


def idle_cores(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], cores: list[int]) -> float:
    """Sum of ``d idle / d total`` over ``cores`` between two :func:`cpu_times` readings (no ticks: idle)."""
    total = 0.0
    for cpu in cores:
        if cpu not in before or cpu not in after:
            total += 1.0
            continue
        d_idle, d_all = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        total += 1.0 if d_all <= 0 else min(max(d_idle / d_all, 0.0), 1.0)
    return total


def choose_threads(requested: int | None, processes: int = 1, probe_s: float = PROBE_S) -> tuple[int, str]:
    """``(threads, reason)``: ``requested``, else ``OMP_NUM_THREADS``, else the affinity mask's cores idle over
    ``probe_s`` (rounded, shared among ``processes``, at least 1; all of them without ``/proc/stat``)."""
    if requested:
        return int(requested), f"threads={int(requested)}"
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    cores = allowed_cores()
    before = cpu_times()
    if not before:
        n = max(1, len(cores) // max(processes, 1))
        return n, f"{len(cores)} core(s) in this process's affinity mask; set threads=N to choose"
    time.sleep(probe_s)
    idle = idle_cores(before, cpu_times(), cores)
    n = max(1, min(len(cores), int(idle + 0.5)) // max(processes, 1))
    shared = f", shared by {processes} processes" if processes > 1 else ""
    return n, (f"{idle:.1f} of the {len(cores)} core(s) in this process's affinity mask idle over {probe_s:g} s"
               f"{shared}; set threads=N to choose")
