"""World model: encoders + dynamics + decoders, reward and continue heads (DreamerV3 section 3, eq. 4-5; PlaNet).

``loss(batch)`` returns a dict of per-step losses ``(T, B)`` keyed by name: the representation objective's
(:mod:`reverie.models.representation`: one per observation key for ``reconstruction``, the decoders' negative
log-likelihood; ``barlow`` for ``r2``; ``infonce``), ``reward``, ``cont``, and the dynamics' own (``dyn``/``rep`` of
the categorical RSSM, ``kl``/``global_kl``/``overshooting`` of the Gaussian one); the agent owns the scales
(reference ``loss_scales``: dec/rew/cont 1.0, dyn 0.5, rep 0.1).

Two families of output distributions (``likelihood``): ``"symlog"`` (DreamerV3: symlog squared error for vectors,
squared error for images, a two-hot symlog categorical for the reward) and ``"gaussian"`` (PlaNet: fixed-std
Gaussians, ``decoder_std``, with images bit-reduced to ``image_bits`` with dequantisation noise). Two families of
networks (``nets``): ``"dreamer"`` (the DreamerV3 conv stacks and LayerNorm + SiLU MLPs) and ``"planet"`` (PlaNet's own
``conv_ha`` stacks and ReLU feed-forward heads, :mod:`reverie.models.planet_nets`). Both switches pick the encoders
and the reward head as well as the decoders, so they stay here; the decoders they build are handed to the
:class:`reverie.models.representation.Reconstruction` objective, which owns them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from reverie.models.conv import ConvDecoder, ConvEncoder
from reverie.models.distributions import Bernoulli, FixedNormal, TwoHotSymlog, reduce_bits, symlog
from reverie.models.dynamics import CategoricalRSSM, Dynamics, State
from reverie.models.networks import MLP
from reverie.models.planet_nets import ConvHaDecoder, ConvHaEncoder, FeedForward
from reverie.models.representation import Reconstruction, make_representation
from reverie.models.switch import resolve

LIKELIHOODS = ("symlog", "gaussian")
NETS = ("dreamer", "planet")
HEAD_INPUTS = ("features", "h", "z")  # what a head reads: cat(h, z), h alone or z alone
HEADS = ("decoder", "reward", "cont")


class FeaturePart(nn.Module):
    """``net`` applied to one part of the features ``cat(deter, flat stoch)`` ``(..., F)``: columns
    ``[start, stop)`` (STORM's heads: reward and termination from ``h``, the decoder from ``z``,
    ``world_models.py:390-398``)."""

    def __init__(self, net: nn.Module, start: int, stop: int):
        super().__init__()
        self.net, self.start, self.stop = net, start, stop

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        if not torch.is_tensor(feat):  # the one-hot kernel's split features: the dense tensor
            feat = feat.dense()
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


class WorldModel(nn.Module):
    """Encoder, dynamics and heads over dict observations of image and vector keys (multi-modal).

    Image keys (3-dim shapes ``(C, H, W)``, uint8 pixels: :func:`reverie.types.is_image_key`) are concatenated
    along channels and go through one :class:`ConvEncoder` (as the reference's ``MultiEncoder`` does; all
    image keys need the same ``H x W``); vector keys ``(F,)`` are concatenated, symlog-squashed and go
    through the MLP encoder. The embedding is ``cat(cnn, mlp)`` ``(..., E)``. The dynamics turn embeddings and
    actions into states and features ``(..., F)``; decoding mirrors the encoders: one :class:`ConvDecoder`
    predicts all image channels (split back per key) and the MLP decoder all vector features. Only shapes are
    known here, so any 3-dim observation is treated as ``[0, 255]`` pixels.

    Args:
        obs_shapes: ``{key: shape}`` of the observation keys to encode and reconstruct.
        action_dim: ``A``.
        dynamics: ``factory(action_dim=A, embed_dim=E) -> Dynamics`` (:mod:`reverie.models.dynamics`; e.g.
            ``functools.partial(CategoricalRSSM, deter=256)``, or the config's ``_partial_`` block); None: a
            :class:`CategoricalRSSM` with the reference's defaults and this model's ``kernels``.
        units, layers: width and depth of the reward and continue heads (size presets).
        mlp_units, mlp_layers: width and depth of the vector (MLP) encoder and decoder; None: ``units`` /
            ``layers``. The 2023 reference keeps them at 1024 x 5 at every size (``configs.yaml`` ``encoder`` /
            ``decoder`` ``mlp_units``/``mlp_layers``: its size presets' patterns ``.*\\.units`` and ``.*\\.layers``
            do not match these keys).
        likelihood: ``"symlog"`` (DreamerV3) or ``"gaussian"`` (PlaNet; see the module docstring).
        reward_bins: bins of the two-hot reward head (``"symlog"``; reference 255).
        decoder_std: fixed std of the Gaussian observation and reward likelihoods (``"gaussian"``; PlaNet 1.0).
        image_bits: bit depth images are reduced to with dequantisation noise (PlaNet 5; 8 keeps the pixels).
        cnn_depth: channel multiplier of the conv stacks (size preset ``cnn_depth``; reference s=32).
        cnn: further :class:`ConvEncoder`/:class:`ConvDecoder` keyword arguments (``channels``, ``kernel``,
            ``stride``, ``padding``, ``min_res``, ``norm``, ``act``); defaults are the reference's.
        kernels: ``"auto"``: :func:`reverie.models.kernels.install` may set ``fast`` (the two-hot reward loss's
            kernel, :mod:`reverie.models.kernels.two_hot`); ``"off"``: plain autograd, whatever installs.
        nets: ``"dreamer"`` (:class:`ConvEncoder`/:class:`ConvDecoder` and :class:`MLP` heads of ``units x layers``)
            or ``"planet"`` (with ``likelihood="gaussian"``: PlaNet's ``conv_ha`` :class:`ConvHaEncoder`/
            :class:`ConvHaDecoder` with channel multiplier ``cnn_depth``, 64x64 images only, and :class:`FeedForward`
            reward/continue heads and vector encoder/decoder of ``head_layers x head_units`` with ``act``; ``cnn``,
            ``units`` and ``layers`` are then unused).
        head_units, head_layers, act: PlaNet's feed-forward networks (reference ``num_units`` 300, ``num_layers`` 3,
            ``activation`` relu; google-research/planet ``scripts/configs.py:109-116``); ``nets="planet"`` only.
        representation: the representation objective (:mod:`reverie.models.representation`): ``"reconstruction"``
            (decoders of this model's ``nets`` and ``likelihood``), ``"r2"`` or ``"infonce"`` (no decoders).
        objectives: the objectives' settings, ``{name: {setting: value}}`` (``agent.module.objectives``).
        head_inputs: ``{head: part}`` for ``decoder``, ``reward``, ``cont``: ``"features"`` (``cat(h, z)``, the
            default), ``"h"`` (the deterministic part) or ``"z"`` (the latent) (STORM: decoder ``z``, reward and
            cont ``h``); a partial head is a :class:`FeaturePart` around the network.

    Raises:
        ValueError: an observation shape that is neither ``(F,)`` nor ``(C, H, W)``; image keys of different
            sizes; an image size the conv stack cannot take (see :func:`reverie.models.conv.conv_plan`); an
            unknown ``likelihood``, ``nets`` or ``kernels``; ``nets="planet"`` with ``likelihood="symlog"``;
            ``decoder_std <= 0`` or ``image_bits`` outside ``1..8``; an unknown objective or setting; an unknown
            ``head_inputs`` key or part, or a part of a dynamics whose features are not ``cat(h, flat z)``.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                 dynamics: Callable[..., Dynamics] | None = None, units: int = 512, layers: int = 2,
                 likelihood: str = "symlog", reward_bins: int = 255, decoder_std: float = 1.0, image_bits: int = 8,
                 cnn_depth: int = 32, cnn: dict | None = None, kernels: str = "auto", nets: str = "dreamer",
                 head_units: int = 300, head_layers: int = 3, act: str = "relu", mlp_units: int | None = None,
                 mlp_layers: int | None = None, representation: str = "reconstruction",
                 objectives: dict | None = None, head_inputs: dict[str, str] | None = None):
        super().__init__()
        head_inputs = {h: "features" for h in HEADS} | dict(head_inputs or {})
        if set(head_inputs) - set(HEADS) or set(head_inputs.values()) - set(HEAD_INPUTS):
            raise ValueError(f"WorldModel: head_inputs maps {HEADS} to one of {HEAD_INPUTS}; got "
                             f"{dict(head_inputs)} (agent.module.head_inputs)")
        if likelihood not in LIKELIHOODS or decoder_std <= 0 or not 1 <= image_bits <= 8:
            raise ValueError(f"WorldModel: need likelihood in {LIKELIHOODS}, decoder_std > 0 and image_bits in 1..8; "
                             f"got {likelihood!r}, {decoder_std}, {image_bits}")
        if nets not in NETS or (nets == "planet" and likelihood != "gaussian"):
            raise ValueError(f"WorldModel: nets must be 'dreamer' or, with likelihood='gaussian', 'planet'; got "
                             f"nets={nets!r} with likelihood={likelihood!r}")
        self.nets = nets
        self.likelihood, self.decoder_std, self.image_bits = likelihood, float(decoder_std), int(image_bits)
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may set fast
        self.fast = False  # install: the two-hot reward loss's kernel
        self.obs_shapes, self.vector_keys, self.image_keys, image_shape = observation_layout(obs_shapes)
        embed = 0
        self.encoder = None  # the vector MLP (name kept from the vector-only model for checkpoints)
        self.image_encoder = None
        if self.image_keys:
            self.image_encoder = (ConvHaEncoder(image_shape, depth=cnn_depth) if nets == "planet"
                                  else ConvEncoder(image_shape, depth=cnn_depth, **(cnn or {})))
            embed += self.image_encoder.out_dim

        vec_units = units if mlp_units is None else int(mlp_units)
        vec_layers = layers if mlp_layers is None else int(mlp_layers)
        if vec_units < 1 or vec_layers < 0:
            raise ValueError(f"WorldModel: mlp_units must be >= 1 and mlp_layers >= 0; got {vec_units}, {vec_layers}")

        def mlp(in_dim: int, out_dim: int | None, depth: int, out_scale: float = 1.0, width: int = units
                ) -> nn.Module:
            if nets == "planet":  # reference networks.feed_forward (scripts/configs.py:112-116)
                return FeedForward(in_dim, out_dim, units=head_units,
                                   layers=head_layers if out_dim is not None else max(head_layers, 1), act=act)
            return MLP(in_dim, out_dim, units=width, layers=depth, out_scale=out_scale)

        if self.vector_keys:
            self.encoder = mlp(self._vector_dim, None, max(vec_layers, 1), width=vec_units)
            embed += self.encoder.out_dim
        if embed == 0:
            raise ValueError("WorldModel: no observation keys to encode")
        if dynamics is None:
            self.dynamics = CategoricalRSSM(action_dim, embed, kernels=kernels)
        else:
            self.dynamics = dynamics(action_dim=action_dim, embed_dim=embed)
        feat = self.dynamics.feat_dim
        parts = self._feature_parts(head_inputs)

        def head(net: Callable[[int], nn.Module], name: str) -> nn.Module:
            start, stop = parts[head_inputs[name]]
            return net(stop - start) if (start, stop) == (0, feat) else FeaturePart(net(stop - start), start, stop)

        def reconstruction() -> Reconstruction:  # this model's decoders, built only when the objective needs them
            image_decoder = decoder = None
            if self.image_keys:
                image_decoder = head(lambda width: ConvHaDecoder(width, image_shape, depth=cnn_depth)
                                     if nets == "planet" else
                                     ConvDecoder(width, image_shape, depth=cnn_depth, **(cnn or {})), "decoder")
            if self.vector_keys:
                decoder = head(lambda width: mlp(width, self._vector_dim, vec_layers, width=vec_units), "decoder")
            return Reconstruction(self.obs_shapes, self.image_keys, self.vector_keys, image_decoder, decoder,
                                  likelihood, decoder_std)

        # registered between the dynamics and the heads: the decoders' parameters keep their place in
        # parameters() (and so in saved optimiser states) from before the objective was a piece of its own
        self.representation = make_representation(representation, objectives, feat_dim=feat, embed_dim=embed,
                                                  reconstruction=reconstruction, owner="WorldModel")
        self.register_load_state_dict_pre_hook(decoder_keys_moved)
        self.reward_head = head(lambda width: mlp(width, reward_bins if likelihood == "symlog" else 1, layers,
                                                  out_scale=0.0), "reward")
        self.cont_head = head(lambda width: mlp(width, 1, layers), "cont")

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

    def reward(self, feat: torch.Tensor) -> TwoHotSymlog | FixedNormal:
        """Reward distribution ``(...)`` from features ``(..., F)``: two-hot symlog (``"symlog"``) or a normal with
        std ``decoder_std`` (``"gaussian"``); ``.mean`` is the predicted reward either way."""
        if self.likelihood == "gaussian":
            return FixedNormal(self.reward_head(feat).squeeze(-1), self.decoder_std, event_dims=0)
        return TwoHotSymlog(self.reward_head(feat), fast=self.fast)  # kernels: the sparse two-hot backward

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

    def loss(self, batch: dict[str, torch.Tensor],
             state: State | None = None) -> tuple[dict[str, torch.Tensor], State, dict[str, torch.Tensor]]:
        """Per-step world-model losses on a replay batch (DreamerV3 eq. 4-5; PlaNet eq. 3 and 7).

        Args:
            batch: ``(T, B, ...)`` tensors: observation keys (images uint8 ``(T, B, C, H, W)``, vectors
                ``(T, B, F_k)``), ``prev_action (T, B, A)``, ``reward``, ``is_first``, ``is_terminal`` ``(T, B)``.
            state: dynamics state before the batch, or None.

        Returns:
            ``(losses, posterior, info)``: ``losses[k]`` is ``(T, B)`` for every key in :attr:`loss_keys` (an
            image key's loss sums over ``C x H x W`` scaled pixels); ``posterior`` states ``(T, B, ...)``; ``info``
            the dynamics' and the objective's detached diagnostics (the unclipped KL, entropies, ``r2/...``). With
            ``image_bits < 8`` the images are bit-reduced with dequantisation noise first (PlaNet).
        """
        batch = self.preprocess(batch, noise=True)  # image_bits < 8: uint8 -> float pixel values, dequantised
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.dynamics.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.dynamics.features(post)  # (T, B, F)
        losses, rep_info = self.representation.loss(feat, embed, batch)
        losses["reward"] = -self.reward(feat).log_prob(batch["reward"])
        cont = self.cont(feat)
        losses["cont"] = -cont.log_prob(1.0 - batch["is_terminal"].to(cont.logits.dtype))
        dynamics_losses, info = self.dynamics.loss(post, prior, batch["prev_action"], batch["is_first"])
        return losses | dynamics_losses, post, info | rep_info


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
