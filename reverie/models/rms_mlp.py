"""Dense layers and MLPs of the current official DreamerV3 (``embodied/jax/nets.py`` ``Linear`` and ``MLP``;
``embodied/jax/heads.py`` ``MLPHead``): hidden layers ``Linear -> RMSNorm -> SiLU``, fan-in truncated normal
weights (``winit: trunc_normal_in``), output weights scaled by ``outscale`` (``Linear._scaled_winit``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from reverie.models.networks import trunc_normal_fan_in_
from reverie.models.rmsnorm import RMSNorm
from reverie.runtime.precision import float32_linear


class Dense(nn.Linear):
    """``nn.Linear`` ``(..., in) -> (..., out)`` with fan-in truncated normal weights times ``outscale``, zero bias."""

    def __init__(self, in_dim: int, out_dim: int, outscale: float = 1.0, bias: bool = True):
        super().__init__(in_dim, out_dim, bias=bias)
        trunc_normal_fan_in_(self.weight, in_dim, outscale)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class SplitDense(nn.Module):
    """One :class:`Dense` per part, concatenated: ``(..., in) -> (..., sum(widths))``. Separate tensors as the
    official heads (``heads.py:146-148``, ``rssm.py:297-305``), since AGC clips each tensor by its own norm."""

    def __init__(self, in_dim: int, widths: Sequence[int], outscale: float = 1.0):
        super().__init__()
        self.widths = tuple(int(w) for w in widths)
        self.parts = nn.ModuleList(Dense(in_dim, w, outscale) for w in self.widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], -1)


class NormDense(nn.Sequential):
    """``Dense -> RMSNorm -> SiLU``: one hidden layer ``(..., in) -> (..., out)``."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__(Dense(in_dim, out_dim), RMSNorm(out_dim), nn.SiLU())


class RMSMLP(nn.Module):
    """``(..., in_dim)`` -> ``layers`` x :class:`NormDense` of ``units``, then a :class:`Dense` (or, with
    ``out_split``, :class:`SplitDense`) output unless ``out_dim`` is None; ``float32_out`` as
    :class:`reverie.models.networks.MLP`'s. ValueError: ``out_split`` does not sum to ``out_dim``."""

    def __init__(self, in_dim: int, out_dim: int | None, units: int, layers: int, outscale: float = 1.0,
                 out_split: Sequence[int] | None = None, float32_out: bool = False):
        super().__init__()
        self.float32_out = bool(float32_out)
        dims = [in_dim] + [units] * layers
        self.hidden = nn.Sequential(*[NormDense(a, b) for a, b in zip(dims[:-1], dims[1:])])
        if out_split is not None and (out_dim is None or sum(out_split) != out_dim):
            raise ValueError(f"RMSMLP: out_split {list(out_split)} must sum to out_dim={out_dim}")
        self.out: nn.Module | None = None
        if out_dim is not None:
            self.out = Dense(dims[-1], out_dim, outscale) if out_split is None else \
                SplitDense(dims[-1], out_split, outscale)
        self.out_dim = dims[-1] if out_dim is None else out_dim

    def forward(self, x):
        x = self.hidden(x)
        if self.out is None:
            return x
        return float32_linear(self.out, x) if self.float32_out else self.out(x)
