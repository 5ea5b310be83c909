"""RMS normalisation of the current official DreamerV3 (``embodied/jax/nets.py`` ``Norm``, ``impl: rms``):
``y = x * rsqrt(mean(x^2) + eps) * scale`` over the last dim, no shift."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over ``(..., D)``, ``eps`` 1e-4, computed in float32 at least, returned in ``x``'s dtype."""

    def __init__(self, dim: int, eps: float = 1e-4):
        super().__init__(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # float32 at least (float64 stays float64)
        return F.rms_norm(x.to(dtype), self.normalized_shape, self.weight.to(dtype), self.eps).to(x.dtype)


class ChannelRMSNorm(RMSNorm):
    """:class:`RMSNorm` over the channels of ``(N, C, H, W)`` at every pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (N, C, H, W) <-> (N, H, W, C)
