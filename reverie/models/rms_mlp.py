"""Dense layers and MLPs of the current official DreamerV3 (``embodied/jax/nets.py`` ``Linear`` and ``MLP``;
``embodied/jax/heads.py`` ``MLPHead``).

Every hidden layer is ``Linear (with bias) -> RMSNorm -> SiLU`` (the official ``MLP``: ``linear{i}``, ``norm{i}``,
``act``; ``act: silu``, ``norm: rms`` in ``configs.yaml``), where the 2023 code had bias-free layers and LayerNorm.
Weights are fan-in truncated normals (``winit: trunc_normal_in``), biases zeros, and an output layer's weights are
scaled by its ``outscale`` (``Linear._scaled_winit``; e.g. policy 0.01, value and reward 0.0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from reverie.models.networks import trunc_normal_fan_in_
from reverie.models.rmsnorm import RMSNorm


class Dense(nn.Linear):
    """``nn.Linear(in_dim, out_dim)`` with the official initialisation: weights
    :func:`reverie.models.networks.trunc_normal_fan_in_` times ``outscale``, bias zeros. ``(..., in) -> (..., out)``."""

    def __init__(self, in_dim: int, out_dim: int, outscale: float = 1.0, bias: bool = True):
        super().__init__(in_dim, out_dim, bias=bias)
        trunc_normal_fan_in_(self.weight, in_dim, outscale)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class SplitDense(nn.Module):
    """One :class:`Dense` output layer per part, on the same input, concatenated: ``(..., in) -> (..., sum(widths))``.

    The official heads keep one ``Linear`` per output: the continuous policy's ``mean`` and ``stddev``
    (``embodied/jax/heads.py:146-148``, ``bounded_normal``) and the decoder's ``DictHead``, one ``pred`` per vector key
    (``dreamerv3/rssm.py:297-305``, ``heads.py:44-60``). AGC (``opt.agc``) clips every tensor by its own norm, so
    these are separate tensors here too (parameters ``parts.<i>.weight``, ``parts.<i>.bias``).
    """

    def __init__(self, in_dim: int, widths: Sequence[int], outscale: float = 1.0):
        super().__init__()
        self.widths = tuple(int(w) for w in widths)
        self.parts = nn.ModuleList(Dense(in_dim, w, outscale) for w in self.widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], -1)


class NormDense(nn.Sequential):
    """``Dense(in_dim, out_dim) -> RMSNorm(out_dim) -> SiLU``: one hidden layer. ``(..., in) -> (..., out)``."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__(Dense(in_dim, out_dim), RMSNorm(out_dim), nn.SiLU())


class RMSMLP(nn.Module):
    """``layers`` x :class:`NormDense` of width ``units``, then an optional :class:`Dense` output layer.

    Args:
        in_dim: input width; input ``(..., in_dim)``.
        out_dim: output layer width, or None for none (output ``(..., units)``; the official encoder and
            ``MLPHead.mlp`` end with a hidden layer).
        units, layers: width and depth of the hidden stack (official ``units`` per size preset; ``layers`` per
            module: 3 for encoder, decoder, policy and value, 1 for the reward and continue heads).
        outscale: init scale of the output layer (official ``outscale``).
        out_split: widths of separate output layers (:class:`SplitDense`; they sum to ``out_dim``), e.g. the
            policy's mean and std; None: one :class:`Dense`.

    Raises:
        ValueError: ``out_split`` does not sum to ``out_dim``.
    """

    def __init__(self, in_dim: int, out_dim: int | None, units: int, layers: int, outscale: float = 1.0,
                 out_split: Sequence[int] | None = None):
        super().__init__()
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
        return x if self.out is None else self.out(x)
