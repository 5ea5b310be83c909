"""PlaNet's own networks, as google-research/planet builds them (commit c04226b; Hafner et al. 2019), for
``reverie.models.world_model.WorldModel(nets="planet")``: ``planet/networks/conv_ha.py`` (:class:`ConvHaEncoder`,
:class:`ConvHaDecoder`), ``networks/basic.py`` ``feed_forward`` (:class:`FeedForward`), the ``GRUBlockCell`` of
``models/rssm.py:55`` (:class:`BlockGRUCell`) and TensorFlow 1's default init (:func:`glorot_uniform_`).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from reverie.models.conv import ACTIVATIONS, conv_compute, float32_or_wider, scale_image

CONV_HA_SIZE = 64  # conv_ha.py asserts a 1024 embedding (encoder) and a 64x64x3 mean (decoder)


def glorot_uniform_(weight: torch.Tensor, fan_in: int | None = None, fan_out: int | None = None) -> torch.Tensor:
    """``U(-b, b)`` with ``b = sqrt(6 / (fan_in + fan_out))`` (TensorFlow's ``glorot_uniform_initializer``); fans
    default to the weight's own, give them where the weight is part of one reference layer."""
    if fan_in is None or fan_out is None:
        return nn.init.xavier_uniform_(weight)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return nn.init.uniform_(weight, -bound, bound)


def tf_init_(module: nn.Module) -> nn.Module:
    """Glorot-uniform weights and zero biases for every linear and (transposed) conv layer in ``module``."""
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            glorot_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


class FeedForward(nn.Module):
    """``(..., in_dim)`` -> ``layers`` x ``Linear(units) -> act``, then ``Linear(out_dim)`` unless None (reference
    ``feed_forward``, 3 x 300, ``scripts/configs.py:110-111``). ValueError: unknown ``act``; no layer at all."""

    def __init__(self, in_dim: int, out_dim: int | None, units: int = 300, layers: int = 3, act: str = "relu"):
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"FeedForward: act must be one of {tuple(ACTIVATIONS)}, got {act!r}")
        if layers < 1 and out_dim is None:
            raise ValueError("FeedForward: layers=0 without an output layer would be the identity; use layers >= 1")
        hidden: list[nn.Module] = []
        dim = in_dim
        for _ in range(layers):
            hidden += [nn.Linear(dim, units), ACTIVATIONS[act]()]
            dim = units
        self.hidden = nn.Sequential(*hidden)
        self.out = None if out_dim is None else nn.Linear(dim, out_dim)
        self.out_dim = dim if out_dim is None else out_dim
        tf_init_(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hidden(x)
        return x if self.out is None else self.out(x)


def _check_64(shape: tuple[int, ...], who: str) -> None:
    if len(shape) != 3 or shape[1:] != (CONV_HA_SIZE, CONV_HA_SIZE):
        raise ValueError(f"{who}: PlaNet's conv_ha stack takes 64x64 images (google-research/planet conv_ha.py "
                         f"asserts a 1024 embedding and a 64x64 mean), got (C, H, W) = {tuple(shape)}; resize the "
                         f"images to 64x64 in the env layer, or set agent.module.planet_dreamer_nets=true for the "
                         f"DreamerV3 conv stack (any power-of-two size)")


class ConvHaEncoder(nn.Module):
    """uint8 images ``(..., C, 64, 64)`` -> embedding ``(..., 32 * depth)``: four ``Conv2d(4x4, stride 2) -> ReLU``,
    64 -> 31 -> 14 -> 6 -> 2 (``conv_ha.py:30-35``). ValueError: another ``in_shape`` or input shape."""

    def __init__(self, in_shape: Sequence[int] = (3, 64, 64), depth: int = 32):
        super().__init__()
        self.in_shape = tuple(int(v) for v in in_shape)
        _check_64(self.in_shape, "ConvHaEncoder")
        layers: list[nn.Module] = []
        cin = self.in_shape[0]
        for mult in (1, 2, 4, 8):
            layers += [nn.Conv2d(cin, depth * mult, 4, 2), nn.ReLU()]
            cin = depth * mult
        self.layers = tf_init_(nn.Sequential(*layers))
        self.out_dim = cin * 2 * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-3:]) != self.in_shape:
            raise ValueError(f"ConvHaEncoder: expected images (..., {', '.join(map(str, self.in_shape))}), "
                             f"got shape {tuple(x.shape)}")
        lead = x.shape[:-3]
        x = x.reshape(-1, *self.in_shape)  # (..., C, H, W) -> (N, C, H, W)
        with conv_compute(x):
            x = self.layers(scale_image(x).contiguous(memory_format=torch.channels_last))  # (N, 8d, 2, 2)
        return x.reshape(*lead, self.out_dim)  # (N, 8d, 2, 2) -> (..., 32d)


class ConvHaDecoder(nn.Module):
    """Features ``(..., F)`` -> image mean ``(..., C, 64, 64)`` in ``scale_image``'s space: ``Linear(F, 32 * depth)``,
    then stride-2 transposed convs, 1 -> 5 -> 13 -> 30 -> 64 (``conv_ha.py:44-50``). ValueError: another
    ``out_shape``."""

    def __init__(self, feat_dim: int, out_shape: Sequence[int] = (3, 64, 64), depth: int = 32):
        super().__init__()
        self.out_shape = tuple(int(v) for v in out_shape)
        _check_64(self.out_shape, "ConvHaDecoder")
        self.width = 32 * depth
        self.linear = tf_init_(nn.Linear(feat_dim, self.width))
        self.layers = tf_init_(nn.Sequential(
            nn.ConvTranspose2d(self.width, 4 * depth, 5, 2), nn.ReLU(),
            nn.ConvTranspose2d(4 * depth, 2 * depth, 5, 2), nn.ReLU(),
            nn.ConvTranspose2d(2 * depth, depth, 6, 2), nn.ReLU(),
            nn.ConvTranspose2d(depth, self.out_shape[0], 6, 2)))

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        lead = feat.shape[:-1]
        x = self.linear(feat).reshape(-1, self.width, 1, 1)  # (..., F) -> (N, 32d) -> (N, 32d, 1, 1)
        with conv_compute(x):
            x = self.layers(float32_or_wider(x).contiguous(memory_format=torch.channels_last))  # -> (N, C, 64, 64)
        return x.contiguous().reshape(*lead, *self.out_shape)  # (N, C, 64, 64) -> (..., C, 64, 64)


class BlockGRUCell(nn.Module):
    """``tf.contrib.rnn.GRUBlockCell`` (PlaNet ``models/rssm.py:55``): ``forward(x (B, I), h (B, D)) -> (B, D)``.

    ``r, u = sigmoid(W_ru [x, h] + b_ru)``, ``c = tanh(W_c [x, r * h] + b_c)``, ``h' = u * h + (1 - u) * c``, ``b_ru``
    starting at 1 (``torch.nn.GRUCell`` applies ``r`` after the product).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.gates = nn.Linear(input_size + hidden_size, 2 * hidden_size)
        self.candidate = nn.Linear(input_size + hidden_size, hidden_size)
        tf_init_(self)
        nn.init.ones_(self.gates.bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        reset, update = torch.sigmoid(self.gates(torch.cat([x, h], -1))).chunk(2, -1)
        cand = torch.tanh(self.candidate(torch.cat([x, reset * h], -1)))
        return torch.lerp(cand, h, update)  # update * h + (1 - update) * cand
