"""World model of the current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``dreamerv3/agent.py:38-58,
156-186``; ``dreamerv3/rssm.py`` ``Encoder``, ``Decoder``): encoders, the block-GRU RSSM, the representation
objective's decoders, the reward head (``rewhead``, :class:`TwoHotSymexp`) and the continue head (``conhead``, target
``(1 - is_terminal) * (1 - 1/horizon)`` with ``contdisc``, ``agent.py:174-177``).
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

    ``dynamics``: a factory ``(action_dim=A, embed_dim=E) -> dynamics`` or :class:`BlockRSSM` keyword arguments;
    ``cnn``: further :class:`SimpleConvEncoder`/:class:`SimpleConvDecoder` arguments. ValueError: an observation
    shape neither ``(F,)`` nor ``(C, H, W)``, image keys of different sizes, no observation keys, image sizes the
    conv stacks cannot take, or an unknown objective or setting.
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
            if self.vector_keys:  # one output layer per vector key (the official DictHead, rssm.py:297-305)
                decoder = RMSMLP(feat, vector_dim, units, dec_layers,
                                 out_split=[self.obs_shapes[k][0] for k in self.vector_keys])
            return Reconstruction(self.obs_shapes, self.image_keys, self.vector_keys, image_decoder, decoder)

        # between the dynamics and the heads: the parameter order saved optimiser states rely on
        self.representation = make_representation(representation, objectives, feat_dim=feat, embed_dim=embed,
                                                  reconstruction=reconstruction, owner="WorldModel2025")
        self.register_load_state_dict_pre_hook(decoder_keys_moved)
        self.reward_head = RMSMLP(feat, reward_bins, units, reward_layers, outscale=0.0)
        self.cont_head = RMSMLP(feat, 1, units, cont_layers, outscale=1.0)

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """Keys of :meth:`loss`: the objective's, ``reward``, ``cont``, then the dynamics' (``dyn``, ``rep``)."""
        return (*self.representation.loss_keys, "reward", "cont", *self.dynamics.loss_keys)

    tensors = WorldModel.tensors  # numpy -> tensors on the device: uint8 images and bool flags kept, rest float32
    posterior_step = WorldModel.posterior_step  # one filtering step for acting (observe with T = 1)
    decodes = WorldModel.decodes  # whether decode() exists: the objective has decoders
    image_decoder = WorldModel.image_decoder  # the objective's decoders, None without them
    decoder = WorldModel.decoder

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Observations (images uint8 ``(..., C, H, W)``, vectors ``(..., F_k)``) -> tokens ``(..., E)``."""
        parts = []
        if self.image_encoder is not None:
            parts.append(self.image_encoder(torch.cat([obs[k] for k in self.image_keys], -3)))  # k x (.., C_k, H, W)
        if self.encoder is not None:
            x = torch.cat([obs[k] for k in self.vector_keys], -1)  # k x (..., F_k) -> (..., F)
            parts.append(self.encoder(symlog(x)))
        return torch.cat(parts, -1)

    def decode(self, feat: torch.Tensor) -> dict[str, torch.distributions.Distribution]:
        """``{key: distribution}`` from features ``(..., F)``; ``NoDecoder`` without decoders."""
        return decode(self, feat)

    def reward(self, feat: torch.Tensor) -> TwoHotSymexp:
        """Reward distribution ``(...)`` from features ``(..., F)``; ``.mean`` is the predicted reward."""
        return TwoHotSymexp(self.reward_head(feat), fast=self.fast)  # kernels: the sparse two-hot backward

    def cont(self, feat: torch.Tensor) -> Bernoulli:
        """Continue distribution ``(...)`` from features ``(..., F)``."""
        return Bernoulli(self.cont_head(feat).squeeze(-1))

    def loss(self, batch: dict[str, torch.Tensor],
             state: State | None = None) -> tuple[dict[str, torch.Tensor], State, torch.Tensor, dict]:
        """``(losses {k: (T, B)}, posterior (T, B, ...), feat (T, B, F) with gradient, info)`` on a replay batch
        ``(T, B, ...)``, from ``state`` ``(B, ...)`` before row 0 or the initial state."""
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.dynamics.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.dynamics.features(post)  # (T, B, F)
        losses, rep_info = self.representation.loss(feat, embed, batch)
        losses["reward"] = -self.reward(feat).log_prob(batch["reward"])
        cont = (1.0 - batch["is_terminal"].float()) * self.cont_discount  # (T, B)
        losses["cont"] = -self.cont(feat).log_prob(cont)
        dyn_losses, info = self.dynamics.loss(post, prior, batch["prev_action"], batch["is_first"])
        return losses | dyn_losses, post, feat, info | rep_info
