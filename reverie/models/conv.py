"""Image encoder and decoder: strided conv stack down to 4x4 and its transposed mirror (DreamerV3 section 3).

Reference: 2023 DreamerV3 ``nets.py`` ``ImageEncoderResnet``/``ImageDecoderResnet`` with ``blocks: 0``,
``resize: stride``, ``minres: 4``; loss ``image_dist: mse``. Images are uint8 ``[0, 255]`` outside the model and
scaled by :func:`scale_image` only inside :class:`ConvEncoder` and :meth:`ImageMSE.log_prob`.
"""

from __future__ import annotations

import contextlib

import math
from typing import Sequence

import torch
from torch import distributions as td
from torch import nn

from reverie.models.networks import trunc_normal_init_

ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "none": nn.Identity}
NORMS = ("layer", "none")


def float32_or_wider(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32, or as it is when already float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def scale_image(x: torch.Tensor) -> torch.Tensor:
    """Pixels ``(..., C, H, W)`` in ``[0, 255]`` -> float32 (float64 stays) ``x / 255 - 0.5`` in ``[-0.5, 0.5]``."""
    return float32_or_wider(x) / 255.0 - 0.5


def unscale_image(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`scale_image` for display: float ``(..., C, H, W)`` -> uint8, rounded and clipped."""
    return ((x.float() + 0.5) * 255.0).round().clamp(0.0, 255.0).to(torch.uint8)


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of ``(N, C, H, W)`` at each pixel (reference ``norm: layer`` on NHWC)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (N, C, H, W) <-> (N, H, W, C)


def conv_compute(x: torch.Tensor, keep_autocast: bool = False) -> contextlib.AbstractContextManager:
    """Autocast off on CPU for the conv stacks (float32 channels-last; bf16 conv backward is slow there), unless
    ``keep_autocast`` (the current agent's stride-1 5x5 stacks on a CPU with AMX, decided when they are built: 2x
    faster at bf16 there). On CUDA autocast stays on."""
    if x.device.type == "cpu" and not keep_autocast:
        return torch.autocast("cpu", enabled=False)
    return contextlib.nullcontext()


def _per_layer(value: int | Sequence[int], n: int, name: str) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    if len(value) != n:
        raise ValueError(f"conv stack: {name} has {len(value)} entries but there are {n} layers")
    return value


def conv_plan(in_shape: Sequence[int], depth: int = 32, channels: Sequence[int] | None = None,
              kernel: int | Sequence[int] = 4, stride: int | Sequence[int] = 2, padding: int | Sequence[int] = 1,
              min_res: int = 4) -> list[dict[str, int]]:
    """Encoder layers for images ``in_shape = (C, H, W)``, one dict ``cin, cout, kernel, stride, padding, size_in,
    size_out`` each; the decoder runs them backwards. ``channels=None``: the reference stack, channels
    ``depth * 2**i`` down to ``min_res``. ValueError: non-square images, a default-stack side that is not a power of
    two above ``min_res``, or a layer that does not divide its input exactly.
    """
    if len(in_shape) != 3:
        raise ValueError(f"conv stack: images must be (C, H, W), got shape {tuple(in_shape)}")
    c, h, w = (int(v) for v in in_shape)
    if h != w:
        raise ValueError(f"conv stack: images must be square, got {h}x{w}; resize them in the env layer "
                         f"(e.g. to 64x64)")
    if channels is None:
        stages = math.log2(h / min_res) if h > 0 else -1.0
        if h & (h - 1) or stages < 1 or stages != int(stages):
            raise ValueError(f"conv encoder: image side {h} ({h}x{w}) is not a power of two larger than "
                             f"min_res={min_res}; resize the images in the env layer to 64x64 (or 32, 128, ...), "
                             f"or give explicit per-layer channels/kernel/stride/padding")
        channels = [depth * 2**i for i in range(int(stages))]
    channels = [int(v) for v in channels]
    n = len(channels)
    if n == 0:
        raise ValueError("conv stack: at least one layer is needed")
    kernels, strides, pads = (_per_layer(v, n, name) for v, name in
                              ((kernel, "kernel"), (stride, "stride"), (padding, "padding")))
    plan, size, cin = [], h, c
    for i, (cout, k, s, p) in enumerate(zip(channels, kernels, strides, pads)):
        span = size + 2 * p - k
        if span < 0 or span % s:
            raise ValueError(f"conv stack: layer {i} (kernel {k}, stride {s}, padding {p}) does not divide its "
                             f"{size}x{size} input exactly; choose sizes with (side + 2*padding - kernel) % stride "
                             f"== 0 so the decoder can mirror it")
        out = span // s + 1
        plan.append(dict(cin=cin, cout=cout, kernel=k, stride=s, padding=p, size_in=size, size_out=out))
        size, cin = out, cout
    return plan


class ConvEncoder(nn.Module):
    """uint8 images ``(..., C, H, W)`` -> flat embedding ``(..., E)``, ``E = channels[-1] * 4 * 4``.

    ``Conv2d -> ChannelNorm -> act`` per :func:`conv_plan` entry; ``depth`` is ``cnn_depth`` (reference s=32, m=48,
    l=64, xl=96), ``norm`` ``"layer"`` or ``"none"``, ``eps`` 1e-3. ValueError: an invalid stack or
    ``norm``/``act``; in ``forward``, a trailing shape other than ``in_shape``.
    """

    def __init__(self, in_shape: Sequence[int] = (3, 64, 64), depth: int = 32, channels: Sequence[int] | None = None,
                 kernel: int | Sequence[int] = 4, stride: int | Sequence[int] = 2, padding: int | Sequence[int] = 1,
                 min_res: int = 4, norm: str = "layer", act: str = "silu", eps: float = 1e-3):
        super().__init__()
        _check_norm_act(norm, act)
        self.in_shape = tuple(int(v) for v in in_shape)
        self.plan = conv_plan(self.in_shape, depth, channels, kernel, stride, padding, min_res)
        layers: list[nn.Module] = []
        for p in self.plan:
            conv = nn.Conv2d(p["cin"], p["cout"], p["kernel"], p["stride"], p["padding"], bias=norm == "none")
            trunc_normal_init_(conv.weight)
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)
            layers.append(conv)
            if norm == "layer":
                layers.append(ChannelNorm(p["cout"], eps=eps))
            layers.append(ACTIVATIONS[act]())
        self.layers = nn.Sequential(*layers)
        last = self.plan[-1]
        self.out_shape = (last["cout"], last["size_out"], last["size_out"])
        self.out_dim = math.prod(self.out_shape)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C, H, W)`` pixels -> the last conv activation ``(N, C', h, w)``."""
        dtype = self.layers[0].weight.dtype  # float32 (float64 in the float64 tests)
        with conv_compute(x):
            return self.layers(scale_image(x).to(dtype).contiguous(memory_format=torch.channels_last))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-3:]) != self.in_shape:
            raise ValueError(f"ConvEncoder: expected images (..., {', '.join(map(str, self.in_shape))}), "
                             f"got shape {tuple(x.shape)}")
        lead = x.shape[:-3]
        x = self.features(x.reshape(-1, *self.in_shape))  # (..., C, H, W) -> (N, C, H, W) -> (N, C', h, w)
        return x.reshape(*lead, self.out_dim)  # (N, C', h, w) -> (..., E)


class ConvDecoder(nn.Module):
    """Features ``(..., F)`` -> predicted images ``(..., C, H, W)`` in :func:`scale_image`'s space.

    ``Linear(F, C' * h * w)``, then the encoder's :func:`conv_plan` mirrored with ``ConvTranspose2d``, the last
    layer with a bias and no norm or activation. Arguments and ValueError as :class:`ConvEncoder`.
    """

    def __init__(self, feat_dim: int, out_shape: Sequence[int] = (3, 64, 64), depth: int = 32,
                 channels: Sequence[int] | None = None, kernel: int | Sequence[int] = 4,
                 stride: int | Sequence[int] = 2, padding: int | Sequence[int] = 1, min_res: int = 4,
                 norm: str = "layer", act: str = "silu", eps: float = 1e-3):
        super().__init__()
        _check_norm_act(norm, act)
        self.out_shape = tuple(int(v) for v in out_shape)
        self.plan = conv_plan(self.out_shape, depth, channels, kernel, stride, padding, min_res)
        last = self.plan[-1]
        self.in_shape = (last["cout"], last["size_out"], last["size_out"])
        self.linear = nn.Linear(feat_dim, math.prod(self.in_shape))  # kernels=auto: reads the one-hot by gathers
        trunc_normal_init_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        layers: list[nn.Module] = []
        for i, p in enumerate(reversed(self.plan)):
            final = i == len(self.plan) - 1
            conv = nn.ConvTranspose2d(p["cout"], p["cin"], p["kernel"], p["stride"], p["padding"],
                                      bias=final or norm == "none")
            trunc_normal_init_(conv.weight)
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)
            layers.append(conv)
            if not final:
                if norm == "layer":
                    layers.append(ChannelNorm(p["cin"], eps=eps))
                layers.append(ACTIVATIONS[act]())
        self.layers = nn.Sequential(*layers)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        lead = feat.shape[:-1]
        x = self.linear(feat).reshape(-1, *self.in_shape)  # (..., F) -> (N, C' * h * w) -> (N, C', h, w)
        with conv_compute(x):
            x = x.to(self.layers[0].weight.dtype)  # float32 (float64 in the float64 tests), also under autocast
            x = self.layers(x.contiguous(memory_format=torch.channels_last))  # (N, C', h, w) -> (N, C, H, W)
        return x.contiguous().reshape(*lead, *self.out_shape)  # (N, C, H, W) -> (..., C, H, W)


def _check_norm_act(norm: str, act: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"conv stack: norm must be one of {NORMS}, got {norm!r}")
    if act not in ACTIVATIONS:
        raise ValueError(f"conv stack: act must be one of {tuple(ACTIVATIONS)}, got {act!r}")


class ImageMSE(td.Distribution):
    """``pred`` ``(..., C, H, W)`` in scaled space: ``log_prob(x) = -sum_(C, H, W) (pred - scale_image(x))^2``
    ``(...)`` (reference ``image_dist: mse``); ``mean`` float pixels, ``mode`` uint8."""

    arg_constraints: dict = {}

    def __init__(self, pred: torch.Tensor):
        self.pred = float32_or_wider(pred)
        super().__init__(batch_shape=pred.shape[:-3], event_shape=pred.shape[-3:], validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        return (self.pred + 0.5) * 255.0

    @property
    def mode(self) -> torch.Tensor:
        return unscale_image(self.pred)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return -((self.pred - scale_image(value)) ** 2).sum((-3, -2, -1))
