"""The unimix draw's inverse-CDF search as summed sign bits (replaces ``torch.searchsorted`` in
:func:`reverie.models.distributions.unimix_index`).

The draw of a categorical latent finds, per row, how many entries of the CDF are below a uniform target. Done as
``(cdf - target < 0).sum(-1)`` through the float's sign bit (one subtraction, one arithmetic shift, one short sum)
it is about 4x faster than ``searchsorted``'s per-row binary search on CPU at ``K = 32`` (the search 0.45 -> 0.10
ms per imagination step at size s; docs/changelog.md, round 4), and with ``overwrite`` it works in the CDF's own
buffer. The same counts as ``searchsorted`` for finite values
(``tests/models/kernels/test_sampling.py``), so the same draws.
"""

from __future__ import annotations

import torch

_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
                   torch.float16: torch.int16}


def count_below(cdf: torch.Tensor, target: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """Per row, how many entries of a nondecreasing ``cdf (..., K)`` are below ``target (..., 1)``: ``(..., 1)`` int32
    (int64 for float64); the same numbers as ``torch.searchsorted(cdf, target)`` (left side).

    Exact for finite values: IEEE subtraction gives ``a - b < 0`` exactly when ``a < b`` (with subnormals; a process
    that sets ``torch.set_flush_denormal(True)`` could count a difference below ~1e-38 as not below) and ``+0`` when
    equal (one exception: an entry ``-0.0`` counts as below a target ``+0.0``; a cumsum of probabilities has none).
    ``overwrite=True`` works in ``cdf``'s memory (its values are lost; no new ``(..., K)`` tensor).

    Raises:
        TypeError: ``cdf - target`` is not a float tensor of 16, 32 or 64 bits (or, with ``overwrite``, not
            ``cdf``'s dtype).
    """
    dtype = cdf.dtype if overwrite else torch.promote_types(cdf.dtype, target.dtype)
    if dtype not in _SAME_WIDTH_INT or (overwrite and target.dtype != dtype):
        raise TypeError(f"count_below needs float16/bfloat16/float32/float64 cdf and target (one dtype with "
                        f"overwrite=True), got {cdf.dtype} and {target.dtype}")
    diff = cdf.sub_(target) if overwrite else cdf - target  # (..., K); the sign bit is set where cdf < target
    bits = diff.view(_SAME_WIDTH_INT[dtype])
    bits.bitwise_right_shift_(8 * bits.element_size() - 1)  # arithmetic shift: -1 where cdf < target, else 0
    return bits.sum(-1, keepdim=True, dtype=torch.int64 if bits.element_size() == 8 else torch.int32).neg_()
