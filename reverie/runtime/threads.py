"""How many intra-op threads a run gets: ``threads=N``, or chosen from what the machine can give it now.

torch's default is one thread per core. On a 2-core machine with the other core busy, two threads make every
parallel region wait for the slower core, and an update can take tens of times longer than on one thread
(docs/speed.md, "Threads"). :func:`choose_threads` counts the cores this process may run on (its affinity mask)
and how many of them were idle over a short probe (``/proc/stat``), and takes the idle ones, at least one.
"""

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
    """``{cpu id: (idle ticks, total ticks)}`` from a ``/proc/stat`` text (idle counts ``idle`` and ``iowait``);
    empty where the file cannot be read (not Linux)."""
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
    """How many of ``cores`` were idle between two :func:`cpu_times` readings: the sum over the cores of
    ``d idle / d total`` (a core with no ticks in between counts as idle)."""
    total = 0.0
    for cpu in cores:
        if cpu not in before or cpu not in after:
            total += 1.0
            continue
        d_idle, d_all = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        total += 1.0 if d_all <= 0 else min(max(d_idle / d_all, 0.0), 1.0)
    return total


def choose_threads(requested: int | None, processes: int = 1, probe_s: float = PROBE_S) -> tuple[int, str]:
    """The intra-op thread count for this process and the reason, for the start-up line.

    Args:
        requested: ``threads`` from the config; a number is used as given.
        processes: processes sharing the machine's cores (data-parallel ranks on one host).
        probe_s: seconds to watch ``/proc/stat`` (this process sleeps meanwhile, so it does not count itself).

    Returns:
        ``(threads, reason)``: ``requested`` when given, else ``OMP_NUM_THREADS`` when set, else the idle cores
        of the affinity mask rounded to the nearest whole core and shared among ``processes``, at least 1; where
        the probe cannot read ``/proc/stat``, the cores of the mask (torch's own default).
    """
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
