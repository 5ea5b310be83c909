"""Mixed precision: which autocast dtype a device gets (reference ``precision``: 16-bit compute, float32 params).

``"auto"``: bfloat16 where native (CUDA with bf16; x86 with AVX512-BF16 or AMX), else float32 (emulated bf16 is
slower). ``"float64"``: parameters and compute in float64, for exactness tests.
"""

from __future__ import annotations

import contextlib
import sys
from functools import lru_cache

import torch

PRECISIONS = ("auto", "float32", "bfloat16", "float64")


@lru_cache(maxsize=None)
def _cpu_flags() -> str:
    """``/proc/cpuinfo`` (empty off Linux or where it cannot be read)."""
    if not sys.platform.startswith("linux"):
        return ""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def _cpu_has_native_bf16() -> bool:
    flags = _cpu_flags()
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_has_amx() -> bool:
    """True on an x86 CPU with AMX's bf16 tiles (``amx_bf16`` in ``/proc/cpuinfo``) that oneDNN runs bf16 on."""
    return "amx_bf16" in _cpu_flags() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """One of :data:`PRECISIONS` -> the compute dtype for ``device``; ValueError for another."""
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


def float32_linear(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` with autocast off, its input at least float32: the 255-bin two-hot output layers (reward, critic).

    Under bf16 autocast their logits would be rounded to 8 bits of mantissa, and the expected value of the bins
    (``softmax(logits) @ symexp(bins)``) moves with them: on a CartPole critic whose values reach 100, the rounding
    alone was 1.2 in value (std) and a quarter of the advantages' spread; with this layer in float32, 0.027
    (docs/dreamerv3.md). A no-op change outside autocast."""
    with torch.autocast(x.device.type, enabled=False):
        return layer(x.to(torch.promote_types(x.dtype, torch.float32)))
