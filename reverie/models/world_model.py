"""World model: encoders + RSSM + decoders, reward and continue heads (DreamerV3 section 3, eq. 4-5).

``loss(batch)`` returns a dict of per-step losses ``(T, B)`` keyed by name; the agent owns the scales
(reference ``loss_scales``: dec/rew/cont 1.0, dyn 0.5, rep 0.1) and checks that the keys match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.distributions import Bernoulli, SymlogMSE, TwoHotSymlog, symlog, unimix_logits
from reverie.models.conv import ConvDecoder, ConvEncoder, ImageMSE
from reverie.models.networks import MLP
from reverie.models.rssm import RSSM, State


def categorical_kl(lhs_logits: torch.Tensor, rhs_logits: torch.Tensor) -> torch.Tensor:
    """``KL(lhs || rhs)`` of independent categoricals ``(..., S, K)`` summed over ``S`` -> ``(...)``.

    Logits are normalised here; apply :func:`unimix_logits` first where the distributions use unimix.
    """
    lhs_logp = F.log_softmax(lhs_logits, -1)
    rhs_logp = F.log_softmax(rhs_logits, -1)
    return (lhs_logp.exp() * (lhs_logp - rhs_logp)).sum((-2, -1))


def kl_losses(post_logits: torch.Tensor, prior_logits: torch.Tensor, free_nats: float = 1.0,
              unimix: float = 0.01) -> dict[str, torch.Tensor]:
    """Dynamics and representation losses with free bits (DreamerV3 eq. 5).

    ``dyn = max(free, KL(sg(post) || prior))`` trains the prior; ``rep = max(free, KL(post || sg(prior)))``
    trains the encoder/posterior. ``free`` clips each ``(t, b)`` KL after summing over latents (reference
    ``dyn_free``/``rep_free``: 1 nat). Inputs: raw RSSM logits ``(T, B, S, K)`` (``unimix`` is applied here, as
    in the latent distributions). Outputs ``(T, B)`` each, plus the unclipped ``kl``.
    """
    post_logits, prior_logits = unimix_logits(post_logits, unimix), unimix_logits(prior_logits, unimix)
    dyn = categorical_kl(post_logits.detach(), prior_logits)
    rep = categorical_kl(post_logits, prior_logits.detach())
    return {"dyn": free_bits(dyn, free_nats), "rep": free_bits(rep, free_nats), "kl": dyn.detach()}


def free_bits(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(free_nats, kl)`` elementwise: no gradient below ``free_nats`` (DreamerV3 eq. 5, "free bits")."""
    return torch.clamp(kl, min=free_nats)


class WorldModel(nn.Module):
    """Encoder, RSSM and heads over dict observations of image and vector keys (multi-modal).

    Image keys (3-dim shapes ``(C, H, W)``, uint8 pixels: :func:`reverie.types.is_image_key`) are concatenated
    along channels and go through one :class:`ConvEncoder` (as the reference's ``MultiEncoder`` does; all
    image keys need the same ``H x W``); vector keys ``(F,)`` are concatenated, symlog-squashed and go
    through the MLP encoder. The embedding is ``cat(cnn, mlp)`` ``(..., E)``. Decoding mirrors this: one
    :class:`ConvDecoder` predicts all image channels (split back per key, :class:`ImageMSE` each) and the
    MLP decoder predicts all vector features (:class:`SymlogMSE` each). Only shapes are known here, so any
    3-dim observation is treated as ``[0, 255]`` pixels.

    Args:
        obs_shapes: ``{key: shape}`` of the observation keys to encode and reconstruct.
        action_dim: ``A``.
        deter, stoch, classes, units, layers, unimix: size preset (DESIGN.md section 4).
        free_nats: free bits of the KL terms (reference 1.0).
        cnn_depth: channel multiplier of the conv stacks (size preset ``cnn_depth``; reference s=32).
        cnn: further :class:`ConvEncoder`/:class:`ConvDecoder` keyword arguments (``channels``, ``kernel``,
            ``stride``, ``padding``, ``min_res``, ``norm``, ``act``); defaults are the reference's.

    Raises:
        ValueError: an observation shape that is neither ``(F,)`` nor ``(C, H, W)``; image keys of different
            sizes; an image size the conv stack cannot take (see :func:`reverie.models.conv.conv_plan`).
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int, deter: int = 512, stoch: int = 32,
                 classes: int = 32, units: int = 512, layers: int = 2, unimix: float = 0.01, free_nats: float = 1.0,
                 reward_bins: int = 255, cnn_depth: int = 32, cnn: dict | None = None):
        super().__init__()
        bad = {k: tuple(s) for k, s in obs_shapes.items() if len(s) not in (1, 3)}
        if bad:
            raise ValueError(f"WorldModel: observation keys {bad} are neither vectors (F,) nor images (C, H, W); "
                             f"flatten them to vectors or make them uint8 images in the env layer.")
        self.obs_shapes = {k: tuple(int(v) for v in obs_shapes[k]) for k in sorted(obs_shapes)}
        self.vector_keys = [k for k, s in self.obs_shapes.items() if len(s) == 1]
        self.image_keys = [k for k, s in self.obs_shapes.items() if len(s) == 3]
        self.free_nats = free_nats
        embed = 0
        self.encoder = self.decoder = None  # vector MLPs (names kept from the vector-only model for checkpoints)
        self.image_encoder = self.image_decoder = None
        if self.image_keys:
            sides = {self.obs_shapes[k][1:] for k in self.image_keys}
            if len(sides) > 1:
                raise ValueError(f"WorldModel: image keys {self.image_keys} have different sizes {sorted(sides)}; "
                                 f"they are concatenated along channels, so resize them to one size in the env layer.")
            image_shape = (sum(self.obs_shapes[k][0] for k in self.image_keys), *sides.pop())  # (C_total, H, W)
            self.image_encoder = ConvEncoder(image_shape, depth=cnn_depth, **(cnn or {}))
            embed += self.image_encoder.out_dim
        if self.vector_keys:
            self.encoder = MLP(self._vector_dim, None, units=units, layers=max(layers, 1))
            embed += self.encoder.out_dim
        if embed == 0:
            raise ValueError("WorldModel: no observation keys to encode")
        self.rssm = RSSM(action_dim, embed, deter=deter, stoch=stoch, classes=classes, units=units, unimix=unimix)
        feat = self.rssm.feat_dim
        if self.image_keys:
            self.image_decoder = ConvDecoder(feat, image_shape, depth=cnn_depth, **(cnn or {}))
        if self.vector_keys:
            self.decoder = MLP(feat, self._vector_dim, units=units, layers=layers)
        self.reward_head = MLP(feat, reward_bins, units=units, layers=layers, out_scale=0.0)
        self.cont_head = MLP(feat, 1, units=units, layers=layers)

    @property
    def _vector_dim(self) -> int:
        return sum(self.obs_shapes[k][0] for k in self.vector_keys)

    @property
    def loss_keys(self) -> tuple[str, ...]:
        return (*self.obs_shapes, "reward", "cont", "dyn", "rep")

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Observations -> embedding ``(..., E)``, ``E = cnn out + mlp units``.

        Args:
            obs: image keys uint8 ``(..., C, H, W)`` (scaled inside :class:`ConvEncoder`, the one path for
                training, acting and evaluation), vector keys ``(..., F_k)`` (symlog-squashed here); the same
                leading dims for every key, e.g. ``(T, B)`` or ``(1, N)``.
        """
        parts = []
        if self.image_encoder is not None:
            images = torch.cat([obs[k] for k in self.image_keys], -3)  # k x (..., C_k, H, W) -> (..., C, H, W)
            parts.append(self.image_encoder(images))  # (..., E_cnn)
        if self.encoder is not None:
            x = torch.cat([obs[k] for k in self.vector_keys], -1)  # k x (..., F_k) -> (..., F)
            parts.append(self.encoder(symlog(x)))  # (..., units)
        return torch.cat(parts, -1)

    def reward(self, feat: torch.Tensor) -> TwoHotSymlog:
        """Reward distribution ``(...)`` from features ``(..., D + S*K)``."""
        return TwoHotSymlog(self.reward_head(feat))

    def cont(self, feat: torch.Tensor) -> Bernoulli:
        """Continue (``1 - is_terminal``) distribution ``(...)`` from features ``(..., D + S*K)``."""
        return Bernoulli(self.cont_head(feat).squeeze(-1))

    def decode(self, feat: torch.Tensor) -> dict[str, SymlogMSE | ImageMSE]:
        """Reconstruction distributions per observation key from features ``(..., D + S*K)``.

        Vector keys: :class:`SymlogMSE` with events ``(F_k,)``. Image keys: :class:`ImageMSE` with events
        ``(C_k, H, W)`` (prediction in the scaled space; ``mode`` is uint8).
        """
        out: dict[str, SymlogMSE | ImageMSE] = {}
        if self.image_decoder is not None:
            pred = self.image_decoder(feat)  # (..., C, H, W), all image keys' channels
            sizes = [self.obs_shapes[k][0] for k in self.image_keys]
            out |= {k: ImageMSE(p) for k, p in zip(self.image_keys, pred.split(sizes, -3))}
        if self.decoder is not None:
            pred = self.decoder(feat)  # (..., F)
            sizes = [self.obs_shapes[k][0] for k in self.vector_keys]
            out |= {k: SymlogMSE(p) for k, p in zip(self.vector_keys, pred.split(sizes, -1))}
        return out

    def loss(self, batch: dict[str, torch.Tensor], state: State | None = None) -> tuple[dict[str, torch.Tensor], State, dict]:
        """Per-step world-model losses on a replay batch (DreamerV3 eq. 4-5).

        Args:
            batch: ``(T, B, ...)`` tensors: observation keys (images uint8 ``(T, B, C, H, W)``, vectors
                ``(T, B, F_k)``), ``prev_action (T, B, A)``, ``reward``, ``is_first``, ``is_terminal`` ``(T, B)``.
            state: RSSM state before the batch, or None.

        Returns:
            ``(losses, posterior, info)``: ``losses[k]`` is ``(T, B)`` for every key in :attr:`loss_keys`
            (an image key's loss is its squared error summed over ``C x H x W`` scaled pixels);
            ``posterior`` states ``(T, B, ...)``; ``info`` holds detached diagnostics (KL, entropies).
        """
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.rssm.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.rssm.feat(post)  # (T, B, D + S*K)
        losses = {k: -dist.log_prob(batch[k]) for k, dist in self.decode(feat).items()}
        losses["reward"] = -self.reward(feat).log_prob(batch["reward"])
        losses["cont"] = -self.cont(feat).log_prob(1.0 - batch["is_terminal"].to(feat.dtype))
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.rssm.unimix)
        losses["dyn"], losses["rep"] = kl["dyn"], kl["rep"]
        with torch.no_grad():
            info = {
                "kl": kl["kl"].mean(),
                "prior_entropy": self.rssm.dist(prior["logits"]).entropy().mean(),
                "post_entropy": self.rssm.dist(post["logits"]).entropy().mean(),
            }
        return losses, post, info
