"""The unimix draw's inverse-CDF search as summed sign bits, replacing ``torch.searchsorted`` in
:func:`reverie.models.distributions.unimix_index`: the same counts for finite values (docs/changelog.md, round 4;
``tests/models/kernels/test_sampling.py``).
"""

from __future__ import annotations

import torch

_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
                   torch.float16: torch.int16}


def count_below(cdf: torch.Tensor, target: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """``torch.searchsorted(cdf (..., K), target (..., 1))`` ``(..., 1)`` int32 (int64 for float64) for finite
    values; ``overwrite=True`` works in ``cdf``'s memory. TypeError: not one float dtype of 16, 32 or 64 bits."""
    dtype = cdf.dtype if overwrite else torch.promote_types(cdf.dtype, target.dtype)
    if dtype not in _SAME_WIDTH_INT or (overwrite and target.dtype != dtype):
        raise TypeError(f"count_below needs float16/bfloat16/float32/float64 cdf and target (one dtype with "
                        f"overwrite=True), got {cdf.dtype} and {target.dtype}")
    diff = cdf.sub_(target) if overwrite else cdf - target  # (..., K); the sign bit is set where cdf < target
    bits = diff.view(_SAME_WIDTH_INT[dtype])
    bits.bitwise_right_shift_(8 * bits.element_size() - 1)  # arithmetic shift: -1 where cdf < target, else 0
    return bits.sum(-1, keepdim=True, dtype=torch.int64 if bits.element_size() == 8 else torch.int32).neg_()
