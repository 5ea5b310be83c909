"""The world model of every agent: encoders + dynamics + representation objective + reward and continue heads
(DreamerV3 section 3, eq. 4-5; PlaNet eq. 3 and 7; the current official DreamerV3, e3f0224 ``agent.py:38-58``).

``loss(batch)`` gives per-step losses ``(T, B)`` by name: the representation objective's (one per observation key for
``reconstruction``; ``barlow``; ``infonce``), ``reward``, ``cont`` and the dynamics' own (``dyn``/``rep``,
``kl``/``global_kl``/``overshooting``); the agent owns the scales. The networks are one configuration's
:class:`Nets`: :func:`dreamer_nets` (2023), :func:`planet_nets` (PlaNet's ``conv_ha`` stacks and feed-forward
heads, Gaussian likelihoods) or :func:`dreamer2025_nets` (2025); the decoders go to the
:class:`reverie.models.representation.Reconstruction` objective, which owns them.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from reverie.models.conv import ConvDecoder, ConvEncoder
from reverie.models.conv_simple import SimpleConvDecoder, SimpleConvEncoder
from reverie.models.distributions import Bernoulli, FixedNormal, TwoHotSymexp, TwoHotSymlog, reduce_bits, symlog
from reverie.models.dynamics import BlockRSSM, CategoricalRSSM, Dynamics, State
from reverie.models.networks import MLP
from reverie.models.planet_nets import ConvHaDecoder, ConvHaEncoder, FeedForward
from reverie.models.representation import Reconstruction, make_representation
from reverie.models.rms_mlp import RMSMLP
from reverie.models.storm_nets import StormDecoder, StormEncoder, StormHead
from reverie.models.switch import resolve

LIKELIHOODS = ("symlog", "gaussian")
NETS = ("dreamer", "planet", "storm")
HEAD_INPUTS = ("features", "h", "z")  # what a head reads: cat(h, z), h alone or z alone
HEADS = ("decoder", "reward", "cont")
LOSS_LAYOUTS = ("dreamer", "storm")  # every row's losses (DreamerV3), or STORM's window (WorldModel.storm_loss)


class FeaturePart(nn.Module):
    """``net`` applied to one part of the features ``cat(deter, flat stoch)`` ``(..., F)``: columns
    ``[start, stop)`` (STORM's heads: reward and termination from ``h``, the decoder from ``z``,
    ``world_models.py:390-398``)."""

    def __init__(self, net: nn.Module, start: int, stop: int):
        super().__init__()
        self.net, self.start, self.stop = net, start, stop

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return self.net(feat[..., self.start:self.stop])


def observation_layout(obs_shapes: dict[str, tuple[int, ...]], owner: str = "WorldModel") -> tuple[
        dict[str, tuple[int, ...]], list[str], list[str], tuple[int, int, int] | None]:
    """How a world model reads dict observations: ``(shapes, vector_keys, image_keys, image_shape)`` with the keys
    sorted, vector keys ``(F,)``, image keys ``(C, H, W)`` and ``image_shape`` ``(C_total, H, W)`` of all image keys
    concatenated along channels (None without images).

    Raises:
        ValueError (naming ``owner``): a shape that is neither ``(F,)`` nor ``(C, H, W)``, or image keys of
            different sizes.
    """
    bad = {k: tuple(s) for k, s in obs_shapes.items() if len(s) not in (1, 3)}
    if bad:
        raise ValueError(f"{owner}: observation keys {bad} are neither vectors (F,) nor images (C, H, W); "
                         f"flatten them to vectors or make them uint8 images in the env layer.")
    shapes = {k: tuple(int(v) for v in obs_shapes[k]) for k in sorted(obs_shapes)}
    vector_keys = [k for k, s in shapes.items() if len(s) == 1]
    image_keys = [k for k, s in shapes.items() if len(s) == 3]
    image_shape = None
    if image_keys:
        sides = {shapes[k][1:] for k in image_keys}
        if len(sides) > 1:
            raise ValueError(f"{owner}: image keys {image_keys} have different sizes {sorted(sides)}; "
                             f"they are concatenated along channels, so resize them to one size in the env layer.")
        image_shape = (sum(shapes[k][0] for k in image_keys), *sides.pop())  # (C_total, H, W)
    return shapes, vector_keys, image_keys, image_shape


class ModelLoss(NamedTuple):
    """What :meth:`WorldModel.loss` returns."""

    losses: dict[str, torch.Tensor]  # (T, B) per loss key
    post: State  # (T, B, ...)
    feat: torch.Tensor  # (T, B, F), with gradient
    info: dict[str, torch.Tensor]  # detached diagnostics


class Nets(NamedTuple):
    """The networks of one world-model configuration, as builders (:func:`dreamer_nets`, :func:`planet_nets`,
    :func:`dreamer2025_nets`); ``width`` is the width of the features a head reads."""

    name: str
    image_encoder: Callable[[tuple[int, int, int]], nn.Module]  # (C, H, W) -> module with out_dim
    vector_encoder: Callable[[int], nn.Module]  # F -> module with out_dim
    image_decoder: Callable[[int, tuple[int, int, int], Any], nn.Module]  # (width, (C, H, W), dynamics)
    vector_decoder: Callable[[int, list[int]], nn.Module]  # (width, [F_k]) -> (..., sum F_k)
    reward_head: Callable[[int], nn.Module]
    cont_head: Callable[[int], nn.Module]
    reward: Callable[[torch.Tensor], Any]  # head output -> distribution with .mean
    dynamics: Callable[[int, int, dict, str], Any]  # (action_dim, embed_dim, settings, kernels): the default
    likelihood: str = "symlog"  # the decoders' (Reconstruction)
    decoder_std: float = 1.0


def two_hot_symlog_reward(out: torch.Tensor) -> TwoHotSymlog:
    """The 2023 reward: two-hot symlog over the head's bins ``(..., K)``."""
    return TwoHotSymlog(out)


def two_hot_symexp_reward(out: torch.Tensor) -> TwoHotSymexp:
    """The 2025 reward: two-hot over symexp-spaced bins ``(..., K)`` (``rewhead``)."""
    return TwoHotSymexp(out)


def fixed_normal_reward(out: torch.Tensor, std: float = 1.0) -> FixedNormal:
    """PlaNet's reward: a normal of fixed ``std`` around the head's output ``(..., 1)``."""
    return FixedNormal(out.squeeze(-1), std, event_dims=0)


def categorical_rssm(action_dim: int, embed: int, settings: dict, kernels: str) -> CategoricalRSSM:
    """The 2023 and PlaNet configurations' default dynamics: :class:`CategoricalRSSM` of ``settings``, with the
    model's ``kernels`` unless the settings name their own."""
    return CategoricalRSSM(action_dim, embed, **({"kernels": kernels} | settings))


def block_rssm(action_dim: int, embed: int, settings: dict, kernels: str) -> BlockRSSM:
    """The 2025 configuration's default dynamics: :class:`BlockRSSM` of ``settings`` alone (its own ``kernels``
    setting, as the 2025 agent's config block gives it)."""
    return BlockRSSM(action_dim, embed, **settings)


def dreamer_nets(units: int = 512, layers: int = 2, mlp_units: int | None = None, mlp_layers: int | None = None,
                 cnn_depth: int = 32, cnn: dict | None = None, reward_bins: int = 255, likelihood: str = "symlog",
                 decoder_std: float = 1.0) -> Nets:
    """DreamerV3 2023 (``nets/``: ``ConvEncoder``/``ConvDecoder``, LayerNorm + SiLU :class:`MLP` heads of
    ``units x layers``, the vector encoder/decoder ``mlp_units x mlp_layers``; ``agent.py`` two-hot symlog reward),
    or its networks with PlaNet's Gaussian likelihoods. ValueError: ``mlp_units < 1`` or ``mlp_layers < 0``."""
    vec_units = units if mlp_units is None else int(mlp_units)
    vec_layers = layers if mlp_layers is None else int(mlp_layers)
    if vec_units < 1 or vec_layers < 0:
        raise ValueError(f"WorldModel: mlp_units must be >= 1 and mlp_layers >= 0; got {vec_units}, {vec_layers}")
    gaussian = likelihood == "gaussian"
    return Nets(
        "dreamer",
        image_encoder=lambda shape: ConvEncoder(shape, depth=cnn_depth, **(cnn or {})),
        vector_encoder=lambda dim: MLP(dim, None, units=vec_units, layers=max(vec_layers, 1)),
        image_decoder=lambda width, shape, dyn: ConvDecoder(width, shape, depth=cnn_depth, **(cnn or {})),
        vector_decoder=lambda width, dims: MLP(width, sum(dims), units=vec_units, layers=vec_layers),
        reward_head=lambda width: MLP(width, 1 if gaussian else reward_bins, units=units, layers=layers,
                                      out_scale=0.0, float32_out=not gaussian),  # two-hot logits in float32
        cont_head=lambda width: MLP(width, 1, units=units, layers=layers),
        reward=partial(fixed_normal_reward, std=decoder_std) if gaussian else two_hot_symlog_reward,
        dynamics=categorical_rssm,
        likelihood=likelihood, decoder_std=decoder_std)


def planet_nets(head_units: int = 300, head_layers: int = 3, act: str = "relu", cnn_depth: int = 32,
                decoder_std: float = 1.0) -> Nets:
    """PlaNet (google-research/planet ``networks/conv_ha.py``, ``networks.feed_forward``; ``scripts/configs.py:
    109-116``): ``conv_ha`` stacks (64x64 images only) and ReLU feed-forward networks of ``head_layers x
    head_units``, fixed-std Gaussian likelihoods."""
    def ff(width: int, out: int | None) -> nn.Module:
        return FeedForward(width, out, units=head_units, layers=head_layers if out is not None else
                           max(head_layers, 1), act=act)

    return Nets(
        "planet",
        image_encoder=lambda shape: ConvHaEncoder(shape, depth=cnn_depth),
        vector_encoder=lambda dim: ff(dim, None),
        image_decoder=lambda width, shape, dyn: ConvHaDecoder(width, shape, depth=cnn_depth),
        vector_decoder=lambda width, dims: ff(width, sum(dims)),
        reward_head=lambda width: ff(width, 1),
        cont_head=lambda width: ff(width, 1),
        reward=partial(fixed_normal_reward, std=decoder_std),
        dynamics=categorical_rssm,
        likelihood="gaussian", decoder_std=decoder_std)


def dreamer2025_nets(units: int = 1024, enc_layers: int = 3, dec_layers: int = 3, reward_layers: int = 1,
                     cont_layers: int = 1, cnn_depth: int = 64, cnn: dict | None = None,
                     reward_bins: int = 255) -> Nets:
    """The current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``rssm.py`` ``Encoder``/``Decoder``,
    ``agent.py:38-58``): :class:`SimpleConvEncoder`/:class:`SimpleConvDecoder` (``cnn``; ``bspace`` is the decoder's),
    RMSNorm :class:`RMSMLP` networks of ``units``, one output layer per vector key (``DictHead``, ``rssm.py:297-305``),
    the ``rewhead`` two-hot symexp reward (``outscale`` 0) and the ``conhead`` (``outscale`` 1), the block-GRU RSSM."""
    cnn = dict(cnn or {})
    dec_cnn = {k: cnn.pop(k) for k in ("bspace",) if k in cnn}

    def image_decoder(width: int, shape: tuple[int, int, int], dyn: Any) -> nn.Module:
        deter = getattr(dyn, "deter")
        if width != dyn.feat_dim:
            raise ValueError("WorldModel: the 2025 image decoder reads every feature (head_inputs.decoder=features)")
        return SimpleConvDecoder(deter, width - deter, shape, depth=cnn_depth, units=units, **cnn, **dec_cnn)

    return Nets(
        "dreamer2025",
        image_encoder=lambda shape: SimpleConvEncoder(shape, depth=cnn_depth, **cnn),
        vector_encoder=lambda dim: RMSMLP(dim, None, units, enc_layers),
        image_decoder=image_decoder,
        vector_decoder=lambda width, dims: RMSMLP(width, sum(dims), units, dec_layers, out_split=dims),
        reward_head=lambda width: RMSMLP(width, reward_bins, units, reward_layers, outscale=0.0, float32_out=True),
        cont_head=lambda width: RMSMLP(width, 1, units, cont_layers, outscale=1.0),
        reward=two_hot_symexp_reward,
        dynamics=block_rssm)


def storm_nets(stem: int = 32, units: int | None = None, mlp_units: int = 1024, mlp_layers: int = 5) -> Nets:
    """STORM (weipu-zhang/STORM at 1c50658, ``sub_models/world_models.py``; :mod:`reverie.models.storm_nets`): the
    BatchNorm conv encoder and decoder (``stem`` channels, STORM's 32), the reward and termination heads (two
    LayerNorm-ReLU layers of ``units``, None: the width they read), two-hot symlog reward; vector keys (STORM has
    none) DreamerV3's MLPs of ``mlp_units x mlp_layers``."""
    return Nets(
        "storm",
        image_encoder=lambda shape: StormEncoder(shape, stem=stem),
        vector_encoder=lambda dim: MLP(dim, None, units=mlp_units, layers=max(mlp_layers, 1)),
        image_decoder=lambda width, shape, dyn: StormDecoder(width, shape, stem=stem),
        vector_decoder=lambda width, dims: MLP(width, sum(dims), units=mlp_units, layers=mlp_layers),
        reward_head=lambda width: StormHead(width, 255, units, float32_out=True),
        cont_head=lambda width: StormHead(width, 1, units, negate=True),
        reward=two_hot_symlog_reward,
        dynamics=categorical_rssm)


class WorldModel(nn.Module):
    """Encoders, dynamics, representation objective and reward and continue heads over dict observations of image
    ``(C, H, W)`` (uint8, concatenated along channels, one image encoder, as the reference's ``MultiEncoder``) and
    vector ``(F,)`` keys (concatenated, symlog-squashed, one vector encoder); the embedding is their concatenation
    ``(..., E)``. One class for every agent; the networks are one configuration's :class:`Nets`.

    Args:
        obs_shapes: ``{key: shape}``. action_dim: ``A``.
        dynamics: ``factory(action_dim=A, embed_dim=E) -> Dynamics``, or settings of the configuration's default
            dynamics (a dict), or None (the default: :class:`CategoricalRSSM`; 2025: :class:`BlockRSSM`).
        nets: ``"dreamer"`` (:func:`dreamer_nets` of ``units``, ``layers``, ``mlp_units``, ``mlp_layers``,
            ``cnn_depth``, ``cnn``, ``reward_bins``, ``likelihood``), ``"planet"`` (:func:`planet_nets` of
            ``head_units``, ``head_layers``, ``act``, ``cnn_depth``; ``likelihood="gaussian"`` only; both also of
            ``decoder_std``), or a :class:`Nets` (e.g. :func:`dreamer2025_nets`), which then sets the likelihood
            and ``decoder_std`` itself (the arguments of that name are only checked).
        likelihood, decoder_std: ``"symlog"`` or ``"gaussian"`` (PlaNet: fixed-std Gaussians of ``decoder_std``).
        image_bits: bit depth images are reduced to, with dequantisation noise in training (PlaNet 5; 8: off).
        cont_discount: the continue target ``(1 - is_terminal) * cont_discount`` (2025 ``contdisc``; 1.0: 2023).
        kernels: ``"auto"`` (``install`` may swap in fast modules: the dynamics, the one-hot input layers) or ``"off"``.
        representation, objectives: the representation objective and its settings (docs/representation.md).
        head_inputs: ``{head: part}`` for ``decoder``, ``reward``, ``cont``: ``"features"`` (``cat(h, z)``, the
            default), ``"h"`` or ``"z"`` (STORM: decoder ``z``, reward and cont ``h``), via :class:`FeaturePart`.
        loss_layout: ``"dreamer"`` (every row's losses, :meth:`loss`) or ``"storm"`` (STORM's window,
            :meth:`storm_loss`; a dynamics with ``observe_storm`` and ``storm_loss``, the transformer's).

    Raises:
        ValueError: a shape neither ``(F,)`` nor ``(C, H, W)``; image keys of different sizes; no observation keys;
            an image size the conv stack cannot take; an unknown ``likelihood``, ``nets``, ``kernels``, objective or
            setting; ``nets="planet"`` with ``likelihood="symlog"``; ``decoder_std <= 0``; ``image_bits`` outside
            ``1..8``; an unknown ``head_inputs`` key or part, or ``h``/``z`` of features that are not ``cat(h, z)``;
            an unknown ``loss_layout``, or ``"storm"`` with a dynamics that has no ``observe_storm``.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                 dynamics: Callable[..., Dynamics] | dict | None = None, units: int = 512, layers: int = 2,
                 likelihood: str = "symlog", reward_bins: int = 255, decoder_std: float = 1.0, image_bits: int = 8,
                 cnn_depth: int = 32, cnn: dict | None = None, kernels: str = "auto", nets: str | Nets = "dreamer",
                 head_units: int = 300, head_layers: int = 3, act: str = "relu", mlp_units: int | None = None,
                 mlp_layers: int | None = None, representation: str = "reconstruction",
                 objectives: dict | None = None, head_inputs: dict[str, str] | None = None,
                 cont_discount: float = 1.0, loss_layout: str = "dreamer"):
        super().__init__()
        given = head_inputs if head_inputs is not None else {}
        bad = ([f"{given!r} (not a mapping)"] if not hasattr(given, "items") else
               [f"{k}: {v!r}" for k, v in given.items() if k not in HEADS or v not in HEAD_INPUTS])
        if bad:
            raise ValueError(f"WorldModel: agent.module.head_inputs maps {', '.join(HEADS)} to one of "
                             f"{', '.join(HEAD_INPUTS)}, e.g. {{reward: h}}; bad: {'; '.join(bad)}")
        head_inputs = {h: "features" for h in HEADS} | dict(given)
        if likelihood not in LIKELIHOODS or decoder_std <= 0 or not 1 <= image_bits <= 8:
            raise ValueError(f"WorldModel: need likelihood in {LIKELIHOODS}, decoder_std > 0 and image_bits in 1..8; "
                             f"got {likelihood!r}, {decoder_std}, {image_bits}")
        if isinstance(nets, str) and (nets not in NETS or (nets == "planet" and likelihood != "gaussian") or
                                      (nets == "storm" and likelihood != "symlog")):
            raise ValueError(f"WorldModel: nets must be 'dreamer', 'storm' or, with likelihood='gaussian', 'planet'; "
                             f"got nets={nets!r} with likelihood={likelihood!r}")
        if nets == "dreamer":
            nets = dreamer_nets(units, layers, mlp_units, mlp_layers, cnn_depth, cnn, reward_bins, likelihood,
                                decoder_std)
        elif nets == "planet":
            nets = planet_nets(head_units, head_layers, act, cnn_depth, decoder_std)
        elif nets == "storm":
            nets = storm_nets(cnn_depth, mlp_units=units if mlp_units is None else mlp_units,
                              mlp_layers=layers if mlp_layers is None else mlp_layers)
        elif not isinstance(nets, Nets):
            raise ValueError(f"WorldModel: nets must be 'dreamer', 'planet' or a Nets (e.g. dreamer2025_nets(...)); "
                             f"got {nets!r}")
        self.nets = nets.name
        self.likelihood, self.decoder_std, self.image_bits = nets.likelihood, nets.decoder_std, int(image_bits)
        self.cont_discount = float(cont_discount)
        self._reward = nets.reward
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may swap modules in here
        self.obs_shapes, self.vector_keys, self.image_keys, image_shape = observation_layout(obs_shapes)
        embed = 0
        self.encoder = None  # the vector encoder (name kept from the vector-only model for checkpoints)
        self.image_encoder = None
        if self.image_keys:
            self.image_encoder = nets.image_encoder(image_shape)
            embed += self.image_encoder.out_dim
        if self.vector_keys:
            self.encoder = nets.vector_encoder(self._vector_dim)
            embed += self.encoder.out_dim
        if embed == 0:
            raise ValueError("WorldModel: no observation keys to encode")
        if dynamics is None or isinstance(dynamics, dict):
            self.dynamics = nets.dynamics(action_dim, embed, dict(dynamics or {}), kernels)
        else:
            self.dynamics = dynamics(action_dim=action_dim, embed_dim=embed)
        if loss_layout not in LOSS_LAYOUTS or (loss_layout == "storm" and not all(
                hasattr(self.dynamics, m) for m in ("observe_storm", "storm_loss", "storm_posterior"))):
            raise ValueError(f"WorldModel: loss_layout must be one of {LOSS_LAYOUTS}, and 'storm' needs a dynamics "
                             f"with STORM's window pass (TransformerDynamics); got {loss_layout!r} with "
                             f"{type(self.dynamics).__name__}")
        self.loss_layout = loss_layout
        feat = self.dynamics.feat_dim
        parts = self._feature_parts(head_inputs)

        def head(net: Callable[[int], nn.Module], name: str) -> nn.Module:
            start, stop = parts[head_inputs[name]]
            return net(stop - start) if (start, stop) == (0, feat) else FeaturePart(net(stop - start), start, stop)

        def reconstruction() -> Reconstruction:  # this model's decoders, built only when the objective needs them
            image_decoder = decoder = None
            if self.image_keys:
                image_decoder = head(lambda width: nets.image_decoder(width, image_shape, self.dynamics), "decoder")
            if self.vector_keys:
                dims = [self.obs_shapes[k][0] for k in self.vector_keys]
                decoder = head(lambda width: nets.vector_decoder(width, dims), "decoder")
            return Reconstruction(self.obs_shapes, self.image_keys, self.vector_keys, image_decoder, decoder,
                                  nets.likelihood, nets.decoder_std)

        # between the dynamics and the heads: the parameter order saved optimiser states rely on
        self.representation = make_representation(representation, objectives, feat_dim=feat, embed_dim=embed,
                                                  reconstruction=reconstruction, owner="WorldModel")
        self.register_load_state_dict_pre_hook(decoder_keys_moved)
        self.reward_head = head(nets.reward_head, "reward")
        self.cont_head = head(nets.cont_head, "cont")

    def _feature_parts(self, head_inputs: dict[str, str]) -> dict[str, tuple[int, int]]:
        """``{part: (start, stop)}`` columns of the features; ``h`` and ``z`` only for a dynamics whose features are
        its two :attr:`feature_keys` concatenated, the first of width ``deter`` (every RSSM here, the transformer)."""
        feat = self.dynamics.feat_dim
        if set(head_inputs.values()) == {"features"}:
            return {"features": (0, feat)}
        width = getattr(self.dynamics, "deter", None)
        if len(getattr(self.dynamics, "feature_keys", ())) != 2 or not isinstance(width, int) or not 0 < width < feat:
            raise ValueError(f"WorldModel: head_inputs {head_inputs} needs features cat(h, z); "
                             f"{type(self.dynamics).__name__}'s are not: set every agent.module.head_inputs entry "
                             f"to 'features'")
        return {"features": (0, feat), "h": (0, width), "z": (width, feat)}

    @property
    def _vector_dim(self) -> int:
        return sum(self.obs_shapes[k][0] for k in self.vector_keys)

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """Keys of :meth:`loss`: the representation objective's (the observation keys for ``reconstruction``),
        ``reward``, ``cont``, then the dynamics' ``loss_keys``."""
        return (*self.representation.loss_keys, "reward", "cont", *self.dynamics.loss_keys)

    @property
    def decodes(self) -> bool:
        """Whether the model has decoders (:meth:`decode`): the open-loop report, ``reverie imagine``, ``play``
        and ``eval --openloop`` show decoded observations only then (docs/representation.md)."""
        return bool(self.representation.decodes)

    @property
    def image_decoder(self) -> nn.Module | None:
        """The image decoder of the reconstruction objective; None without image keys or without decoders."""
        return getattr(self.representation, "image_decoder", None)

    @property
    def decoder(self) -> nn.Module | None:
        """The vector (MLP) decoder of the reconstruction objective; None without vector keys or decoders."""
        return getattr(self.representation, "decoder", None)

    def preprocess(self, obs: dict[str, torch.Tensor], noise: bool = False) -> dict[str, torch.Tensor]:
        """Bit-reduce image keys to ``image_bits`` (PlaNet ``preprocess``), other keys unchanged.

        Identity when ``image_bits == 8``. Otherwise image keys become float pixel values (see
        :func:`reverie.models.distributions.reduce_bits`): with uniform dequantisation noise (``noise=True``,
        training) or the bin centres (acting). :meth:`encode` calls it (without noise) on uint8 images itself.
        """
        if self.image_bits >= 8 or not self.image_keys:
            return obs
        return {**obs, **{k: reduce_bits(obs[k], self.image_bits, noise) for k in self.image_keys}}

    def tensors(self, batch: dict) -> dict[str, torch.Tensor]:
        """numpy arrays (or tensors) -> tensors on this model's device, for acting, updates and visualisation: bool
        flags and image keys keep their dtype (uint8 pixels are scaled only inside the image encoder and loss), the
        rest take the parameters' dtype (float32; float64 in the float64 tests). Shapes are unchanged."""
        param = next(self.parameters())
        out = {}
        for k, v in batch.items():
            t = torch.as_tensor(v if torch.is_tensor(v) else np.asarray(v), device=param.device)
            out[k] = t if t.dtype == torch.bool or k in self.image_keys else t.to(param.dtype)
        return out

    def posterior_step(self, data: dict[str, torch.Tensor], prev_action: torch.Tensor, state: State) -> State:
        """One filtering step for acting: observations ``(N, ...)`` with ``is_first (N,)``, the previous action
        ``(N, A)`` and the previous state ``(N, ...)`` -> the state ``(N, ...)`` after it (``observe`` with T = 1, then
        the dynamics' ``truncate``: for an RSSM the posterior row)."""
        embed = self.encode({k: data[k][None] for k in self.obs_shapes})  # (N, ...) -> (1, N, E)
        post, _ = self.dynamics.observe(embed, prev_action[None], data["is_first"][None], state)
        return self.dynamics.truncate(post)  # (1, N, ...) -> (N, ...)

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Observations -> embedding ``(..., E)``, ``E = cnn out + mlp units``.

        Args:
            obs: image keys uint8 ``(..., C, H, W)`` (scaled inside :class:`ConvEncoder`, the one path for
                training, acting and evaluation), vector keys ``(..., F_k)`` (symlog-squashed here); the same
                leading dims for every key, e.g. ``(T, B)`` or ``(1, N)``.
        """
        parts = []
        if self.image_encoder is not None:
            if self.image_bits < 8:  # uint8 pixels get the bin centres; float inputs are already preprocessed
                obs = {**obs, **{k: reduce_bits(obs[k], self.image_bits, noise=False) for k in self.image_keys
                                 if obs[k].dtype == torch.uint8}}
            images = torch.cat([obs[k] for k in self.image_keys], -3)  # k x (..., C_k, H, W) -> (..., C, H, W)
            parts.append(self.image_encoder(images))  # (..., E_cnn)
        if self.encoder is not None:
            x = torch.cat([obs[k] for k in self.vector_keys], -1)  # k x (..., F_k) -> (..., F)
            parts.append(self.encoder(symlog(x)))  # (..., units)
        return torch.cat(parts, -1)

    def reward(self, feat: torch.Tensor) -> TwoHotSymlog | TwoHotSymexp | FixedNormal:
        """Reward distribution ``(...)`` from features ``(..., F)``, the configuration's: two-hot symlog (2023),
        two-hot symexp (2025) or a normal of std ``decoder_std`` (PlaNet); ``.mean`` is the predicted reward."""
        return self._reward(self.reward_head(feat))

    def cont(self, feat: torch.Tensor) -> Bernoulli:
        """Continue (``1 - is_terminal``) distribution ``(...)`` from features ``(..., F)``."""
        return Bernoulli(self.cont_head(feat).squeeze(-1))

    def decode(self, feat: torch.Tensor) -> dict[str, torch.distributions.Distribution]:
        """Reconstruction distributions per observation key from features ``(..., F)``
        (:meth:`reverie.models.representation.Reconstruction.decode`: symlog/MSE or Gaussian per ``likelihood``).

        Raises:
            NoDecoder: the representation objective has no decoders (check :attr:`decodes` first).
        """
        return decode(self, feat)

    def loss(self, batch: dict[str, torch.Tensor], state: State | None = None) -> ModelLoss:
        """Per-step world-model losses on a replay batch (DreamerV3 eq. 4-5; PlaNet eq. 3 and 7).

        Args:
            batch: ``(T, B, ...)`` tensors: observation keys (images uint8 ``(T, B, C, H, W)``, vectors
                ``(T, B, F_k)``), ``prev_action (T, B, A)``, ``reward``, ``is_first``, ``is_terminal`` ``(T, B)``.
            state: dynamics state ``(B, ...)`` before the batch, or None (the initial state).

        Returns:
            :class:`ModelLoss` ``(losses, post, feat, info)``: ``losses[k]`` ``(T, B)`` for every key in
            :attr:`loss_keys` (an image key's sums over ``C x H x W``); the posterior ``(T, B, ...)``; its features
            ``(T, B, F)`` with their gradient; the detached diagnostics (KL, entropies, ``r2/...``). With
            ``image_bits < 8`` the images are bit-reduced with dequantisation noise first (PlaNet).
        """
        if self.loss_layout == "storm":
            return self.storm_loss(batch, state)
        batch = self.preprocess(batch, noise=True)  # image_bits < 8: uint8 -> float pixel values, dequantised
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.dynamics.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.dynamics.features(post)  # (T, B, F)
        losses, rep_info = self.representation.loss(feat, embed, batch)
        losses |= self.head_losses(feat, batch["reward"], batch["is_terminal"])
        dynamics_losses, info = self.dynamics.loss(post, prior, batch["prev_action"], batch["is_first"])
        return ModelLoss(losses | dynamics_losses, post, feat, info | rep_info)

    def head_losses(self, feat: torch.Tensor, reward: torch.Tensor,
                    is_terminal: torch.Tensor) -> dict[str, torch.Tensor]:
        """``reward`` and ``cont`` negative log-likelihoods ``(T, B)`` of the heads on features ``(T, B, F)``
        against ``reward`` and the continue target ``(1 - is_terminal) * cont_discount`` (2025 contdisc)."""
        losses = {"reward": -self.reward(feat).log_prob(reward)}
        cont = self.cont(feat)
        losses["cont"] = -cont.log_prob((1.0 - is_terminal.to(cont.logits.dtype)) * self.cont_discount)
        return losses

    def storm_loss(self, batch: dict[str, torch.Tensor], state: State | None = None) -> ModelLoss:
        """STORM's world-model losses on a window (``loss_layout: storm``; ``world_models.py:378-407`` at 1c50658).

        The ``T`` rows hold STORM's window of ``T - 1`` steps: step ``t`` is ``o_t`` (row ``t``) and what followed
        its action ``a_t``: row ``t + 1``'s ``prev_action``, ``reward``, ``is_terminal`` (reverie's row timing). Row
        ``T - 1``'s observation and row 0's ``prev_action``, ``reward`` and ``is_terminal`` are not read; row 0 has
        no start token (:meth:`observe_storm`: the token of step ``t`` is ``(z_t, a_t)``, ``h_t`` its output).

        Args:
            batch: as :meth:`loss`, ``T >= 3``. state: must be None (a window starts from nothing, as STORM's).

        Returns:
            :class:`ModelLoss`: ``losses`` of the ``T - 1`` steps ``(T-1, B)``, each the loss of STORM's step: the
            reconstruction of ``o_t`` and any representation loss from ``features(steps)`` (``cat(h_t, z_t)``;
            STORM's decoder reads ``z_t`` alone), ``reward`` and ``cont`` of row ``t + 1`` from the same features
            (STORM's heads read ``h_t``); ``dyn`` and ``rep`` scalars ``()`` (free bits on the batch mean,
            ``dynamics.storm_loss``). ``post``: reverie's posterior of rows ``1 .. T-2`` ``(T-2, B, ...)`` (``h``
            and the cache from step ``t - 1``, ``z_t`` from ``o_t``; imagination starts), ``feat`` its features.

        Raises:
            ValueError: ``T < 3`` or a ``state``.
        """
        T = batch["is_first"].shape[0]
        if T < 3 or state is not None:
            raise ValueError(f"WorldModel: loss_layout=storm reads windows of T >= 3 rows from no carried state "
                             f"(STORM's window of T - 1 steps), got T={T}, state={'given' if state else None}")
        batch = self.preprocess(batch, noise=True)
        observed = {k: batch[k][:-1] for k in self.obs_shapes}  # o_0 .. o_{T-2}: (T-1, B, ...)
        embed = self.encode(observed)  # (T-1, B, E): the encoder's batch statistics over these rows alone
        steps, next_ = self.dynamics.observe_storm(embed, batch["prev_action"][1:], batch["is_first"][1:])
        feat = self.dynamics.features(steps)  # (T-1, B, F): cat(h_t, z_t)
        losses, rep_info = self.representation.loss(feat, embed, observed)
        losses |= self.head_losses(feat, batch["reward"][1:], batch["is_terminal"][1:])
        dynamics_losses, info = self.dynamics.storm_loss(steps, next_)
        post = self.dynamics.storm_posterior(steps, next_)  # reverie's posterior of rows 1 .. T-2
        return ModelLoss(losses | dynamics_losses, post, self.dynamics.features(post), info | rep_info)


class NoDecoder(RuntimeError):
    """A world model without decoders was asked to decode (its representation objective is not
    ``reconstruction``); the message names the objective and what to do."""


def decode(wm: nn.Module, feat: torch.Tensor) -> dict[str, torch.distributions.Distribution]:
    """``wm.representation.decode(feat)`` for either world model.

    Raises:
        NoDecoder: the objective has no decoders.
    """
    rep = wm.representation
    if not rep.decodes:
        raise NoDecoder(f"this world model has no decoders: its representation objective is {rep.name!r}, which "
                        f"trains the latent without reconstructing observations; show its latent, reward and "
                        f"continue predictions instead, or train with agent.module.representation=reconstruction")
    return rep.decode(feat)


def decoder_keys_moved(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """``load_state_dict`` pre-hook: checkpoints written before the representation objective was a piece of its own
    kept the decoders at ``<prefix>image_decoder.*`` and ``<prefix>decoder.*``; they now live under
    ``<prefix>representation.`` (the parameters and their order are unchanged, so optimiser states load as they
    are)."""
    for name in ("image_decoder.", "decoder."):
        old = prefix + name
        for key in [k for k in state_dict if k.startswith(old)]:
            state_dict[prefix + "representation." + name + key[len(old):]] = state_dict.pop(key)
