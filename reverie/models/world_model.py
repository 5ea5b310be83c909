"""World model: encoders + RSSM + decoders, reward and continue heads (DreamerV3 section 3, eq. 4-5; PlaNet).

``loss(batch)`` returns a dict of per-step losses ``(T, B)`` keyed by name; the agent owns the scales
(reference ``loss_scales``: dec/rew/cont 1.0, dyn 0.5, rep 0.1) and checks that the keys match.

With ``latent="gaussian"`` (PlaNet, Hafner et al. 2019) the decoders are fixed-std Gaussians
(``decoder_std``), images are bit-reduced with dequantisation noise (``image_bits``), and the KL terms are
``kl`` (posterior to the temporal prior, with ``free_nats``), ``global_kl`` (posterior to a standard normal)
and, with ``overshooting >= 2``, ``overshooting`` (latent overshooting over distances ``2..D``, PlaNet section 4 /
eq. 7, as google-research/planet ``training/utility.py:214-227`` computes it). ``nets="planet"`` builds PlaNet's
own networks (:mod:`reverie.models.planet_nets`: ``conv_ha`` and ReLU feed-forward heads).
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
from reverie.models.planet_nets import ConvHaDecoder, ConvHaEncoder, FeedForward
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


def free_nats_hinge(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(0, kl - free_nats)`` elementwise (PlaNet, google-research/planet ``training/utility.py:211,226``): the
    gradient of :func:`free_bits`, and a loss value that is 0, not ``free_nats``, while the KL is below it."""
    return torch.clamp(kl - free_nats, min=0.0)


def gaussian_kl(lhs: State, rhs: State) -> torch.Tensor:
    """``KL(N(lhs.mean, lhs.std) || N(rhs.mean, rhs.std))`` summed over ``Z``: ``(..., Z)`` -> ``(...)``.

    ``rhs`` may hold plain floats or broadcastable tensors (e.g. the global prior ``mean 0, std 1``).
    """
    var_ratio = (lhs["std"] / rhs["std"]) ** 2
    t1 = ((lhs["mean"] - rhs["mean"]) / rhs["std"]) ** 2
    return (0.5 * (var_ratio + t1 - 1.0 - torch.log(var_ratio))).sum(-1)


def overshooting_kl(rssm: RSSM, post: State, prior: State, prev_action: torch.Tensor, is_first: torch.Tensor,
                    distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent overshooting KLs for distances ``d = 2..distance`` (PlaNet section 4, eq. 7).

    A chain starts at every step ``s = -1 .. T-2`` (``-1``: the state before the batch, the zero state as at the start
    of the reference's chunks), takes the one-step prior of ``observe`` at ``s + 1`` (``prior``; a reset where
    ``is_first[s + 1]``), then rolls the prior forward open-loop with the observed actions (sampled latents, with
    gradient) and at each target time ``t = s + d`` is compared with the posterior at ``t``, whose gradient is
    stopped: ``kl[d-2, t] = KL(sg(q(s_t | o_<=t)) || p(s_t | s_{t-d}, a_{t-d+1:t}))``. Distance 1 is the one-step
    ``kl`` term and is not repeated here. google-research/planet ``tools/overshooting.py`` and
    ``training/utility.py:214-227`` (rows ``1:-1`` of ``overshooting_distance + 1``: distances ``2..D``, from
    ``posterior[t-1]`` or the zero state at ``t = 0``, ``os_stop_posterior_grad: True``).

    Args:
        rssm: a Gaussian :class:`RSSM`.
        post, prior: posterior and prior states ``(T, B, ...)`` of :meth:`RSSM.observe`.
        prev_action: ``(T, B, A)``; ``prev_action[t]`` leads into ``t``.
        is_first: ``(T, B)`` bool; a chain may start at a reset (its first step) but never crosses one after that.
        distance: ``D >= 2``.

    Returns:
        ``(kl, mask)``, both ``(D-1, T, B)``: ``mask[d-2, t]`` is 1 where a chain of length ``d`` ends at ``t``
        (``t >= d - 1`` and no ``is_first`` in ``t-d+2 .. t``); ``kl`` is 0 elsewhere.

    Raises:
        ValueError: ``distance < 2`` or a categorical RSSM.
    """
    if distance < 2:
        raise ValueError(f"overshooting_kl: distance must be >= 2 (distance 1 is the one-step KL), got {distance}")
    if rssm.latent != "gaussian":
        raise ValueError("overshooting_kl needs RSSM(latent='gaussian') (PlaNet latent overshooting)")
    T, B = is_first.shape
    kl = post["mean"].new_zeros(distance - 1, T, B)
    mask = torch.zeros_like(kl)
    target = {k: post[k].detach() for k in ("mean", "std")}
    cur, valid = prior, torch.ones_like(is_first)  # cur[i]: the chain from s = i - 1, now at time i + d - 1
    for d in range(2, min(distance, T) + 1):
        n = T - d + 1  # chains that reach a target t = i + d - 1 <= T - 1
        start = {k: v[:n].flatten(0, 1) for k, v in cur.items()}  # (n, B, ...) -> (n*B, ...)
        step = rssm.img_step(start, prev_action[d - 1:].flatten(0, 1), sample=True)  # (n*B, A) actions into t
        cur = {k: v.unflatten(0, (n, B)) for k, v in step.items()}  # (n*B, ...) -> (n, B, ...)
        valid = valid[:n] & ~is_first[d - 1:]  # (n, B)
        div = gaussian_kl({k: v[d - 1:] for k, v in target.items()}, cur)  # (n, B)
        kl[d - 2, d - 1:] = div * valid
        mask[d - 2, d - 1:] = valid.to(kl.dtype)
    return kl, mask


def overshooting_loss(rssm: RSSM, post: State, prior: State, prev_action: torch.Tensor, is_first: torch.Tensor,
                      distance: int, free_nats: float) -> torch.Tensor:
    """The ``overshooting`` loss ``(T, B)``: ``sum over d = 2..D of max(0, kl[d-2, t] - free_nats)`` (0 where no chain
    ends) divided by ``D - 1``, so that its mean over ``(T, B)`` is the reference's ``reduce_mean`` over all
    ``B x T x (D - 1)`` (start, distance) entries, chains past the chunk's end counting as 0
    (google-research/planet ``training/utility.py:217-227,233``). The agent scales it by ``overshooting_scale``
    next to the one-step ``kl`` term's ``divergence_scale``: distance 1 has weight 1, distances ``2..D`` share one.

    Raises:
        ValueError: as :func:`overshooting_kl`.
    """
    kl, mask = overshooting_kl(rssm, post, prior, prev_action, is_first, distance)
    return (free_nats_hinge(kl, free_nats) * mask).sum(0) / (distance - 1)  # (D-1, T, B) -> (T, B)


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
            (PlaNet 5; 8 keeps the pixels). overshooting: latent overshooting distance ``D`` (0: off; else
            ``D >= 2``: the ``overshooting`` loss covers distances ``2..D``, :func:`overshooting_loss`).
        nets: ``"dreamer"`` (the DreamerV3 stacks: :class:`ConvEncoder`/:class:`ConvDecoder`, LayerNorm + SiLU
            :class:`MLP` heads of ``units x layers``) or ``"planet"`` (gaussian only: PlaNet's ``conv_ha``
            :class:`ConvHaEncoder`/:class:`ConvHaDecoder` with channel multiplier ``cnn_depth`` and
            :class:`FeedForward` reward/continue heads and vector encoder/decoder of ``head_layers x head_units``
            with ``act``; ``cnn`` and ``layers`` are then unused).
        head_units, head_layers: PlaNet's head network (reference ``num_units`` 300, ``num_layers`` 3); ``nets="planet"``.
        act: PlaNet's activation (reference ``activation: relu``): the Gaussian RSSM's hidden layers, and with
            ``nets="planet"`` the feed-forward networks.
        onehot_gather: categorical latents enter the heads' and the RSSM cell's first layers by row gathers
            (:mod:`reverie.models.onehot_linear`; same values up to float rounding). False: dense features.
        cnn_depth: channel multiplier of the conv stacks (size preset ``cnn_depth``; reference s=32).
        cnn: further :class:`ConvEncoder`/:class:`ConvDecoder` keyword arguments (``channels``, ``kernel``,
            ``stride``, ``padding``, ``min_res``, ``norm``, ``act``); defaults are the reference's.

    Raises:
        ValueError: an observation shape that is neither ``(F,)`` nor ``(C, H, W)``; image keys of different
            sizes; an image size the conv stack cannot take (see :func:`reverie.models.conv.conv_plan`; ``conv_ha``
            takes 64x64 only); ``overshooting`` 1 or negative; an unknown ``nets``, or ``nets="planet"`` with
            categorical latents.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int, deter: int = 512, stoch: int = 32,
                 classes: int = 32, units: int = 512, layers: int = 2, unimix: float = 0.01, free_nats: float = 1.0,
                 reward_bins: int = 255, cnn_depth: int = 32, cnn: dict | None = None, latent: str = "categorical",
                 min_std: float = 0.1, decoder_std: float = 1.0, image_bits: int = 8, overshooting: int = 0,
                 onehot_gather: bool = True, nets: str = "dreamer", head_units: int = 300, head_layers: int = 3,
                 act: str = "relu"):
        super().__init__()
        if latent == "gaussian" and (decoder_std <= 0 or not 1 <= image_bits <= 8 or overshooting < 0
                                     or overshooting == 1):
            raise ValueError(f"WorldModel(latent='gaussian'): need decoder_std > 0, image_bits in 1..8 and overshooting "
                             f"0 (off) or >= 2 (distances 2..D; distance 1 is the one-step kl term); got decoder_std="
                             f"{decoder_std}, image_bits={image_bits}, overshooting={overshooting}")
        if nets not in ("dreamer", "planet") or (nets == "planet" and latent != "gaussian"):
            raise ValueError(f"WorldModel: nets must be 'dreamer' or, with latent='gaussian', 'planet'; got nets={nets!r} "
                             f"with latent={latent!r}")
        self.nets = nets
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
            self.image_encoder = (ConvHaEncoder(image_shape, depth=cnn_depth) if nets == "planet"
                                  else ConvEncoder(image_shape, depth=cnn_depth, **(cnn or {})))
            embed += self.image_encoder.out_dim

        def mlp(in_dim: int, out_dim: int | None, depth: int, out_scale: float = 1.0) -> nn.Module:
            if nets == "planet":  # reference networks.feed_forward (scripts/configs.py:112-116)
                hidden = head_layers if out_dim is not None else max(head_layers, 1)  # the encoder has no output layer
                return FeedForward(in_dim, out_dim, units=head_units, layers=hidden, act=act)
            return MLP(in_dim, out_dim, units=units, layers=depth, out_scale=out_scale)

        if self.vector_keys:
            self.encoder = mlp(self._vector_dim, None, max(layers, 1))
            embed += self.encoder.out_dim
        if embed == 0:
            raise ValueError("WorldModel: no observation keys to encode")
        self.rssm = RSSM(action_dim, embed, deter=deter, stoch=stoch, classes=classes, units=units, unimix=unimix,
                         latent=latent, min_std=min_std, onehot_gather=onehot_gather, act=act)
        feat = self.rssm.feat_dim
        if self.image_keys:
            self.image_decoder = (ConvHaDecoder(feat, image_shape, depth=cnn_depth) if nets == "planet"
                                  else ConvDecoder(feat, image_shape, depth=cnn_depth, **(cnn or {})))
        if self.vector_keys:
            self.decoder = mlp(feat, self._vector_dim, layers)
        self.reward_head = mlp(feat, reward_bins if latent == "categorical" else 1, layers, out_scale=0.0)
        self.cont_head = mlp(feat, 1, layers)

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
            Gaussian: ``kl = max(0, KL(post || prior) - free_nats)`` (both sides trained; PlaNet ``utility.py:209-211``),
            ``global_kl = KL(post || N(0, 1))`` (no free nats; the camera-ready reference's ``global_divergence``),
            ``overshooting`` = :func:`overshooting_loss` (distances ``2..D``); images are bit-reduced with noise.
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
        losses["kl"] = free_nats_hinge(kl, self.free_nats)
        losses["global_kl"] = gaussian_kl(post, {"mean": 0.0, "std": torch.ones_like(post["std"])})
        if self.overshooting:
            losses["overshooting"] = overshooting_loss(self.rssm, post, prior, batch["prev_action"], batch["is_first"],
                                                       self.overshooting, self.free_nats)  # (T, B)
        with torch.no_grad():
            info = {"kl": kl.mean(), "prior_entropy": self.rssm.dist(prior).entropy().mean(),
                    "post_entropy": self.rssm.dist(post).entropy().mean(), "prior_std": prior["std"].mean()}
        return losses, post, info
