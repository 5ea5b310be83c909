"""The Gaussian RSSM of PlaNet (Hafner et al. 2019, section 3; google-research/planet ``planet/models/rssm.py``).

State: ``deter`` ``h_t (..., D)`` from a ``GRUBlockCell`` (``belief_size`` 200), ``stoch`` ``z_t (..., Z)`` a diagonal
Gaussian (``state_size`` 30) with ``mean``, ``std = softplus(raw) + min_std`` (``min_stddev`` 0.1); one ``act``
layer of ``units`` (``embed_size`` 200) before the GRU, prior and posterior (config ``relu``,
``scripts/configs.py:109,136``). Losses (``training/utility.py:209-227``): ``kl``, ``global_kl`` and, with
``overshooting = D >= 2``, ``overshooting`` (section 4, eq. 7); docs/planet.md has the details.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models import draws
from reverie.models.conv import ACTIVATIONS
from reverie.models.dynamics.base import Policy, RowState, State, reset, rollout
from reverie.models.planet_nets import BlockGRUCell, glorot_uniform_


class GaussianRSSM(RowState, nn.Module):
    """PlaNet's RSSM, a :class:`reverie.models.dynamics.Dynamics`: ``deter (..., D)``, ``stoch``, ``mean``, ``std``
    ``(..., Z)``; ``overshooting`` 0 (off) or ``D >= 2`` (the paper uses 50). Raises ValueError for ``min_std <= 0``,
    ``overshooting`` negative or 1, or an unknown ``act``."""

    state_keys = ("deter", "stoch", "mean", "std")
    feature_keys = ("deter", "stoch")  # what features() reads
    carry_keys = ("deter", "stoch")  # what observe(state=) and img_step read

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 200, stoch: int = 30, units: int = 200,
                 min_std: float = 0.1, free_nats: float = 3.0, overshooting: int = 0, act: str = "relu"):
        super().__init__()
        if min_std <= 0 or overshooting < 0 or overshooting == 1 or act not in ACTIVATIONS:
            raise ValueError(f"GaussianRSSM needs min_std > 0 (PlaNet min_stddev 0.1), overshooting 0 (off) or >= 2 "
                             f"(distances 2..D; distance 1 is the one-step kl term) and act in {tuple(ACTIVATIONS)}; "
                             f"got min_std={min_std}, overshooting={overshooting}, act={act!r}")
        self.deter, self.stoch, self.min_std = deter, stoch, float(min_std)
        self.action_dim, self.embed_dim = action_dim, embed_dim
        self.free_nats, self.overshooting = float(free_nats), int(overshooting)
        self.feat_dim = deter + stoch
        self.loss_keys = ("kl", "global_kl") + (("overshooting",) if self.overshooting else ())
        self.act = ACTIVATIONS[act]()
        Z, A, D, E = stoch, action_dim, deter, embed_dim
        # Linear(cat(z, a)) split so the action part is projected once per sequence (one bias, on the z part)
        self.in_z = nn.Linear(Z, units)
        self.in_a = nn.Linear(A, units, bias=False)
        self.gru = BlockGRUCell(units, D)
        self.prior_net = nn.Sequential(nn.Linear(D, units), self.act, nn.Linear(units, 2 * Z))
        # Linear(cat(h, embed)) split so the embedding part is projected once per sequence
        self.post_h = nn.Linear(D, units, bias=False)
        self.post_e = nn.Linear(E, units)
        self.post_out = nn.Linear(units, 2 * Z)
        # TF's default init with the reference layers' fans: (mean, std) are two Dense(Z) (models/rssm.py:106-107,
        # 127-128)
        fans = {self.in_z: (Z + A, units), self.in_a: (Z + A, units), self.prior_net[0]: (D, units),
                self.prior_net[2]: (units, Z), self.post_h: (D + E, units), self.post_e: (D + E, units),
                self.post_out: (units, Z)}
        for layer, (fan_in, fan_out) in fans.items():
            glorot_uniform_(layer.weight, fan_in, fan_out)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def initial(self, batch: int) -> State:
        """Zeros (PlaNet ``zero_state``) ``(batch, ...)``, ``std`` ones."""
        zeros = self.in_a.weight.new_zeros(batch, self.stoch)
        return {"deter": self.in_a.weight.new_zeros(batch, self.deter), "stoch": zeros, "mean": zeros,
                "std": torch.ones_like(zeros)}

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, stoch)`` ``(..., D + Z)``."""
        return torch.cat([state["deter"], state["stoch"]], -1)

    def dist(self, state: State) -> torch.distributions.Independent:
        """``Normal(mean, std)`` of a state, event shape ``(Z,)``, in float32 at least."""
        dtype = torch.promote_types(state["mean"].dtype, torch.float32)
        return torch.distributions.Independent(
            torch.distributions.Normal(state["mean"].to(dtype), state["std"].to(dtype), validate_args=False), 1)

    def _gaussian(self, deter: torch.Tensor, raw: torch.Tensor, sample: bool) -> State:
        """``raw (..., 2Z)`` -> the state, ``stoch`` a draw (or the mean)."""
        mean, std = raw.chunk(2, -1)
        std = F.softplus(std) + self.min_std
        stoch = mean + std * draws.normal_noise(mean, std) if sample else mean
        return {"deter": deter, "stoch": stoch, "mean": mean, "std": std}

    def _cell(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        """``h_t`` ``(B, D)`` from the state at ``t - 1`` and the projected action ``(B, units)``."""
        return self.gru(self.act(self.in_z(state["stoch"]) + action_proj), state["deter"])

    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Posterior and prior states ``(T, B, ...)`` along observed sequences (:meth:`Dynamics.observe`)."""
        T, B = is_first.shape
        init = self.initial(B)  # zeros: what is_first resets to
        state = init if state is None else state
        first = is_first.to(embed.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        action_proj = self.in_a(prev_action) * (1.0 - first)  # (T, B, units); zero action where is_first
        embed_proj = self.post_e(embed)  # (T, B, units)
        state = {"deter": state["deter"], "stoch": state["stoch"]}
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.state_keys}
        for t in range(T):
            state = reset(state, init, first[t])  # zeros where is_first
            deter = self._cell(state, action_proj[t])
            post = self._gaussian(deter, self.post_out(self.act(self.post_h(deter) + embed_proj[t])), sample)
            state = {"deter": deter, "stoch": post["stoch"]}
            for key, value in post.items():
                out[key].append(value)
        post = {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)
        prior = self._gaussian(post["deter"], self.prior_net(post["deter"]), sample)  # all steps at once
        return post, prior

    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step: state ``(N, ...)`` and action ``(N, A)`` -> the next prior state ``(N, ...)``."""
        deter = self._cell(state, self.in_a(action))
        return self._gaussian(deter, self.prior_net(deter), sample)

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """:meth:`Dynamics.imagine`."""
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``kl`` (``utility.py:209-211``), ``global_kl`` (no free nats; ``global_divergence``), ``overshooting``
        ``(T, B)``; info: the unclipped ``kl``, the entropies and the prior's mean std."""
        kl = gaussian_kl(post, prior)  # (T, B)
        losses = {"kl": free_nats_hinge(kl, self.free_nats),
                  "global_kl": gaussian_kl(post, {"mean": 0.0, "std": torch.ones_like(post["std"])})}
        if self.overshooting:
            losses["overshooting"] = overshooting_loss(self, post, prior, prev_action, is_first, self.overshooting,
                                                       self.free_nats)  # (T, B)
        with torch.no_grad():
            info = {"kl": kl.mean(), "prior_entropy": self.dist(prior).entropy().mean(),
                    "post_entropy": self.dist(post).entropy().mean(), "prior_std": prior["std"].mean()}
        return losses, info


def gaussian_kl(lhs: State, rhs: State) -> torch.Tensor:
    """``KL(N(lhs) || N(rhs))`` summed over ``Z``: ``(..., Z)`` -> ``(...)``; ``rhs`` may hold floats."""
    var_ratio = (lhs["std"] / rhs["std"]) ** 2
    t1 = ((lhs["mean"] - rhs["mean"]) / rhs["std"]) ** 2
    return (0.5 * (var_ratio + t1 - 1.0 - torch.log(var_ratio))).sum(-1)


def free_nats_hinge(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(0, kl - free_nats)`` (google-research/planet ``training/utility.py:211,226``)."""
    return torch.clamp(kl - free_nats, min=0.0)


def overshooting_kl(rssm: GaussianRSSM, post: State, prior: State, prev_action: torch.Tensor, is_first: torch.Tensor,
                    distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent overshooting ``kl[d-2, t] = KL(sg(q(s_t | o_<=t)) || p(s_t | s_{t-d}, a_{t-d+1:t}))``, ``d = 2..D``
    (PlaNet section 4, eq. 7; ``tools/overshooting.py``, ``training/utility.py:214-227``).

    ``post``, ``prior`` ``(T, B, ...)``, ``prev_action (T, B, A)``, ``is_first (T, B)`` -> ``(kl, mask)`` ``(D-1, T,
    B)``, ``mask`` 1 where a chain of length ``d`` ends at ``t`` without crossing ``is_first``. ValueError: ``D < 2``.
    """
    if distance < 2:
        raise ValueError(f"overshooting_kl: distance must be >= 2 (distance 1 is the one-step KL), got {distance}")
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


def overshooting_loss(rssm: GaussianRSSM, post: State, prior: State, prev_action: torch.Tensor,
                      is_first: torch.Tensor, distance: int, free_nats: float) -> torch.Tensor:
    """``sum_d max(0, kl[d-2, t] - free_nats) / (D - 1)`` ``(T, B)``: its mean is the reference's ``reduce_mean``
    over ``B x T x (D - 1)`` (``training/utility.py:217-227,233``). ValueError: as :func:`overshooting_kl`."""
    kl, mask = overshooting_kl(rssm, post, prior, prev_action, is_first, distance)
    return (free_nats_hinge(kl, free_nats) * mask).sum(0) / (distance - 1)  # (D-1, T, B) -> (T, B)
