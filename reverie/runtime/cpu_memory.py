"""Keep freed tensor memory in the process on CPU (glibc ``mallopt``), so big tensors stop page-faulting.

glibc ``mmap``s every block above ``M_MMAP_THRESHOLD`` afresh, so the few-MiB tensors of an update arrive as
untouched pages (docs/changelog.md, round 2). :func:`keep_freed_memory` sets it to 12 MiB and ``M_TRIM_THRESHOLD`` to
1 GiB (as ``MALLOC_MMAP_THRESHOLD_=12582912 MALLOC_TRIM_THRESHOLD_=1073741824``), keeping up to 1 GiB of freed heap.
Blocks of 12 MiB and more that no free heap block fits (at batch 16 x 64 the float32 ``(16384, 255)`` two-hot outputs
and ``(16, 1024, 256)`` activations of the imagined rows, 16 MiB each) are mapped and go back on free: kept in the
heap they raised an xs update's peak by 60-100 MiB; mapping them costs 0-3% of the update (docs/dreamerv3.md,
"make train").
:func:`release_freed_memory` hands that kept memory back (``malloc_trim``) where a run stops updating for a while
(before an evaluation, the stop confirmation and the end-of-run video), so those phases do not add to it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 12 * 1024 * 1024  # glibc allows up to 32 MiB (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1024 ** 3  # 1 GiB (mallopt takes an int)

_applied: bool | None = None
_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc on Linux (it has ``mallopt`` and ``malloc_trim``; their signatures set once
    here), else None."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):  # no C library found, or not glibc
            return None
        _libc = libc
    return _libc


def keep_freed_memory() -> bool:
    """Apply the two ``mallopt`` settings once per process; True where they took effect (glibc on Linux)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    libc = _glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success, 0 on an invalid value
    _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


def release_freed_memory() -> bool:
    """Return the freed heap memory glibc holds to the system (``malloc_trim(0)``: the free pages anywhere in the
    heap, not only at its top); True where it ran (glibc on Linux). Live tensors are untouched; the next update
    faults those pages back in once (trimming every 10 xs updates left the median update time unchanged,
    docs/dreamerv3.md)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
