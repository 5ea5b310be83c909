"""Per-call wall and CPU seconds of a repeated step (the reverie side of bench/vs_sheeprl.py and bench/vs_jax.py)."""

from __future__ import annotations

import math
import time
from typing import Callable


def time_calls(step: Callable[[], object], warmup: int, max_calls: int = 0,
               max_seconds: float = math.inf) -> tuple[list[float], list[float]]:
    """Calls ``step`` ``warmup`` times untimed, then times calls until ``max_calls`` (0: no bound) are done or
    ``max_seconds`` of wall time have passed since the first timed call.

    Returns:
        ``(wall seconds, process CPU seconds)`` per timed call; CPU time is less inflated than wall time when other
        jobs share the machine.
    """
    for _ in range(warmup):
        step()
    times: list[float] = []
    cpu_times: list[float] = []
    first = time.perf_counter()
    while (not max_calls or len(times) < max_calls) and time.perf_counter() - first < max_seconds:
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return times, cpu_times
