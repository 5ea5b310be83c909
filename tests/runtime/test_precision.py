"""What ``precision=auto`` and the AMX probe read from the CPU's flags (``reverie/runtime/precision.py``)."""

import pytest
import torch

from reverie.runtime import precision


@pytest.fixture
def flags(monkeypatch):
    """Set the flags the probes read (``/proc/cpuinfo``'s text) for one test."""
    def set_flags(text: str) -> None:
        monkeypatch.setattr(precision, "_cpu_flags", lambda: text)
    return set_flags


def test_amx_only_where_the_amx_bf16_flag_is(flags):
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    flags("flags : fpu avx512f avx512_bf16")  # an AVX512-BF16 CPU without AMX (the EPYC)
    assert precision.cpu_has_amx() is False
    assert precision._cpu_has_native_bf16() is native
    flags("flags : fpu avx512f avx512_bf16 amx_tile amx_bf16")  # the Xeon
    assert precision.cpu_has_amx() is native
    flags("")  # not Linux, or /proc/cpuinfo unreadable
    assert precision.cpu_has_amx() is False and precision._cpu_has_native_bf16() is False
    assert precision.resolve_precision("auto", torch.device("cpu")) == torch.float32


def test_flags_are_empty_off_linux(monkeypatch):
    monkeypatch.setattr(precision.sys, "platform", "darwin")
    precision._cpu_flags.cache_clear()
    try:
        assert precision._cpu_flags() == ""
    finally:
        precision._cpu_flags.cache_clear()
