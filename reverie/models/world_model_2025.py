"""World model of the current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``dreamerv3/agent.py:38-58,
156-186``; ``dreamerv3/rssm.py``): encoders, the block-GRU RSSM, decoders, reward and continue heads.

- Encoder (``rssm.py`` ``Encoder``): vector keys concatenated, symlog-squashed, ``layers`` (3) x ``Linear -> RMSNorm
  -> SiLU`` of ``units``; image keys concatenated along channels through
  :class:`reverie.models.conv_simple.SimpleConvEncoder`; the tokens are both, concatenated.
- Dynamics: :class:`reverie.models.dynamics.BlockRSSM` (or any module with its members, from a factory).
- Decoder (``rssm.py`` ``Decoder``): vectors by ``layers`` (3) hidden layers and a linear output per key, symlog
  squared error (``symlog_mse``); images by :class:`reverie.models.conv_simple.SimpleConvDecoder`, squared error.
- Reward head (``rewhead``): 1 hidden layer, 255 symexp two-hot bins (:class:`TwoHotSymexp`), output scale 0.
- Continue head (``conhead``): 1 hidden layer, Bernoulli logit, output scale 1. Its target is ``(1 - is_terminal)``
  times ``1 - 1/horizon`` with ``contdisc`` (``agent.py:174-177``): the head learns the discount as well.

The decoders belong to the representation objective (:mod:`reverie.models.representation`): with
``representation="reconstruction"`` (the official model) they are built here and handed to it; ``"r2"`` and
``"infonce"`` build none.

``loss`` returns per-row losses ``(T, B)`` keyed by the objective's keys (the observation keys for reconstruction),
``reward``, ``cont``, ``dyn``, ``rep``; the agent owns the scales (official ``loss_scales``: ``rec`` 1 for every
observation key, ``rew`` 1, ``con`` 1, ``dyn`` 1, ``rep`` 0.1).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from reverie.models.dynamics import BlockRSSM, State
from reverie.models.conv_simple import SimpleConvDecoder, SimpleConvEncoder
from reverie.models.distributions import Bernoulli, TwoHotSymexp, symlog
from reverie.models.representation import Reconstruction, make_representation
from reverie.models.rms_mlp import RMSMLP
from reverie.models.switch import resolve
from reverie.models.world_model import WorldModel, decoder_keys_moved, decode, observation_layout


class WorldModel2025(nn.Module):
    """Encoder, dynamics, decoders and heads over dict observations of vector ``(F,)`` and image ``(C, H, W)`` keys.

    Args:
        obs_shapes: ``{key: shape}`` of the observation keys to encode and reconstruct.
        action_dim: ``A``.
        dynamics: a factory ``(action_dim=A, embed_dim=E) -> dynamics`` (a Hydra partial), or a dict of
            :class:`BlockRSSM` keyword arguments (None: its defaults).
        units: width of the encoder, decoder and heads (official ``units``; size presets).
        enc_layers, dec_layers, reward_layers, cont_layers: hidden layers (official 3, 3, 1, 1).
        cnn_depth: channel multiplier of the image stacks (official ``depth``; size presets).
        cnn: further :class:`SimpleConvEncoder`/:class:`SimpleConvDecoder` arguments (``mults``, ``kernel``,
            ``min_res``, ``bspace``).
        reward_bins: bins of the reward head (255). cont_discount: the continue target's factor for living rows
            (``1 - 1/horizon`` with the official ``contdisc``; 1.0 without).
        kernels: ``"auto"``: :func:`reverie.models.kernels.install` may set ``fast`` (the two-hot reward loss's
            kernel, :mod:`reverie.models.kernels.two_hot`); ``"off"``: plain autograd, whatever installs.
        representation, objectives: the representation objective and its settings (as
            :class:`reverie.models.world_model.WorldModel`'s).

    Raises:
        ValueError: an observation shape that is neither ``(F,)`` nor ``(C, H, W)``, image keys of different
            sizes, no observation keys, image sizes the conv stacks cannot take, or an unknown objective or setting.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                 dynamics: Callable[..., Any] | dict | None = None, units: int = 1024, enc_layers: int = 3,
                 dec_layers: int = 3, reward_layers: int = 1, cont_layers: int = 1, cnn_depth: int = 64,
                 cnn: dict | None = None, reward_bins: int = 255, cont_discount: float = 1.0 - 1.0 / 333.0,
                 kernels: str = "auto", representation: str = "reconstruction", objectives: dict | None = None):
        super().__init__()
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may set fast
        self.fast = False  # install: the two-hot reward loss's kernel
        self.obs_shapes, self.vector_keys, self.image_keys, self.image_shape = observation_layout(obs_shapes,
                                                                                                  "WorldModel2025")
        self.cont_discount = float(cont_discount)
        cnn = dict(cnn or {})
        dec_cnn = {k: cnn.pop(k) for k in ("bspace",) if k in cnn}
        embed = 0
        self.encoder = self.image_encoder = None
        if self.image_keys:
            self.image_encoder = SimpleConvEncoder(self.image_shape, depth=cnn_depth, **cnn)
            embed += self.image_encoder.out_dim
        vector_dim = sum(self.obs_shapes[k][0] for k in self.vector_keys)
        if self.vector_keys:
            self.encoder = RMSMLP(vector_dim, None, units, enc_layers)
            embed += self.encoder.out_dim
        if embed == 0:
            raise ValueError("WorldModel2025: no observation keys to encode")
        if dynamics is None or isinstance(dynamics, dict):
            self.dynamics = BlockRSSM(action_dim, embed, **(dynamics or {}))
        else:
            self.dynamics = dynamics(action_dim=action_dim, embed_dim=embed)
        feat = self.dynamics.feat_dim

        def reconstruction() -> Reconstruction:  # the official decoders, built only when the objective needs them
            image_decoder = decoder = None
            if self.image_keys:
                deter = getattr(self.dynamics, "deter")
                image_decoder = SimpleConvDecoder(deter, feat - deter, self.image_shape, depth=cnn_depth, units=units,
                                                  **cnn, **dec_cnn)
            if self.vector_keys:
                # one output layer per vector key (the official DictHead, rssm.py:297-305)
                decoder = RMSMLP(feat, vector_dim, units, dec_layers,
                                 out_split=[self.obs_shapes[k][0] for k in self.vector_keys])
            return Reconstruction(self.obs_shapes, self.image_keys, self.vector_keys, image_decoder, decoder)

        # between the dynamics and the heads: the decoders' place in parameters() (and in saved optimiser states)
        self.representation = make_representation(representation, objectives, feat_dim=feat, embed_dim=embed,
                                                  reconstruction=reconstruction, owner="WorldModel2025")
        self.register_load_state_dict_pre_hook(decoder_keys_moved)
        self.reward_head = RMSMLP(feat, reward_bins, units, reward_layers, outscale=0.0)
        self.cont_head = RMSMLP(feat, 1, units, cont_layers, outscale=1.0)

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """Keys of :meth:`loss`: the objective's (the observation keys for reconstruction), ``reward``, ``cont``,
        then the dynamics' (``dyn``, ``rep``)."""
        return (*self.representation.loss_keys, "reward", "cont", *self.dynamics.loss_keys)

    tensors = WorldModel.tensors  # numpy -> tensors on the device: uint8 images and bool flags kept, rest float32
    posterior_step = WorldModel.posterior_step  # one filtering step for acting (observe with T = 1)
    decodes = WorldModel.decodes  # whether decode() exists: the objective has decoders
    image_decoder = WorldModel.image_decoder  # the objective's decoders, None without them
    decoder = WorldModel.decoder

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Observations ``(..., ...)`` (images uint8 ``(..., C, H, W)``, vectors ``(..., F_k)``) -> tokens
        ``(..., E)``."""
        parts = []
        if self.image_encoder is not None:
            parts.append(self.image_encoder(torch.cat([obs[k] for k in self.image_keys], -3)))  # k x (.., C_k, H, W)
        if self.encoder is not None:
            x = torch.cat([obs[k] for k in self.vector_keys], -1)  # k x (..., F_k) -> (..., F)
            parts.append(self.encoder(symlog(x)))
        return torch.cat(parts, -1)

    def decode(self, feat: torch.Tensor) -> dict[str, torch.distributions.Distribution]:
        """Reconstruction distributions per observation key from features ``(..., F)``: :class:`ImageMSE`
        ``(C_k, H, W)`` and :class:`SymlogMSE` ``(F_k,)`` events.

        Raises:
            reverie.models.world_model.NoDecoder: the objective has no decoders.
        """
        return decode(self, feat)

    def reward(self, feat: torch.Tensor) -> TwoHotSymexp:
        """Reward distribution ``(...)`` from features ``(..., F)``; ``.mean`` is the predicted reward."""
        return TwoHotSymexp(self.reward_head(feat), fast=self.fast)  # kernels: the sparse two-hot backward

    def cont(self, feat: torch.Tensor) -> Bernoulli:
        """Continue distribution ``(...)``; its probability is ``(1 - is_terminal)`` times the continue discount."""
        return Bernoulli(self.cont_head(feat).squeeze(-1))

    def loss(self, batch: dict[str, torch.Tensor],
             state: State | None = None) -> tuple[dict[str, torch.Tensor], State, torch.Tensor, dict]:
        """Per-row world-model losses on a replay batch.

        Args:
            batch: ``(T, B, ...)`` observation keys, ``prev_action (T, B, A)``, ``reward``, ``is_first``,
                ``is_terminal`` ``(T, B)``.
            state: the dynamics state before row 0 ``(B, ...)`` (replay context), or None (initial state).

        Returns:
            ``(losses, posterior, feat, info)``: ``losses[k]`` ``(T, B)`` for every key in :attr:`loss_keys`,
            posterior states ``(T, B, ...)``, their features ``(T, B, F)`` (with gradient: the replay value loss
            trains the representation through them) and detached diagnostics.
        """
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.dynamics.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.dynamics.features(post)  # (T, B, F)
        losses, rep_info = self.representation.loss(feat, embed, batch)
        losses["reward"] = -self.reward(feat).log_prob(batch["reward"])
        cont = (1.0 - batch["is_terminal"].float()) * self.cont_discount  # (T, B)
        losses["cont"] = -self.cont(feat).log_prob(cont)
        dyn_losses, info = self.dynamics.loss(post, prior, batch["prev_action"], batch["is_first"])
        return losses | dyn_losses, post, feat, info | rep_info
