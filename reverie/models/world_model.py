"""World model: encoder + RSSM + decoder, reward and continue heads (DreamerV3 section 3, eq. 4-5).

``loss(batch)`` returns a dict of per-step losses ``(T, B)`` keyed by name; the agent owns the scales
(reference ``loss_scales``: dec/rew/cont 1.0, dyn 0.5, rep 0.1) and checks that the keys match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.distributions import Bernoulli, SymlogMSE, TwoHotSymlog, symlog, unimix_logits
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
    """Encoder, RSSM and heads over dict observations of vector keys.

    Args:
        obs_shapes: ``{key: shape}`` of the observation keys to encode and reconstruct; vector keys are
            ``(F,)``. Image keys (3-dim) need the CNN encoder (issue 3) and raise here.
        action_dim: ``A``.
        deter, stoch, classes, units, layers, unimix: size preset (DESIGN.md section 4).
        free_nats: free bits of the KL terms (reference 1.0).

    Raises:
        ValueError: an observation key whose shape is not a vector.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int, deter: int = 512, stoch: int = 32,
                 classes: int = 32, units: int = 512, layers: int = 2, unimix: float = 0.01, free_nats: float = 1.0,
                 reward_bins: int = 255):
        super().__init__()
        bad = {k: s for k, s in obs_shapes.items() if len(s) != 1}
        if bad:
            raise ValueError(f"WorldModel: observation keys {bad} are not vectors (F,); image observations need the "
                             f"CNN encoder, which is not built yet. Use vector observations (e.g. env=cartpole).")
        self.vector_keys = sorted(obs_shapes)
        self.obs_shapes = {k: tuple(obs_shapes[k]) for k in self.vector_keys}
        in_dim = sum(s[0] for s in self.obs_shapes.values())
        self.free_nats = free_nats
        self.encoder = MLP(in_dim, None, units=units, layers=max(layers, 1))
        self.rssm = RSSM(action_dim, self.encoder.out_dim, deter=deter, stoch=stoch, classes=classes, units=units,
                         unimix=unimix)
        feat = self.rssm.feat_dim
        self.decoder = MLP(feat, in_dim, units=units, layers=layers)
        self.reward_head = MLP(feat, reward_bins, units=units, layers=layers, out_scale=0.0)
        self.cont_head = MLP(feat, 1, units=units, layers=layers)

    @property
    def loss_keys(self) -> tuple[str, ...]:
        return (*self.vector_keys, "reward", "cont", "dyn", "rep")

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Symlog-squashed vector observations ``(..., F_k)`` -> embedding ``(..., E)``."""
        x = torch.cat([obs[k] for k in self.vector_keys], -1)
        return self.encoder(symlog(x))

    def reward(self, feat: torch.Tensor) -> TwoHotSymlog:
        """Reward distribution ``(...)`` from features ``(..., D + S*K)``."""
        return TwoHotSymlog(self.reward_head(feat))

    def cont(self, feat: torch.Tensor) -> Bernoulli:
        """Continue (``1 - is_terminal``) distribution ``(...)`` from features ``(..., D + S*K)``."""
        return Bernoulli(self.cont_head(feat).squeeze(-1))

    def decode(self, feat: torch.Tensor) -> dict[str, SymlogMSE]:
        """Reconstruction distributions per observation key, ``(..., F_k)`` events."""
        pred = self.decoder(feat)
        sizes = [self.obs_shapes[k][0] for k in self.vector_keys]
        return {k: SymlogMSE(p) for k, p in zip(self.vector_keys, pred.split(sizes, -1))}

    def loss(self, batch: dict[str, torch.Tensor], state: State | None = None) -> tuple[dict[str, torch.Tensor], State, dict]:
        """Per-step world-model losses on a replay batch (DreamerV3 eq. 4-5).

        Args:
            batch: ``(T, B, ...)`` tensors: observation keys, ``prev_action (T, B, A)``, ``reward``,
                ``is_first``, ``is_terminal`` ``(T, B)``.
            state: RSSM state before the batch, or None.

        Returns:
            ``(losses, posterior, info)``: ``losses[k]`` is ``(T, B)`` for every key in :attr:`loss_keys`;
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
