"""Mixed precision: which autocast dtype a device gets (reference ``precision``: 16-bit compute, float32 params).

The DreamerV3 reference computes in 16 bits (``precision: float16``/``bfloat16``) with float32 parameters and
float32 distributions; reverie does the same with ``torch.autocast``. ``"auto"`` picks bfloat16 where the
hardware runs it natively (CUDA with bf16 support; x86 CPUs with AVX512-BF16 or AMX), else float32, because
emulated bf16 on an older CPU is slower than float32. ``"float64"`` computes (and keeps the parameters) in
float64: for exactness tests and debugging, not for training speed.
"""

from __future__ import annotations

import contextlib
import sys
from functools import lru_cache

import torch

PRECISIONS = ("auto", "float32", "bfloat16", "float64")


@lru_cache(maxsize=None)
def _cpu_has_native_bf16() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """``"auto"``/``"float32"``/``"bfloat16"``/``"float64"`` -> the compute dtype for ``device``.

    Raises:
        ValueError: unknown ``precision``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision in ("float32", "float64"):
        return getattr(torch, precision)
    if precision == "bfloat16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        return torch.bfloat16 if _cpu_has_native_bf16() else torch.float32
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``dtype`` on ``device``, or a no-op for float32 and float64."""
    if dtype in (torch.float32, torch.float64):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
