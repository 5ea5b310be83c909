"""Image encoder and decoder: strided conv stack down to 4x4 and its transposed mirror (DreamerV3 section 3).

Reference (2023 DreamerV3 ``nets.py``, ``ImageEncoderResnet``/``ImageDecoderResnet`` with ``blocks: 0``,
``resize: stride``, ``minres: 4``): each stage is a 4x4 convolution with stride 2 (``SAME`` padding, i.e.
1 pixel each side for even sides), followed by LayerNorm over channels and SiLU; channels are
``cnn_depth * [1, 2, 4, 8]`` for 64x64 inputs; the output is flattened. The decoder is a linear layer to
``(8 * depth, 4, 4)`` and transposed convolutions back up, the last one without norm and activation. Its
loss is the squared error summed over pixels (reference ``image_dist: mse``).

Scaling: images are uint8 in ``[0, 255]`` everywhere outside the model (env rows, replay, acting, eval) and
are scaled by :func:`scale_image` (``x / 255 - 0.5``) in exactly one place: inside :class:`ConvEncoder` for
inputs and inside :meth:`ImageMSE.log_prob` for reconstruction targets. Replay training, acting and
evaluation all call the same encoder, so they see identical inputs.
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
    """``x`` as float32, or as it is when already float64: 16-bit autocast outputs and integer pixels become
    float32 for the distributions, float64 models stay float64 (exactness tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def scale_image(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels ``(..., C, H, W)`` in ``[0, 255]`` -> float32 ``x / 255 - 0.5`` in ``[-0.5, 0.5]``.

    The one place images are scaled (reference: ``image / 255`` in the agent's preprocessing, ``- 0.5`` in the
    encoder, ``+ 0.5`` on the decoder's output; here both offsets live in this function). Float inputs holding
    pixel values in ``[0, 255]`` give the same result as the uint8 tensor. Exact at the ends: 0 -> -0.5,
    255 -> 0.5. float64 inputs stay float64 (exactness tests); every other dtype gives float32.
    """
    return float32_or_wider(x) / 255.0 - 0.5


def unscale_image(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`scale_image` for display: float ``(..., C, H, W)`` -> uint8, rounded and clipped."""
    return ((x.float() + 0.5) * 255.0).round().clamp(0.0, 255.0).to(torch.uint8)


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of ``(N, C, H, W)`` at each pixel (reference ``norm: layer`` on NHWC)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (N, C, H, W) <-> (N, H, W, C)


def conv_compute(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast off for the conv stacks: they run in float32, channels-last.

    Measured on this project's 2-core AVX512 CPU (torch 2.13, fwd+bwd of one 4x4/stride-2 layer on 1024 images):
    float32 channels-last 0.21 s, float32 NCHW 0.41 s, bfloat16 autocast 1.7-3.5 s (the bf16 conv backward
    takes a slow path), so only the matrix-multiply parts of the model use the 16-bit compute dtype on a CPU.
    On CUDA, autocast stays on (bf16 convolutions are fast there).
    """
    if x.device.type == "cpu":
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
    """Layer list of the encoder for images ``in_shape = (C, H, W)``; the decoder runs it backwards.

    With ``channels=None`` the reference stack: ``log2(H / min_res)`` layers with channels
    ``depth * 2**i`` (``depth * [1, 2, 4, 8]`` for 64x64), kernel 4, stride 2, padding 1, ending at
    ``min_res x min_res``. With explicit ``channels`` (one entry per layer) ``kernel``/``stride``/``padding``
    may be ints or per-layer lists, and each layer must divide its input exactly, so that the transposed
    mirror restores every size.

    Returns:
        one dict per layer: ``cin, cout, kernel, stride, padding, size_in, size_out``.

    Raises:
        ValueError: non-square images; with the default stack, a side that is not a power of two larger than
            ``min_res``; a layer whose stride does not divide its input exactly.
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

    Layers: ``Conv2d(bias=False) -> ChannelNorm -> SiLU`` per :func:`conv_plan` entry (bias only with
    ``norm="none"``). 64x64 RGB with ``depth=32``: ``(3, 64, 64) -> (32, 32, 32) -> (64, 16, 16) ->
    (128, 8, 8) -> (256, 4, 4)`` -> ``E = 4096``.

    Args:
        in_shape: ``(C, H, W)`` of the (channel-concatenated) image input.
        depth: channel multiplier (size preset ``cnn_depth``; reference s=32, m=48, l=64, xl=96).
        channels, kernel, stride, padding, min_res: the stack, see :func:`conv_plan`.
        norm: ``"layer"`` (channel LayerNorm, reference) or ``"none"``.
        act: ``"silu"`` (reference), ``"relu"``, ``"elu"``, ``"gelu"`` or ``"none"``.
        eps: LayerNorm epsilon (reference 1e-3, as in :class:`reverie.models.networks.NormLinear`).

    Input: uint8 (or float holding ``[0, 255]`` pixel values) ``(..., C, H, W)`` with any leading dims,
    e.g. ``(T, B)`` or ``(N,)``; scaled by :func:`scale_image`. Output float ``(..., E)``.

    Raises:
        ValueError: invalid stack (see :func:`conv_plan`), unknown ``norm``/``act``; in ``forward``, an input
            whose trailing shape is not ``in_shape``.
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
        """``(N, C, H, W)`` pixels -> the last conv activation ``(N, C', h, w)`` (``h = w = 4`` by default).

        Runs in float32 and channels-last memory (see :func:`conv_compute`), also under autocast.
        """
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
    """Features ``(..., F)`` -> predicted images ``(..., C, H, W)`` in the scaled space of :func:`scale_image`.

    ``Linear(F, C' * h * w)`` (bias, no norm; reference decoder ``in`` layer), reshaped to ``(C', h, w)``, then
    the :func:`conv_plan` of the encoder mirrored with ``ConvTranspose2d`` layers: each ``(bias=False) ->
    ChannelNorm -> SiLU`` except the last, which outputs the ``C`` image channels with a bias and no norm
    or activation. 64x64 RGB with ``depth=32``: ``(256, 4, 4) -> (128, 8, 8) -> (64, 16, 16) -> (32, 32, 32)
    -> (3, 64, 64)``. Wrap the output in :class:`ImageMSE` for the loss.

    Args:
        feat_dim: ``F`` (``D + S*K`` for the RSSM features).
        out_shape: ``(C, H, W)`` of the images to predict.
        depth, channels, kernel, stride, padding, min_res, norm, act, eps: as :class:`ConvEncoder` (give the
            same values so the decoder mirrors the encoder).

    Raises:
        ValueError: as :class:`ConvEncoder`.
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
        self.linear = nn.Linear(feat_dim, math.prod(self.in_shape))  # kernels installed: split features too
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
    """Image decoder output: ``log_prob(x) = -sum over (C, H, W) of (pred - scale_image(x))^2``.

    Reference ``image_dist: mse`` (sum of squared errors over pixels, DreamerV3 section 3). Like
    :class:`reverie.models.distributions.SymlogMSE`, ``log_prob`` takes observations as stored (uint8
    pixels) and transforms them itself.

    Args:
        pred: ``(..., C, H, W)`` prediction in the scaled space of :func:`scale_image` (``[-0.5, 0.5]``).

    ``log_prob(x)``: ``x`` uint8 (or float pixel values) ``(..., C, H, W)`` -> ``(...)``.
    ``mean``: float32 ``(..., C, H, W)`` in pixel units ``(pred + 0.5) * 255`` (not clipped).
    ``mode``: uint8 ``(..., C, H, W)`` (``mean`` rounded and clipped to ``[0, 255]``), ready to show.
    ``pred``: the prediction in the scaled space.
    """

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
