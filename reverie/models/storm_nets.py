"""STORM's image encoder, decoder and heads (Zhang et al. 2023; weipu-zhang/STORM at 1c50658,
``sub_models/world_models.py``), the networks of ``agent.module.nets: storm`` (:func:`reverie.models.world_model.
storm_nets`).

Encoder (``EncoderBN``, ``world_models.py:15-63``): pixels scaled to ``[0, 1]``, a stem ``Conv2d(C, s, 4, 2, 1)`` then
``Conv2d(c, 2c, 4, 2, 1)`` until the side is ``min_res`` (4), each without bias and followed by ``BatchNorm2d`` and
ReLU; flattened ``(c * 4 * 4)``. Decoder (``DecoderBN``, ``world_models.py:66-120``): ``Linear(z, c * 4 * 4)``
without bias, ``BatchNorm2d``, ReLU, then ``ConvTranspose2d(c, c / 2, 4, 2, 1)`` without bias, ``BatchNorm2d``, ReLU
until ``c`` is the stem's, and a last ``ConvTranspose2d(s, C, 4, 2, 1)`` with bias. STORM compares its output with
pixels in ``[0, 1]``; reverie's image loss reads ``[-0.5, 0.5]`` (:func:`reverie.models.conv.scale_image`), so the
decoder returns STORM's output minus 0.5: the same squared error, the same parameters. Heads (``RewardDecoder``,
``TerminationDecoder``, ``world_models.py:152-190``): two ``Linear(w, w)`` without bias, each with LayerNorm and
ReLU, then a ``Linear`` to 255 bins (reward, two-hot symlog over ``[-20, 20]``, its output layer in float32 under
bf16 as every two-hot head here) or to one termination logit; the continue head returns its negative
(``BCE(l, term) = -log Bernoulli(-l)(1 - term)``). Vector observations (STORM has none) get DreamerV3's MLPs.

BatchNorm as STORM uses it: batch statistics (and running-statistics updates) in its world-model update, the
running statistics when it acts and when it encodes imagination contexts (``world_model.eval()``, ``train.py:61,
102``). :class:`StormBatchNorm2d` reads that from the autograd state: batch statistics only in training mode with
gradients enabled (reverie's updates), the running statistics under ``torch.no_grad()`` (acting, imagination).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.conv import conv_compute, float32_or_wider
from reverie.runtime.precision import float32_linear


class StormBatchNorm2d(nn.BatchNorm2d):
    """``BatchNorm2d`` (eps 1e-5, momentum 0.1) with batch statistics only when training with gradients enabled
    (module docstring); ``(N, C, H, W)`` -> ``(N, C, H, W)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = self.training and torch.is_grad_enabled()
        if batch and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)  # as nn.BatchNorm2d counts (momentum 0.1 is used, not the count)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, batch, self.momentum,
                            self.eps)


def storm_stages(side: int, min_res: int) -> int:
    """Stride-2 stages from ``side`` down to ``min_res``; ValueError unless ``side = min_res * 2^k``, ``k >= 1``."""
    stages = round(math.log2(side / min_res)) if side > min_res else 0
    if stages < 1 or min_res * 2 ** stages != side:
        raise ValueError(f"STORM's conv stacks halve the side down to {min_res}: the image side must be {min_res} "
                         f"times a power of 2 (64 for Atari), got {side}")
    return stages


class StormEncoder(nn.Module):
    """``(..., C, H, W)`` pixels in ``[0, 255]`` -> ``(..., out_dim)`` (module docstring; ``stem`` STORM's 32).
    ValueError: a non-square image or a side that does not halve down to ``min_res``."""

    def __init__(self, in_shape: Sequence[int] = (3, 64, 64), stem: int = 32, min_res: int = 4):
        super().__init__()
        channels, height, width = (int(d) for d in in_shape)
        if height != width:
            raise ValueError(f"STORM's encoder takes square images, got {height}x{width}")
        layers: list[nn.Module] = []
        cin, cout = channels, int(stem)
        for _ in range(storm_stages(height, min_res)):
            layers += [nn.Conv2d(cin, cout, 4, 2, 1, bias=False), StormBatchNorm2d(cout), nn.ReLU()]
            cin, cout = cout, cout * 2
        self.layers = nn.Sequential(*layers)
        self.last_channels, self.min_res = cin, int(min_res)
        self.out_dim = cin * min_res * min_res

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-3]
        with conv_compute(x):
            y = self.layers(float32_or_wider(x).flatten(0, -4) / 255.0)  # (N, C, H, W) -> (N, c, 4, 4)
        return y.reshape(*lead, self.out_dim)


class StormDecoder(nn.Module):
    """``(..., width)`` (the flattened latent ``z``) -> ``(..., C, H, W)`` predicted pixels in ``[-0.5, 0.5]``
    (STORM's ``[0, 1]`` output minus 0.5; module docstring)."""

    def __init__(self, width: int, out_shape: Sequence[int] = (3, 64, 64), stem: int = 32, min_res: int = 4):
        super().__init__()
        channels, height, _ = (int(d) for d in out_shape)
        stages = storm_stages(height, min_res)
        self.last_channels, self.min_res, self.out_shape = int(stem) * 2 ** (stages - 1), int(min_res), \
            (channels, height, height)
        self.linear = nn.Linear(width, self.last_channels * min_res * min_res, bias=False)
        layers: list[nn.Module] = [StormBatchNorm2d(self.last_channels), nn.ReLU()]
        c = self.last_channels
        while c != stem:
            layers += [nn.ConvTranspose2d(c, c // 2, 4, 2, 1, bias=False), StormBatchNorm2d(c // 2), nn.ReLU()]
            c //= 2
        layers.append(nn.ConvTranspose2d(c, channels, 4, 2, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        lead = z.shape[:-1]
        x = self.linear(z).flatten(0, -2).view(-1, self.last_channels, self.min_res, self.min_res)
        with conv_compute(x):
            y = self.layers(float32_or_wider(x))  # (N, c, 4, 4) -> (N, C, H, W)
        return y.reshape(*lead, *self.out_shape) - 0.5


class StormHead(nn.Module):
    """``(..., width)`` -> ``(..., out)``: two ``Linear(bias=False) -> LayerNorm -> ReLU`` of ``units`` (None: the
    input width, STORM's) and a ``Linear`` output; ``negate``: return the output's negative (the continue head,
    from STORM's termination logit)."""

    def __init__(self, width: int, out: int, units: int | None = None, layers: int = 2, negate: bool = False,
                 float32_out: bool = False):
        super().__init__()
        units = int(units or width)
        self.float32_out = bool(float32_out)  # the reward's 255 bins: :func:`reverie.runtime.precision.float32_linear`
        hidden: list[nn.Module] = []
        for i in range(layers):
            hidden += [nn.Linear(width if i == 0 else units, units, bias=False), nn.LayerNorm(units), nn.ReLU()]
        self.hidden = nn.Sequential(*hidden)
        self.out = nn.Linear(units, out)
        self.sign = -1.0 if negate else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hidden(x)
        return self.sign * (float32_linear(self.out, x) if self.float32_out else self.out(x))
