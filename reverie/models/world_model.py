"""World model: encoders + RSSM + decoders, reward and continue heads (DreamerV3 section 3, eq. 4-5; PlaNet).

``loss(batch)`` returns a dict of per-step losses ``(T, B)`` keyed by name; the agent owns the scales
(reference ``loss_scales``: dec/rew/cont 1.0, dyn 0.5, rep 0.1) and checks that the keys match.

With ``latent="gaussian"`` (PlaNet, Hafner et al. 2019) the decoders are fixed-std Gaussians
(``decoder_std``), images are bit-reduced with dequantisation noise (``image_bits``), and the KL terms are
``kl`` (posterior to the temporal prior, with ``free_nats``), ``global_kl`` (posterior to a standard normal)
and, with ``overshooting > 0``, ``overshooting`` (latent overshooting, PlaNet section 4 / eq. 7).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.distributions import (Bernoulli, FixedNormal, GaussianImage, SymlogMSE, TwoHotSymlog,
                                         reduce_bits, symlog, unimix_logits)
from reverie.models.conv import ConvDecoder, ConvEncoder, ImageMSE
from reverie.models.networks import MLP
from reverie.models.onehot_linear import SplitFeat
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
    in the latent distributions). Outputs ``(T, B)`` each, plus the unclipped ``kl`` and the entropies
    ``post_entropy``/``prior_entropy`` (no gradient).
    """
    # unimix_logits are normalised log-probabilities: categorical_kl's log_softmax would return them unchanged,
    # so the KL is written out once on them (the same numbers, a quarter of the passes over (T, B, S, K)).
    # float32 as every distribution (the logits come from 16-bit layers under autocast)
    post_logp, prior_logp = unimix_logits(post_logits.float(), unimix), unimix_logits(prior_logits.float(), unimix)
    post_p = post_logp.exp()
    post_p_sg, post_logp_sg, prior_logp_sg = post_p.detach(), post_logp.detach(), prior_logp.detach()
    dyn = (post_p_sg * (post_logp_sg - prior_logp)).sum((-2, -1))
    rep = (post_p * (post_logp - prior_logp_sg)).sum((-2, -1))
    with torch.no_grad():  # entropies of the unimix latent distributions, summed over S (summaries)
        post_entropy = -(post_p_sg * post_logp_sg).sum((-2, -1))
        prior_entropy = -(prior_logp_sg.exp() * prior_logp_sg).sum((-2, -1))
    return {"dyn": free_bits(dyn, free_nats), "rep": free_bits(rep, free_nats), "kl": dyn.detach(),
            "post_entropy": post_entropy, "prior_entropy": prior_entropy}


def free_bits(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(free_nats, kl)`` elementwise: no gradient below ``free_nats`` (DreamerV3 eq. 5, "free bits")."""
    return torch.clamp(kl, min=free_nats)


def gaussian_kl(lhs: State, rhs: State) -> torch.Tensor:
    """``KL(N(lhs.mean, lhs.std) || N(rhs.mean, rhs.std))`` summed over ``Z``: ``(..., Z)`` -> ``(...)``.

    ``rhs`` may hold plain floats or broadcastable tensors (e.g. the global prior ``mean 0, std 1``).
    """
    var_ratio = (lhs["std"] / rhs["std"]) ** 2
    t1 = ((lhs["mean"] - rhs["mean"]) / rhs["std"]) ** 2
    return (0.5 * (var_ratio + t1 - 1.0 - torch.log(var_ratio))).sum(-1)


def overshooting_kl(rssm: RSSM, post: State, prev_action: torch.Tensor, is_first: torch.Tensor,
                    distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent overshooting KLs (PlaNet section 4, eq. 7): open-loop priors ``d = 1..distance`` steps ahead.

    For every start ``t - d`` the prior is rolled forward with the observed actions from the posterior at
    ``t - d`` (with gradient) to time ``t`` and compared with the posterior at ``t``, whose gradient is stopped
    (as in the reference): ``kl[d-1, t] = KL(sg(q(s_t | o_<=t)) || p(s_t | s_{t-d}, a_{t-d:t}))``.
    Distance 1 is the standard one-step KL (same value and prior-side gradient as :func:`gaussian_kl` of
    ``observe``'s posterior and prior).

    Args:
        rssm: a Gaussian :class:`RSSM`.
        post: posterior states ``(T, B, ...)`` from :meth:`RSSM.observe`.
        prev_action: ``(T, B, A)``; ``prev_action[t]`` leads into ``t``.
        is_first: ``(T, B)`` bool; a chain never crosses a step where ``is_first`` is set.
        distance: ``D >= 1``.

    Returns:
        ``(kl, mask)``, both ``(D, T, B)``: ``mask[d-1, t]`` is 1 where a prediction ``d`` steps ahead exists
        (``t >= d`` and no ``is_first`` in ``t-d+1 .. t``); ``kl`` is 0 elsewhere.

    Raises:
        ValueError: ``distance < 1`` or a categorical RSSM.
    """
    if distance < 1:
        raise ValueError(f"overshooting_kl: distance must be >= 1, got {distance}")
    if rssm.latent != "gaussian":
        raise ValueError("overshooting_kl needs RSSM(latent='gaussian') (PlaNet latent overshooting)")
    T, B = is_first.shape
    kl = post["mean"].new_zeros(distance, T, B)
    mask = torch.zeros_like(kl)
    target = {k: post[k].detach() for k in ("mean", "std")}
    cur, valid = post, torch.ones_like(is_first)  # cur[i]: state at time i + d - 1 started from post[i]
    for d in range(1, min(distance, T - 1) + 1):
        n = T - d
        start = {k: v[:n].flatten(0, 1) for k, v in cur.items()}  # (n, B, ...) -> (n*B, ...)
        step = rssm.img_step(start, prev_action[d:].flatten(0, 1), sample=True)
        cur = {k: v.unflatten(0, (n, B)) for k, v in step.items()}  # (n*B, ...) -> (n, B, ...)
        valid = valid[:n] & ~is_first[d:]  # (n, B)
        div = gaussian_kl({k: v[d:] for k, v in target.items()}, cur)  # (n, B)
        kl[d - 1, d:] = div * valid
        mask[d - 1, d:] = valid.to(kl.dtype)
    return kl, mask


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
        free_nats: free bits of the KL terms (DreamerV3 reference 1.0; PlaNet ``free_nats`` 3.0).
        latent: ``"categorical"`` (DreamerV3) or ``"gaussian"`` (PlaNet; ``stoch`` is then ``Z``).
        min_std: Gaussian latent std floor (PlaNet 0.1). decoder_std: fixed std of the Gaussian observation
            and reward likelihoods (PlaNet 1.0). image_bits: bit depth of images for the Gaussian model
            (PlaNet 5; 8 keeps the pixels). overshooting: latent overshooting distance ``D`` (0: off).
        onehot_gather: categorical latents enter the heads' and the RSSM cell's first layers by row gathers
            (:mod:`reverie.models.onehot_linear`; same values up to float rounding). False: dense features.
        cnn_depth: channel multiplier of the conv stacks (size preset ``cnn_depth``; reference s=32).
        cnn: further :class:`ConvEncoder`/:class:`ConvDecoder` keyword arguments (``channels``, ``kernel``,
            ``stride``, ``padding``, ``min_res``, ``norm``, ``act``); defaults are the reference's.

    Raises:
        ValueError: an observation shape that is neither ``(F,)`` nor ``(C, H, W)``; image keys of different
            sizes; an image size the conv stack cannot take (see :func:`reverie.models.conv.conv_plan`).
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int, deter: int = 512, stoch: int = 32,
                 classes: int = 32, units: int = 512, layers: int = 2, unimix: float = 0.01, free_nats: float = 1.0,
                 reward_bins: int = 255, cnn_depth: int = 32, cnn: dict | None = None, latent: str = "categorical",
                 min_std: float = 0.1, decoder_std: float = 1.0, image_bits: int = 8, overshooting: int = 0,
                 onehot_gather: bool = True):
        super().__init__()
        if latent == "gaussian" and (decoder_std <= 0 or not 1 <= image_bits <= 8 or overshooting < 0):
            raise ValueError(f"WorldModel(latent='gaussian'): need decoder_std > 0, image_bits in 1..8 and "
                             f"overshooting >= 0; got {decoder_std}, {image_bits}, {overshooting}")
        self.latent, self.decoder_std, self.image_bits = latent, float(decoder_std), int(image_bits)
        self.overshooting = int(overshooting)
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
        self.rssm = RSSM(action_dim, embed, deter=deter, stoch=stoch, classes=classes, units=units, unimix=unimix,
                         latent=latent, min_std=min_std, onehot_gather=onehot_gather)
        feat = self.rssm.feat_dim
        if self.image_keys:
            self.image_decoder = ConvDecoder(feat, image_shape, depth=cnn_depth, **(cnn or {}))
        if self.vector_keys:
            self.decoder = MLP(feat, self._vector_dim, units=units, layers=layers)
        self.reward_head = MLP(feat, reward_bins if latent == "categorical" else 1, units=units, layers=layers,
                               out_scale=0.0)
        self.cont_head = MLP(feat, 1, units=units, layers=layers)

    @property
    def _vector_dim(self) -> int:
        return sum(self.obs_shapes[k][0] for k in self.vector_keys)

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """Keys of :meth:`loss`: observation keys, ``reward``, ``cont``, then ``dyn, rep`` (categorical) or
        ``kl, global_kl`` (+ ``overshooting`` when on) (gaussian)."""
        if self.latent == "gaussian":
            return (*self.obs_shapes, "reward", "cont", "kl", "global_kl") + (("overshooting",) if self.overshooting else ())
        return (*self.obs_shapes, "reward", "cont", "dyn", "rep")

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
        rest become float32. Shapes are unchanged."""
        device = next(self.parameters()).device
        out = {}
        for k, v in batch.items():
            t = torch.as_tensor(v if torch.is_tensor(v) else np.asarray(v), device=device)
            out[k] = t if t.dtype == torch.bool or k in self.image_keys else t.float()
        return out

    def posterior_step(self, data: dict[str, torch.Tensor], prev_action: torch.Tensor,
                       state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One filtering step for acting: observations ``(N, ...)`` with ``is_first (N,)``, the previous action
        ``(N, A)`` and the previous state ``(N, ...)`` -> the posterior state ``(N, ...)`` (``observe`` with T = 1)."""
        embed = self.encode({k: data[k][None] for k in self.obs_shapes})  # (N, ...) -> (1, N, E)
        post, _ = self.rssm.observe(embed, prev_action[None], data["is_first"][None], state)
        return {k: v[0] for k, v in post.items()}  # (1, N, ...) -> (N, ...)

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

    def reward(self, feat: torch.Tensor | SplitFeat) -> TwoHotSymlog | FixedNormal:
        """Reward distribution ``(...)`` from features ``(..., F)`` (or a :class:`SplitFeat`, as every head here): two-hot symlog (categorical) or a unit-std
        normal (gaussian, PlaNet); ``.mean`` is the predicted reward either way."""
        if self.latent == "gaussian":
            return FixedNormal(self.reward_head(feat).squeeze(-1), self.decoder_std, event_dims=0)
        return TwoHotSymlog(self.reward_head(feat))

    def cont(self, feat: torch.Tensor | SplitFeat) -> Bernoulli:
        """Continue (``1 - is_terminal``) distribution ``(...)`` from features ``(..., D + S*K)``."""
        return Bernoulli(self.cont_head(feat).squeeze(-1))

    def decode(self, feat: torch.Tensor | SplitFeat) -> dict[str, SymlogMSE | ImageMSE]:
        """Reconstruction distributions per observation key from features ``(..., D + S*K)``.

        Vector keys: :class:`SymlogMSE` with events ``(F_k,)``. Image keys: :class:`ImageMSE` with events
        ``(C_k, H, W)`` (prediction in the scaled space; ``mode`` is uint8).
        """
        out: dict[str, SymlogMSE | ImageMSE] = {}
        if self.image_decoder is not None:
            pred = self.image_decoder(feat)  # (..., C, H, W), all image keys' channels
            sizes = [self.obs_shapes[k][0] for k in self.image_keys]
            if self.latent == "gaussian":
                out |= {k: GaussianImage(p, self.decoder_std) for k, p in zip(self.image_keys, pred.split(sizes, -3))}
            else:
                out |= {k: ImageMSE(p) for k, p in zip(self.image_keys, pred.split(sizes, -3))}
        if self.decoder is not None:
            pred = self.decoder(feat)  # (..., F)
            sizes = [self.obs_shapes[k][0] for k in self.vector_keys]
            if self.latent == "gaussian":
                out |= {k: FixedNormal(p, self.decoder_std) for k, p in zip(self.vector_keys, pred.split(sizes, -1))}
            else:
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
            Gaussian: ``kl = max(free_nats, KL(post || prior))`` (both sides trained, PlaNet), ``global_kl =
            KL(post || N(0, 1))``, ``overshooting`` = the mean over ``d = 1..D`` of the free-nats-clipped
            :func:`overshooting_kl` (0 where a distance has no prediction); images are bit-reduced with noise.
        """
        if self.latent == "gaussian":
            return self._loss_gaussian(batch, state)
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.rssm.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.rssm.features(post)  # (T, B, D + S*K), or split (onehot_gather)
        losses = {k: -dist.log_prob(batch[k]) for k, dist in self.decode(feat).items()}
        losses["reward"] = -self.reward(feat).log_prob(batch["reward"])
        losses["cont"] = -self.cont(feat).log_prob(1.0 - batch["is_terminal"].to(post["deter"].dtype))
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.rssm.unimix)
        losses["dyn"], losses["rep"] = kl["dyn"], kl["rep"]
        info = {key: kl[key].mean() for key in ("kl", "prior_entropy", "post_entropy")}
        return losses, post, info

    def _loss_gaussian(self, batch: dict[str, torch.Tensor], state: State | None) -> tuple[dict, State, dict]:
        batch = self.preprocess(batch, noise=True)  # (T, B, C, H, W) uint8 -> float pixel values, dequantised
        embed = self.encode(batch)  # (T, B, E)
        post, prior = self.rssm.observe(embed, batch["prev_action"], batch["is_first"], state)
        feat = self.rssm.feat(post)  # (T, B, D + Z)
        losses = {k: -dist.log_prob(batch[k]) for k, dist in self.decode(feat).items()}
        losses["reward"] = -self.reward(feat).log_prob(batch["reward"])
        losses["cont"] = -self.cont(feat).log_prob(1.0 - batch["is_terminal"].to(feat.dtype))
        kl = gaussian_kl(post, prior)  # (T, B)
        losses["kl"] = free_bits(kl, self.free_nats)
        losses["global_kl"] = gaussian_kl(post, {"mean": 0.0, "std": torch.ones_like(post["std"])})
        if self.overshooting:
            over, mask = overshooting_kl(self.rssm, post, batch["prev_action"], batch["is_first"], self.overshooting)
            losses["overshooting"] = (free_bits(over, self.free_nats) * mask).sum(0) / self.overshooting  # (T, B)
        with torch.no_grad():
            info = {"kl": kl.mean(), "prior_entropy": self.rssm.dist(prior).entropy().mean(),
                    "post_entropy": self.rssm.dist(post).entropy().mean(), "prior_std": prior["std"].mean()}
        return losses, post, info
