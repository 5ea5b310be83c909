"""RMS normalisation as the current official DreamerV3 uses it (``embodied/jax/nets.py`` ``Norm``, ``impl: rms``).

``y = x * rsqrt(mean(x^2) + eps) * scale`` over the last dim, computed in float32 and returned in ``x``'s dtype,
``eps = 1e-4``, a learned ``scale`` (ones at init) and no shift (the official ``rms`` branch reads no shift). The
official configs pick it for every hidden layer (``norm: rms`` in ``dyn.rssm``, ``enc``, ``dec``, the heads,
policy and value; ``configs.yaml``), where the 2023 code had LayerNorm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dim ``(..., D)`` with the official ``eps`` (1e-4), in float32 at least
    (the official ``Norm`` casts to float32 and back; under autocast the input may be bfloat16). Output: ``x``'s
    shape and dtype."""

    def __init__(self, dim: int, eps: float = 1e-4):
        super().__init__(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # float32 at least (float64 stays float64)
        return F.rms_norm(x.to(dtype), self.normalized_shape, self.weight.to(dtype), self.eps).to(x.dtype)


class ChannelRMSNorm(RMSNorm):
    """:class:`RMSNorm` over the channels of ``(N, C, H, W)`` at every pixel (the official ``Norm`` on NHWC
    feature maps normalises the last, channel, axis)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (N, C, H, W) <-> (N, H, W, C)
