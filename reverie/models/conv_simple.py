"""Image encoder and decoder of the current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``dreamerv3/rssm.py``
``Encoder``/``Decoder`` with ``typ: simple``; ``configs.yaml:94,97``: ``depth: 64, mults: [2, 3, 4, 4], kernel: 5,
act: silu, norm: rms, outer: False, strided: False, bspace: 8``).

Encoder (``rssm.py:226-245``): per stage ``Conv2d(k=5, SAME) -> 2x2 max pool -> RMSNorm -> SiLU``, flattened.
Decoder (``rssm.py:308-356``): ``BlockLinear`` of the deterministic state (``bspace`` blocks) plus an MLP of the
stochastic one, then per stage ``2x nearest upsampling -> Conv2d(k=5) -> RMSNorm -> SiLU`` and a sigmoid output,
shifted by ``-0.5`` into :func:`reverie.models.conv.scale_image`'s space (the same ``outs.MSE`` error).

Images smaller than 64x64 use the last stages only, as many as keep the side at least ``min_res`` (the official
stack asserts a final side of 3..16, ``rssm.py:242-243``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from reverie.models.block_linear import BlockLinear
from reverie.models.conv import conv_compute, scale_image
from reverie.models.networks import trunc_normal_fan_in_
from reverie.models.rms_mlp import Dense, NormDense
from reverie.models.rmsnorm import ChannelRMSNorm
from reverie.runtime.precision import cpu_has_amx


def simple_stages(side: int, stages: int, min_res: int = 4) -> int:
    """Stages (each halves the side) for ``side``: at most ``stages``, keeping the side at least ``min_res``.
    ValueError: no stage fits, or ``side`` not divisible by ``2 ** stages``."""
    n = 0
    while n < stages and side // 2 ** (n + 1) >= min_res:
        n += 1
    if n == 0 or side % 2 ** n:
        raise ValueError(f"image side {side}: the conv stack halves it per stage down to at least {min_res}; "
                         f"use images of side {2 * min_res} or more that divide by 2 per stage (64x64 gives 4x4)")
    return n


def _conv(cin: int, cout: int, kernel: int, outscale: float = 1.0) -> nn.Conv2d:
    """``Conv2d(stride 1, SAME)`` with the official fan-in initialisation, zero bias."""
    conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2)
    trunc_normal_fan_in_(conv.weight, cin * kernel * kernel, outscale)
    nn.init.zeros_(conv.bias)
    return conv


class SimpleConvEncoder(nn.Module):
    """uint8 images ``(..., C, H, W)`` -> flat embedding ``(..., E)``, ``depth * mults`` channels per stage.
    ValueError: an even ``kernel``; image sides as :func:`simple_stages`."""

    def __init__(self, in_shape: Sequence[int] = (3, 64, 64), depth: int = 64, mults: Sequence[int] = (2, 3, 4, 4),
                 kernel: int = 5, min_res: int = 4):
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"SimpleConvEncoder: kernel must be odd for SAME padding at stride 1, got {kernel}")
        self.in_shape = tuple(int(v) for v in in_shape)
        c, h, w = self.in_shape
        n = min(simple_stages(h, len(mults), min_res), simple_stages(w, len(mults), min_res))
        self.channels = [depth * m for m in mults[len(mults) - n:]]
        layers: list[nn.Module] = []
        for cin, cout in zip([c] + self.channels[:-1], self.channels):
            layers += [_conv(cin, cout, kernel), nn.MaxPool2d(2), ChannelRMSNorm(cout), nn.SiLU()]
        self.layers = nn.Sequential(*layers)
        self.bf16_on_amx = cpu_has_amx()  # autocast kept on a CPU with AMX (conv_compute); read once, not per call
        self.out_shape = (self.channels[-1], h // 2 ** n, w // 2 ** n)
        self.out_dim = math.prod(self.out_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-3:]) != self.in_shape:
            raise ValueError(f"SimpleConvEncoder: expected images (..., {', '.join(map(str, self.in_shape))}), "
                             f"got shape {tuple(x.shape)}")
        lead = x.shape[:-3]
        x = scale_image(x.reshape(-1, *self.in_shape))  # (..., C, H, W) -> (N, C, H, W), x / 255 - 0.5
        with conv_compute(x, keep_autocast=self.bf16_on_amx):
            x = self.layers(x.contiguous(memory_format=torch.channels_last))  # (N, C', h, w)
        return x.reshape(*lead, self.out_dim)  # (N, C', h, w) -> (..., E)


class SimpleConvDecoder(nn.Module):
    """Features ``(..., D + S*K)`` -> predicted images ``(..., C, H, W)`` in :func:`scale_image` space.

    ``bspace``: blocks of the deterministic branch (0: one ``Linear(D + S*K)``, official ``space``); the stochastic
    branch is ``2 * units`` wide. ValueError: ``deter`` or the first map's channels not divisible by ``bspace``;
    image sides as :func:`simple_stages`.
    """

    def __init__(self, deter: int, stoch: int, out_shape: Sequence[int] = (3, 64, 64), depth: int = 64,
                 mults: Sequence[int] = (2, 3, 4, 4), kernel: int = 5, min_res: int = 4, units: int = 1024,
                 bspace: int = 8, outscale: float = 1.0):
        super().__init__()
        self.out_shape = tuple(int(v) for v in out_shape)
        self.deter, self.bspace = deter, bspace
        c, h, w = self.out_shape
        n = min(simple_stages(h, len(mults), min_res), simple_stages(w, len(mults), min_res))
        channels = [depth * m for m in mults[len(mults) - n:]]
        self.map_shape = (channels[-1], h // 2 ** n, w // 2 ** n)  # (C', h, w)
        size = math.prod(self.map_shape)
        if bspace:
            if deter % bspace or channels[-1] % bspace:
                raise ValueError(f"SimpleConvDecoder: deter {deter} and the first map's channels {channels[-1]} "
                                 f"(4 * depth) must be multiples of bspace {bspace}; pick an even size depth")
            self.space_deter = BlockLinear(deter, size, bspace)  # sp0
            self.space_stoch = nn.Sequential(NormDense(stoch, 2 * units), Dense(2 * units, size))  # sp1, sp2
        else:
            self.space = Dense(deter + stoch, size)  # space
        self.space_norm = nn.Sequential(ChannelRMSNorm(channels[-1]), nn.SiLU())  # spnorm / spacenorm
        layers: list[nn.Module] = []
        for cin, cout in zip(channels[::-1], channels[-2::-1]):  # conv{i} for i = n-2 .. 0
            layers += [nn.Upsample(scale_factor=2, mode="nearest"), _conv(cin, cout, kernel), ChannelRMSNorm(cout),
                       nn.SiLU()]
        layers += [nn.Upsample(scale_factor=2, mode="nearest"), _conv(channels[0], c, kernel, outscale)]  # imgout
        self.layers = nn.Sequential(*layers)
        self.bf16_on_amx = cpu_has_amx()  # autocast kept on a CPU with AMX (conv_compute); read once, not per call

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        lead = feat.shape[:-1]
        feat = feat.reshape(-1, feat.shape[-1])  # (..., F) -> (N, F)
        cm, h, w = self.map_shape
        if self.bspace:
            g = self.bspace
            x0 = self.space_deter(feat[:, :self.deter])  # (N, h*w*C') laid out as (G, h, w, C'/G)
            x0 = x0.view(-1, g, h, w, cm // g).permute(0, 1, 4, 2, 3).reshape(-1, cm, h, w)  # -> (N, C', h, w)
            x1 = self.space_stoch(feat[:, self.deter:]).view(-1, cm, h, w)  # (N, C'*h*w) -> (N, C', h, w)
            x = x0 + x1
        else:
            x = self.space(feat).view(-1, cm, h, w)  # (N, C'*h*w) -> (N, C', h, w)
        with conv_compute(x, keep_autocast=self.bf16_on_amx):
            x = self.layers(self.space_norm(x.float()).contiguous(memory_format=torch.channels_last))
            x = torch.sigmoid(x) - 0.5  # official sigmoid output in [0, 1], moved to scale_image's [-0.5, 0.5]
        return x.contiguous().reshape(*lead, *self.out_shape)  # (N, C, H, W) -> (..., C, H, W)
