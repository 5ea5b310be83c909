"""A world model's representation objective, chosen by ``agent.module.representation`` (docs/representation.md).

Each is an ``nn.Module`` owning its networks, with ``name`` (the config value), ``scale_key`` (its ``loss_scales``
entry), ``loss_keys``, ``decodes`` (the decoder-free ones also ``default_scale``, R2-Dreamer's) and
``loss(feat, embed, batch) -> (losses {key: (T, B)}, info {key: scalar})`` from posterior features ``(T, B, F)``,
embedding ``(T, B, E)`` and replay batch ``(T, B, ...)``: ``reconstruction`` (:class:`Reconstruction`, DreamerV3
eq. 4, PlaNet eq. 3), ``r2`` (:class:`BarlowTwins`, R2-Dreamer, arXiv 2603.18202, NM512/r2dreamer at 546e4fa
``dreamer.py:383-398``) and ``infonce`` (:class:`InfoNCE`, ``dreamer.py:399-408``).
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
    """``loss[k] = -log p(obs_k | feat)`` ``(T, B)`` per observation key (DreamerV3 eq. 4; PlaNet eq. 3).

    ``obs_shapes``: ``{key: (F_k,) or (C_k, H, W)}``; ``image_decoder``: ``(..., F) -> (..., C, H, W)``, all image
    keys' channels; ``decoder``: ``(..., F) -> (..., sum F_k)``; either None without that kind. ``likelihood``:
    ``"symlog"`` (DreamerV3) or ``"gaussian"`` (PlaNet, std ``decoder_std``). ValueError: an unknown likelihood
    or no decoder.
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
        self.image_decoder = image_decoder  # registered first: the parameter order saved optimiser states expect
        self.decoder = decoder

    @property
    def loss_keys(self) -> tuple[str, ...]:
        """The observation keys, sorted."""
        return tuple(self.obs_shapes)

    def decode(self, feat: Any) -> dict[str, torch.distributions.Distribution]:
        """``{key: distribution}`` from features ``(..., F)``: events ``(F_k,)`` or ``(C_k, H, W)``."""
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
        """``{key: -log p(batch[key] | feat)}`` ``(T, B)``, no diagnostics; ``embed`` is not read."""
        return {k: -dist.log_prob(batch[k]) for k, dist in self.decode(feat).items()}, {}


def barlow_twins(x1: torch.Tensor, x2: torch.Tensor, lambd: float, eps: float = 1e-8
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Barlow Twins ``(loss, invariance, redundancy)`` scalars between ``x1, x2 (N, E)`` (R2-Dreamer
    ``dreamer.py:391-398``; Zbontar et al. 2021 eq. 1-2); the diagonal in float32 (docs/representation.md)."""
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
    """InfoNCE ``(loss (N,), accuracy ())`` of row pairs ``x1, x2 (N, E)`` (R2-Dreamer ``dreamer.py:402-408``):
    float32 logits ``x1 x2^T`` ``(N, N)``, no temperature; accuracy: rows whose own pair scores highest."""
    dtype = torch.promote_types(x1.dtype, torch.float32)
    with torch.autocast(x1.device.type, enabled=False):
        logits = x1.to(dtype) @ x2.to(dtype).T  # (N, E) @ (E, N) -> (N, N)
    logp = F.log_softmax(logits, -1)
    index = torch.arange(len(logits), device=logits.device)
    with torch.no_grad():
        accuracy = (logits.argmax(-1) == index).to(dtype).mean()
    return -logp[index, index], accuracy


class BarlowTwins(nn.Module):
    """R2-Dreamer (``rep_loss: r2dreamer``): ``loss["barlow"]`` ``(T, B)``, :func:`barlow_twins` of
    ``Linear(F, E, bias=False)(feat)`` (``networks.py:380-387``) and ``sg(embed)`` (``dreamer.py:389``) over the
    ``T*B`` rows, the same value in every row; ``lambd`` 5e-4 (``configs/model/_base_.yaml:36-37``), ``eps`` 1e-8.
    Diagnostics ``r2/invariance``, ``r2/redundancy``. ValueError: ``lambd < 0`` or ``eps <= 0``.
    """

    name = "r2"
    scale_key = "barlow"
    default_scale = 0.05  # R2-Dreamer's loss_scales.barlow (configs/model/_base_.yaml:22), for agents without one
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
    """``rep_loss: infonce``: ``loss["infonce"]`` ``(T, B)``, :func:`info_nce` of ``projector(feat)`` and
    ``sg(embed)`` over the batch (``dreamer.py:402-404``); diagnostic ``infonce/accuracy``."""

    name = "infonce"
    scale_key = "infonce"
    default_scale = 1.0  # R2-Dreamer's loss_scales.infonce (configs/model/_base_.yaml:23)
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


OBJECTIVES: dict[str, type[nn.Module]] = {cls.name: cls for cls in (Reconstruction, BarlowTwins, InfoNCE)}
#: every objective's ``loss_scales`` key: a table may hold the scales of the objectives not chosen.
SCALE_KEYS = {cls.scale_key: cls.name for cls in OBJECTIVES.values()}


def check_objectives(representation: str, objectives: Mapping[str, Mapping[str, Any]] | None, owner: str
                     ) -> dict[str, Any]:
    """The chosen objective's settings, after checking every block of ``agent.module.objectives``.
    ValueError (naming ``owner``): an unknown objective, block or setting."""
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
    """The objective ``representation`` (``reconstruction()`` called only if chosen); ValueError as
    :func:`check_objectives`."""
    settings = check_objectives(representation, objectives, owner)
    if representation == Reconstruction.name:
        return reconstruction()
    return OBJECTIVES[representation](feat_dim, embed_dim, **settings)
