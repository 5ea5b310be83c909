"""Block-diagonal linear layer of the current official DreamerV3 (``embodied/jax/nets.py`` ``BlockLinear``; the
RSSM's GRU, ``rssm.py`` ``_core``, and the image decoder's first projection)."""

from __future__ import annotations

import torch
from torch import nn

from reverie.models.networks import trunc_normal_fan_in_


class BlockLinear(nn.Module):
    """``(..., G*I) -> (..., G*O)``: output block ``g`` is input block ``g`` times its own weight ``(I, O)``, plus a
    bias ``(G*O,)``. Weights fan-in truncated normal with the official ``fan_in = G*I``
    (``Initializer.compute_fans``). ValueError: ``in_dim`` or ``out_dim`` not divisible by ``blocks``.
    """

    def __init__(self, in_dim: int, out_dim: int, blocks: int, outscale: float = 1.0):
        super().__init__()
        if blocks < 1 or in_dim % blocks or out_dim % blocks:
            raise ValueError(f"BlockLinear: in_dim {in_dim} and out_dim {out_dim} must be multiples of blocks "
                             f"{blocks} (official blocks: 8; pick deter as a multiple of the blocks)")
        self.in_dim, self.out_dim, self.blocks = in_dim, out_dim, blocks
        self.weight = nn.Parameter(torch.empty(blocks, in_dim // blocks, out_dim // blocks))
        self.bias = nn.Parameter(torch.zeros(out_dim))
        trunc_normal_fan_in_(self.weight, in_dim, outscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.blocks, self.in_dim // self.blocks).transpose(0, 1)  # (..., G*I) -> (G, N, I)
        y = torch.bmm(x, self.weight)  # (G, N, I) @ (G, I, O) -> (G, N, O); autocast casts both
        y = y.transpose(0, 1).reshape(*lead, self.out_dim)  # (G, N, O) -> (N, G, O) -> (..., G*O)
        return y + self.bias.to(y.dtype)  # the compute dtype under autocast, as nn.Linear's bias

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, out_dim={self.out_dim}, blocks={self.blocks}"
