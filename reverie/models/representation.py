"""The representation objective of a world model: the loss that makes the latent carry the observation, one piece
chosen by one key (``agent.module.representation``; docs/representation.md has the reference values, file and line).

Every objective is an ``nn.Module`` that owns its networks and has:

==================  ========================================================================================
``name``            the value of ``agent.module.representation`` that selects it
``scale_key``       its entry in the agent's ``loss_scales`` table (``rec`` scales every decoded key)
``loss_keys``       the keys of the losses it returns (reconstruction: the observation keys)
``decodes``         whether it has decoders: ``decode(feat)`` and the consumers that show decoded observations
``loss(feat,        ``(losses {key: (T, B)}, info {key: scalar})`` from the posterior features ``(T, B, F)`` (dense
embed, batch)``     or the kernels' split form), the observation embedding ``(T, B, E)`` with its gradient, and the
                    replay batch ``(T, B, ...)`` (observation keys as stored)
==================  ========================================================================================

The objectives:

- ``reconstruction`` (:class:`Reconstruction`, the default; DreamerV3 eq. 4, PlaNet eq. 3): one decoder per
  modality and the negative log-likelihood of every observation key.
- ``r2`` (:class:`BarlowTwins`, R2-Dreamer, ICLR 2026, arXiv 2603.18202; code NM512/r2dreamer at
  546e4fa, ``dreamer.py:383-398``): no decoder; a linear projector maps the features to the embedding's width and a
  Barlow Twins redundancy-reduction loss compares the projection with the stop-gradient embedding of the same
  observation, with no augmentation.
- ``infonce`` (:class:`InfoNCE`, the same repository's contrastive variant, ``dreamer.py:399-408``): no decoder; the
  projection of each row's features must pick that row's embedding among every embedding of the batch.

Neither decoder-free objective changes the rest of the world model: the KL terms (``dyn``, ``rep``) and the reward
and continue heads read the same posterior features and train as before (``dreamer.py:369-374, 429-432``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.conv import ImageMSE
from reverie.models.distributions import FixedNormal, GaussianImage, SymlogMSE
from reverie.models.networks import trunc_normal_fan_in_

LIKELIHOODS = ("symlog", "gaussian")


class Reconstruction(nn.Module):
    """Decoders and their likelihoods (DreamerV3 eq. 4; PlaNet eq. 3): ``loss[k] = -log p(obs_k | feat)`` ``(T, B)``
    for every observation key ``k``.

    The world model builds the networks (their family is its ``nets`` choice) and hands them over; they are this
    objective's from then on (``state_dict`` keys ``representation.image_decoder.*``, ``representation.decoder.*``).

    Args:
        obs_shapes: ``{key: shape}``, keys sorted; vector keys ``(F_k,)``, image keys ``(C_k, H, W)``.
        image_keys, vector_keys: the keys of each kind (in that order their channels/features are concatenated).
        image_decoder: features ``(..., F)`` -> all image keys' channels ``(..., C, H, W)``, or None without images.
        decoder: features ``(..., F)`` -> all vector features ``(..., sum F_k)``, or None without vectors.
        likelihood: ``"symlog"`` (DreamerV3: symlog squared error for vectors, squared error for images) or
            ``"gaussian"`` (PlaNet: fixed-std Gaussians with std ``decoder_std``).

    Raises:
        ValueError: an unknown ``likelihood``; no decoder at all.
    """

    name = "reconstruction"
    scale_key = "rec"
    decodes = True
    SETTINGS: dict[str, Any] = {}  # its networks are set by the agent's cnn / mlp keys

    def __init__(self, obs_shapes: Mapping[str, tuple[int, ...]], image_keys: list[str], vector_keys: list[str],
                 image_decoder: nn.Module | None, decoder: nn.Module | None, likelihood: str = "symlog",
                 decoder_std: float = 1.0):
        super().__init__()
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"Reconstruction: likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if image_decoder is None and decoder is None:
            raise ValueError("Reconstruction: no decoder (the world model has no observation keys)")
        self.obs_shapes = dict(obs_shapes)
        self.image_keys, self.vector_keys = list(image_keys), list(vector_keys)
        self.likelihood, self.decoder_std = likelihood, float(decoder_std)
        self.image_decoder = image_decoder  # registered first: the parameter order of the world model before issue 29
        self.decoder = decoder

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """The observation keys (sorted, as the world model's ``obs_shapes``)."""
        return tuple(self.obs_shapes)

    def decode(self, feat: Any) -> dict[str, torch.distributions.Distribution]:
        """Reconstruction distributions per observation key from features ``(..., F)``.

        ``"symlog"``: :class:`SymlogMSE` for vector keys (events ``(F_k,)``), :class:`ImageMSE` for image keys
        (events ``(C_k, H, W)``, prediction in the scaled space; ``mode`` is uint8). ``"gaussian"``:
        :class:`FixedNormal` and :class:`GaussianImage` with std ``decoder_std``.
        """
        gaussian = self.likelihood == "gaussian"
        out: dict[str, torch.distributions.Distribution] = {}
        if self.image_decoder is not None:
            pred = self.image_decoder(feat)  # (..., C, H, W), all image keys' channels
            parts = pred.split([self.obs_shapes[k][0] for k in self.image_keys], -3)
            out |= {k: GaussianImage(p, self.decoder_std) if gaussian else ImageMSE(p)
                    for k, p in zip(self.image_keys, parts)}
        if self.decoder is not None:
            pred = self.decoder(feat)  # (..., F)
            parts = pred.split([self.obs_shapes[k][0] for k in self.vector_keys], -1)
            out |= {k: FixedNormal(p, self.decoder_std) if gaussian else SymlogMSE(p)
                    for k, p in zip(self.vector_keys, parts)}
        return out

    def loss(self, feat: Any, embed: torch.Tensor, batch: Mapping[str, torch.Tensor]
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``{key: -log p(batch[key] | feat)}`` ``(T, B)`` per observation key (an image key's loss sums over
        ``C x H x W`` scaled pixels); no diagnostics. ``embed`` is not read (the encoder learns through the
        posterior)."""
        return {k: -dist.log_prob(batch[k]) for k, dist in self.decode(feat).items()}, {}


def barlow_twins(x1: torch.Tensor, x2: torch.Tensor, lambd: float, eps: float = 1e-8
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Barlow Twins loss between two batches of vectors ``x1, x2 (N, E)`` (R2-Dreamer ``dreamer.py:391-398``;
    Zbontar et al. 2021 eq. 1-2)::

        z = (x - mean_n x) / (std_n x + eps)          per column, std with N - 1 (torch.std's default)
        c = z1^T z2 / N                               (E, E) cross-correlation
        invariance = sum_i (c_ii - 1)^2,  redundancy = sum_{i != j} c_ij^2,  loss = invariance + lambd redundancy

    The diagonal ``c_ii = mean_n z1_ni z2_ni`` is computed elementwise in float32 (or wider); the ``(E, E)`` product
    runs in the autocast dtype (the reference's float16 autocast, ``dreamer.py:319``) and is squared in float32: a
    16-bit ``c_ii`` near 1 would round ``c_ii - 1`` itself (bfloat16 keeps 8 bits). The same values otherwise;
    ``sum_{i != j} c_ij^2`` is ``sum c^2 - sum diag(c)^2`` (the reference indexes the off-diagonal mask).

    Returns:
        ``(loss, invariance, redundancy)``, scalars (float32 or wider).
    """
    dtype = torch.promote_types(x1.dtype, torch.float32)
    n = x1.shape[0]
    x1, x2 = x1.to(dtype), x2.to(dtype)
    z1 = (x1 - x1.mean(0)) / (x1.std(0) + eps)  # (N, E)
    z2 = (x2 - x2.mean(0)) / (x2.std(0) + eps)  # (N, E)
    diag = (z1 * z2).sum(0) / n  # (E,): c_ii
    cross = (z1.T @ z2).to(dtype) / n  # (E, N) @ (N, E) -> (E, E); autocast: in the compute dtype
    invariance = (diag - 1.0).pow(2).sum()
    redundancy = cross.pow(2).sum() - cross.diagonal().pow(2).sum()
    return invariance + lambd * redundancy, invariance, redundancy


def info_nce(x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """InfoNCE between ``x1, x2 (N, E)`` whose rows are pairs (R2-Dreamer ``dreamer.py:402-408``): logits
    ``x1 x2^T`` ``(N, N)``, no normalisation and no temperature; ``loss_n = -log softmax_m(logits_nm)[n]``.

    The logits are computed in float32 (or wider) with autocast off: they are unnormalised dot products of
    ``E``-wide vectors, whose 16-bit rounding would be of the order of the differences the softmax sees (the
    reference's float16 has 10 mantissa bits, bfloat16 8). The reference's row-max subtraction is what
    ``log_softmax`` does anyway.

    Returns:
        ``(loss (N,), accuracy ())``: each row's loss, and the fraction of rows whose own pair has the largest
        logit (no gradient).
    """
    dtype = torch.promote_types(x1.dtype, torch.float32)
    with torch.autocast(x1.device.type, enabled=False):
        logits = x1.to(dtype) @ x2.to(dtype).T  # (N, E) @ (E, N) -> (N, N)
    logp = F.log_softmax(logits, -1)
    index = torch.arange(len(logits), device=logits.device)
    with torch.no_grad():
        accuracy = (logits.argmax(-1) == index).to(dtype).mean()
    return -logp[index, index], accuracy


class BarlowTwins(nn.Module):
    """R2-Dreamer's objective (``rep_loss: r2dreamer``): ``loss["barlow"]`` ``(T, B)``, the Barlow Twins loss
    (:func:`barlow_twins`) between ``projector(feat)`` and ``sg(embed)`` over all ``N = T*B`` rows, a statistic of the
    whole batch: every row holds the same value, so the agent's mean over ``(T, B)`` is the loss itself.

    - projector: ``Linear(F, E, bias=False)`` (``networks.py:380-387``), fan-in truncated normal init (the
      reference's ``weight_init_``, ``tools.py:114-138``: the same law as :func:`trunc_normal_fan_in_`);
    - target: the embedding with its gradient stopped (``dreamer.py:389``, "this detach is important"), so the loss
      trains the projector and, through the posterior features, the dynamics and the encoder, never the encoder
      through its own output;
    - ``lambd`` 5e-4 (``configs/model/_base_.yaml:36-37``), scale ``barlow: 0.05`` in the agent's ``loss_scales``
      (``_base_.yaml:22``); ``eps`` 1e-8 (``dreamer.py:391-392``).

    Diagnostics: ``r2/invariance``, ``r2/redundancy`` (the two sums, no gradient).

    Args:
        feat_dim: ``F``. embed_dim: ``E``. lambd: weight of the redundancy (off-diagonal) term. eps: added to the
            standard deviations.

    Raises:
        ValueError: ``lambd < 0`` or ``eps <= 0``.
    """

    name = "r2"
    scale_key = "barlow"
    decodes = False
    loss_keys = ("barlow",)
    SETTINGS = {"lambd": 5e-4, "eps": 1e-8}  # _base_.yaml:37, dreamer.py:391

    def __init__(self, feat_dim: int, embed_dim: int, lambd: float = 5e-4, eps: float = 1e-8):
        super().__init__()
        if lambd < 0 or eps <= 0:
            raise ValueError(f"BarlowTwins: need lambd >= 0 and eps > 0 (agent.module.objectives.r2), got {lambd}, "
                             f"{eps}")
        self.lambd, self.eps = float(lambd), float(eps)
        self.projector = nn.Linear(feat_dim, embed_dim, bias=False)
        trunc_normal_fan_in_(self.projector.weight, feat_dim)

    def loss(self, feat: Any, embed: torch.Tensor, batch: Mapping[str, torch.Tensor] | None = None
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        T, B = embed.shape[:2]
        x1 = self.projector(feat).flatten(0, 1)  # (T, B, E) -> (T*B, E)
        x2 = embed.detach().flatten(0, 1)  # (T, B, E) -> (T*B, E): the stop-gradient target
        loss, invariance, redundancy = barlow_twins(x1, x2, self.lambd, self.eps)
        info = {"r2/invariance": invariance.detach(), "r2/redundancy": redundancy.detach()}
        return {"barlow": loss.expand(T, B)}, info  # () -> (T, B): one batch statistic, the same in every row


class InfoNCE(nn.Module):
    """The contrastive variant (``rep_loss: infonce``): ``loss["infonce"]`` ``(T, B)``, each row's InfoNCE loss
    (:func:`info_nce`) with the other ``T*B - 1`` rows of the batch as negatives, between ``projector(feat)`` and
    ``sg(embed)`` (``dreamer.py:402-404``; the projector as :class:`BarlowTwins`'). The reference averages over
    rows (``cross_entropy``); the agent's mean over ``(T, B)`` does. Scale ``infonce: 1.0`` (``_base_.yaml:23``).

    Diagnostics: ``infonce/accuracy``, the fraction of rows whose own embedding scores highest.
    """

    name = "infonce"
    scale_key = "infonce"
    decodes = False
    loss_keys = ("infonce",)
    SETTINGS: dict[str, Any] = {}

    def __init__(self, feat_dim: int, embed_dim: int):
        super().__init__()
        self.projector = nn.Linear(feat_dim, embed_dim, bias=False)
        trunc_normal_fan_in_(self.projector.weight, feat_dim)

    def loss(self, feat: Any, embed: torch.Tensor, batch: Mapping[str, torch.Tensor] | None = None
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        T, B = embed.shape[:2]
        x1 = self.projector(feat).flatten(0, 1)  # (T, B, E) -> (T*B, E)
        x2 = embed.detach().flatten(0, 1)  # (T, B, E) -> (T*B, E)
        loss, accuracy = info_nce(x1, x2)
        return {"infonce": loss.view(T, B)}, {"infonce/accuracy": accuracy}  # (T*B,) -> (T, B)


#: ``agent.module.representation`` -> the objective's class.
OBJECTIVES: dict[str, type[nn.Module]] = {cls.name: cls for cls in (Reconstruction, BarlowTwins, InfoNCE)}
#: every objective's ``loss_scales`` key: a table may hold the scales of the objectives not chosen.
SCALE_KEYS = {cls.scale_key: cls.name for cls in OBJECTIVES.values()}


def check_objectives(representation: str, objectives: Mapping[str, Mapping[str, Any]] | None, owner: str
                     ) -> dict[str, Any]:
    """Check ``agent.module.representation`` and every block of ``agent.module.objectives`` (the objectives not
    chosen too: a misspelt setting is an error wherever it is) and return the chosen one's settings.

    Raises:
        ValueError (naming ``owner`` and the config key): an unknown objective, block or setting.
    """
    if representation not in OBJECTIVES:
        raise ValueError(f"{owner}: agent.module.representation must be one of {', '.join(OBJECTIVES)}, got "
                         f"{representation!r} (docs/representation.md)")
    blocks = dict(objectives or {})
    for name, block in blocks.items():
        if name not in OBJECTIVES:
            raise ValueError(f"{owner}: agent.module.objectives.{name} is no objective; the blocks are "
                             f"{', '.join(OBJECTIVES)}")
        known = OBJECTIVES[name].SETTINGS
        unknown = sorted(set(block or {}) - set(known))
        if unknown:
            raise ValueError(f"{owner}: agent.module.objectives.{name} has no setting {', '.join(unknown)}; its "
                             f"settings are {', '.join(known) or 'none'}")
    return OBJECTIVES[representation].SETTINGS | dict(blocks.get(representation) or {})


def make_representation(representation: str, objectives: Mapping[str, Mapping[str, Any]] | None, *, feat_dim: int,
                        embed_dim: int, reconstruction: Callable[[], Reconstruction], owner: str) -> nn.Module:
    """The objective ``representation`` with its settings from ``objectives`` (:func:`check_objectives`);
    ``reconstruction()`` builds the world model's decoders when it is chosen, and only then.

    Raises:
        ValueError: see :func:`check_objectives`.
    """
    settings = check_objectives(representation, objectives, owner)
    if representation == Reconstruction.name:
        return reconstruction()
    return OBJECTIVES[representation](feat_dim, embed_dim, **settings)
