"""Linear layers with LayerNorm + SiLU, MLPs and their initialisation (DreamerV3 2023 reference: ``act: silu``,
``norm: layer``, ``winit: normal``, ``outscale``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from reverie.runtime.precision import float32_linear


def trunc_normal_init_(weight: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Fan-average truncated normal init (reference ``winit: normal``, ``fan: avg``) of ``(out, in, ...)`` weights:
    ``std = sqrt(scale / mean(fan_in, fan_out)) / 0.8796``; ``scale == 0`` gives zeros."""
    if scale == 0.0:
        return nn.init.zeros_(weight)
    fan_out, fan_in = weight.shape[0], weight.shape[1] if weight.ndim > 1 else 1
    receptive = weight[0][0].numel() if weight.ndim > 2 else 1
    fan_avg = (fan_in + fan_out) * receptive / 2.0
    std = math.sqrt(scale / fan_avg) / 0.87962566103423978
    return nn.init.trunc_normal_(weight, 0.0, std, -2.0 * std, 2.0 * std)


def trunc_normal_fan_in_(weight: torch.Tensor, fan_in: int, outscale: float = 1.0) -> torch.Tensor:
    """Fan-in truncated normal init of the current DreamerV3 (``embodied/jax/nets.py`` ``Initializer('trunc_normal',
    'in')``, ``Linear._scaled_winit``): std ``sqrt(1 / fan_in)`` times ``outscale`` (0: zeros). ``fan_in`` is explicit
    because the official fans of block and conv kernels count every input (``Initializer.compute_fans``).
    """
    if outscale == 0.0:
        return nn.init.zeros_(weight)
    with torch.no_grad():
        nn.init.trunc_normal_(weight, 0.0, 1.0, -2.0, 2.0)
        return weight.mul_(1.1368 * math.sqrt(1.0 / fan_in) * outscale)


class NormLinear(nn.Sequential):
    """``Linear(bias=False) -> LayerNorm -> SiLU``: ``(..., in_dim) -> (..., out_dim)``."""

    def __init__(self, in_dim: int, out_dim: int, norm: bool = True, eps: float = 1e-3):
        layers: list[nn.Module] = [nn.Linear(in_dim, out_dim, bias=not norm)]
        if norm:
            layers.append(nn.LayerNorm(out_dim, eps=eps))
        layers.append(nn.SiLU())
        super().__init__(*layers)
        trunc_normal_init_(self[0].weight)
        if self[0].bias is not None:
            nn.init.zeros_(self[0].bias)


class MLP(nn.Module):
    """``(..., in_dim)`` -> ``layers`` x :class:`NormLinear` of ``units``, then a linear output unless ``out_dim`` is
    None; ``out_scale=0.0`` zero-initialises it (reward and critic heads, so two-hot predictions start at 0);
    ``float32_out``: the output layer runs outside autocast (:func:`reverie.runtime.precision.float32_linear`)."""

    def __init__(self, in_dim: int, out_dim: int | None, units: int = 512, layers: int = 2, out_scale: float = 1.0,
                 float32_out: bool = False):
        super().__init__()
        self.float32_out = bool(float32_out)
        hidden: list[nn.Module] = []
        dim = in_dim
        for _ in range(layers):
            hidden.append(NormLinear(dim, units))
            dim = units
        self.hidden = nn.Sequential(*hidden)
        self.out = None
        self.out_dim = dim
        if out_dim is not None:
            self.out = nn.Linear(dim, out_dim)  # the first layer when layers == 0
            trunc_normal_init_(self.out.weight, out_scale)
            nn.init.zeros_(self.out.bias)
            self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hidden(x)
        if self.out is None:
            return x
        return float32_linear(self.out, x) if self.float32_out else self.out(x)
