"""Keep freed tensor memory in the process on CPU (glibc ``mallopt``), so big tensors stop page-faulting.

PyTorch's CPU allocator is the C library's ``malloc``. glibc serves every block of at least ``M_MMAP_THRESHOLD``
bytes (128 KiB at start, raised adaptively up to 32 MiB) with a fresh ``mmap`` and gives it back on ``free``, and
returns free memory at the top of the heap to the kernel above ``M_TRIM_THRESHOLD``. A DreamerV3 update allocates
and frees tensors of a few MiB thousands of times (``(N, S, K)`` latents, ``(H, N, 255)`` bins), so each of them
arrives as untouched pages: 10,000-20,000 minor page faults per update at size xs, each a kernel entry and a page
of zeroing, and the elementwise kernels that first touch such a tensor run several times slower than on reused
memory (docs/changelog.md, round 2).

:func:`keep_freed_memory` sets ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's maximum; blocks below it come from the
heap and are reused after ``free``) and ``M_TRIM_THRESHOLD`` to 1 GiB (up to that much freed heap memory stays
mapped): the settings of the environment variables ``MALLOC_MMAP_THRESHOLD_=33554432
MALLOC_TRIM_THRESHOLD_=1073741824``, applied from inside the process. Cost: the process keeps up to 1 GiB of freed
heap instead of returning it (blocks of 32 MiB and more, e.g. replay arrays, are unaffected). ``reverie train``
applies it on CPU (config ``cpu_keep_freed_memory``, default true); the benchmarks under ``bench/`` do the same,
so they time what training runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1024 ** 3  # 1 GiB (mallopt takes an int)

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the two ``mallopt`` settings once per process; True where they took effect (glibc on Linux).

    Elsewhere (macOS, Windows, musl) nothing changes and False is returned; nothing raises.
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on an invalid value
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
