"""Building blocks: linear layers with LayerNorm + SiLU, MLPs and their initialisation.

DreamerV3 (2023 reference, ``act: silu``, ``norm: layer``, ``winit: normal`` fan-average truncated normal,
``outscale``) uses bias-free linear layers followed by LayerNorm and SiLU. Output layers of the reward and
critic heads are zero-initialised (``outscale: 0.0``) so their two-hot predictions start at exactly 0.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def trunc_normal_init_(weight: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Fan-average truncated normal initialisation (reference ``winit: normal``, ``fan: avg``).

    ``std = sqrt(scale / mean(fan_in, fan_out)) / 0.8796`` (the std of a unit normal truncated to [-2, 2]).
    ``scale == 0`` gives zeros. Works on ``(out, in)`` weights.
    """
    if scale == 0.0:
        return nn.init.zeros_(weight)
    fan_out, fan_in = weight.shape[0], weight.shape[1] if weight.ndim > 1 else 1
    receptive = weight[0][0].numel() if weight.ndim > 2 else 1
    fan_avg = (fan_in + fan_out) * receptive / 2.0
    std = math.sqrt(scale / fan_avg) / 0.87962566103423978
    return nn.init.trunc_normal_(weight, 0.0, std, -2.0 * std, 2.0 * std)


def trunc_normal_fan_in_(weight: torch.Tensor, fan_in: int, outscale: float = 1.0) -> torch.Tensor:
    """Fan-in truncated normal initialisation of the current official DreamerV3 (``embodied/jax/nets.py``
    ``Initializer('trunc_normal', 'in')`` and ``Linear._scaled_winit``): a unit normal truncated to ``[-2, 2]``,
    times ``1.1368 * sqrt(1 / fan_in)`` (so its std is ``sqrt(1 / fan_in)``), times ``outscale`` (a factor on the
    values, not on the variance; ``0`` gives zeros). ``fan_in`` is passed explicitly because the official fans of
    block and conv kernels count every input of the layer (``Initializer.compute_fans``). Any weight shape.
    """
    if outscale == 0.0:
        return nn.init.zeros_(weight)
    with torch.no_grad():
        nn.init.trunc_normal_(weight, 0.0, 1.0, -2.0, 2.0)
        return weight.mul_(1.1368 * math.sqrt(1.0 / fan_in) * outscale)


class NormLinear(nn.Sequential):
    """``Linear(in_dim, out_dim, bias=False) -> LayerNorm(out_dim) -> SiLU``. Input ``(..., in_dim)`` (with kernels
    installed, also the RSSM's split features: :func:`reverie.models.kernels.install` makes the linear layer read
    the one-hot latent by row gathers)."""

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
    """``layers`` x :class:`NormLinear` of width ``units``, then an optional linear output layer.

    Args:
        in_dim: input features; input ``(..., in_dim)`` (with kernels installed also the RSSM's split features,
            whose one-hot latent the first layer reads by row gathers, :mod:`reverie.models.kernels.onehot_linear`).
        out_dim: size of the output layer, or ``None`` for no output layer (output ``(..., units)``).
        units, layers: width and depth of the hidden stack (size presets, ``reverie/configs/size/``).
        out_scale: init scale of the output layer; ``0.0`` zero-initialises it (reward and critic heads).
    """

    def __init__(self, in_dim: int, out_dim: int | None, units: int = 512, layers: int = 2, out_scale: float = 1.0):
        super().__init__()
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
        return x if self.out is None else self.out(x)
