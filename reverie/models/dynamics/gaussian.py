"""The Gaussian RSSM of PlaNet (Hafner et al. 2019, section 3; google-research/planet ``planet/models/rssm.py``).

State ``s_t = (h_t, z_t)``: ``deter`` ``h_t`` ``(..., D)`` from a plain GRU (``belief_size`` 200), ``stoch`` ``z_t``
``(..., Z)`` a diagonal Gaussian latent (``state_size`` 30) with its ``mean`` and ``std`` (``std = softplus(raw) +
min_std``, ``min_stddev`` 0.1), ELU hidden layers of width ``units`` (``hidden_size`` 200). One step::

    h_t = GRU(elu(W_z z_{t-1} + W_a prev_action_t + b), h_{t-1})
    prior     p(z_t | h_t):          (mean, std) = W_2 elu(W_1 h_t + b_1) + b_2
    posterior q(z_t | h_t, e_t):     (mean, std) = W_out elu(W_h h_t + W_e e_t + b_e) + b_out

The initial state is zeros (reference ``zero_state``); ``is_first`` resets to it. Losses (PlaNet section 3-4):
``kl`` = ``max(free_nats, KL(post || prior))`` (3 nats; both sides trained), ``global_kl`` = ``KL(post || N(0, 1))``
(reference ``global_divergence_scale``, 0 by default), and with ``overshooting = D > 0`` the latent overshooting
KLs ``overshooting`` (section 4, eq. 7). Training is always the readable path (no kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.dynamics.base import Policy, State, free_bits, reset, rollout


class GaussianRSSM(nn.Module):
    """PlaNet's RSSM, a :class:`reverie.models.dynamics.Dynamics` (module docstring).

    Args:
        action_dim: ``A``. embed_dim: ``E`` (both filled in by the world model).
        deter: ``D`` (``belief_size`` 200). stoch: ``Z`` (``state_size`` 30). units: hidden width (200).
        min_std: floor of the latent std (``min_stddev`` 0.1). free_nats: of ``kl`` and overshooting (3.0).
        overshooting: latent overshooting distance ``D`` (0: off; the paper uses 50).

    State entries: ``deter (..., D)``, ``stoch (..., Z)``, ``mean (..., Z)``, ``std (..., Z)``.

    Raises:
        ValueError: ``min_std <= 0`` or ``overshooting < 0``.
    """

    state_keys = ("deter", "stoch", "mean", "std")

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 200, stoch: int = 30, units: int = 200,
                 min_std: float = 0.1, free_nats: float = 3.0, overshooting: int = 0):
        super().__init__()
        if min_std <= 0 or overshooting < 0:
            raise ValueError(f"GaussianRSSM needs min_std > 0 (PlaNet min_stddev 0.1) and overshooting >= 0, got "
                             f"min_std={min_std}, overshooting={overshooting}")
        self.deter, self.stoch, self.min_std = deter, stoch, float(min_std)
        self.action_dim, self.embed_dim = action_dim, embed_dim
        self.free_nats, self.overshooting = float(free_nats), int(overshooting)
        self.feat_dim = deter + stoch
        self.loss_keys = ("kl", "global_kl") + (("overshooting",) if self.overshooting else ())
        # Linear(cat(z, a)) split so the action part is projected once per sequence (one bias, on the z part)
        self.in_z = nn.Linear(stoch, units)
        self.in_a = nn.Linear(action_dim, units, bias=False)
        self.gru = nn.GRUCell(units, deter)
        self.prior_net = nn.Sequential(nn.Linear(deter, units), nn.ELU(), nn.Linear(units, 2 * stoch))
        # Linear(cat(h, embed)) split so the embedding part is projected once per sequence
        self.post_h = nn.Linear(deter, units, bias=False)
        self.post_e = nn.Linear(embed_dim, units)
        self.post_out = nn.Linear(units, 2 * stoch)

    # ------------------------------------------------------------------------------------------------ states
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
        """``raw (..., 2Z)`` -> the state with ``std = softplus(raw_std) + min_std`` and ``stoch`` a draw (or the
        mean)."""
        mean, std = raw.chunk(2, -1)
        std = F.softplus(std) + self.min_std
        stoch = mean + std * torch.randn_like(std) if sample else mean
        return {"deter": deter, "stoch": stoch, "mean": mean, "std": std}

    def _cell(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        """``h_t`` ``(B, D)`` from the state at ``t - 1`` and the projected action ``(B, units)``."""
        return self.gru(F.elu(self.in_z(state["stoch"]) + action_proj), state["deter"])

    # ----------------------------------------------------------------------------------------------- observe
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
            post = self._gaussian(deter, self.post_out(F.elu(self.post_h(deter) + embed_proj[t])), sample)
            state = {"deter": deter, "stoch": post["stoch"]}
            for key, value in post.items():
                out[key].append(value)
        post = {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)
        prior = self._gaussian(post["deter"], self.prior_net(post["deter"]), sample)  # all steps at once
        return post, prior

    # ----------------------------------------------------------------------------------------------- imagine
    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step: state ``(N, ...)`` and action ``(N, A)`` -> the next prior state ``(N, ...)``."""
        deter = self._cell(state, self.in_a(action))
        return self._gaussian(deter, self.prior_net(deter), sample)

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior from ``start`` ``(N, ...)`` with the policy's actions (:meth:`Dynamics.imagine`)."""
        return rollout(self.img_step, policy, start, horizon)

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``kl``, ``global_kl`` (and ``overshooting``) ``(T, B)``; info: the unclipped ``kl``, the entropies and the
        prior's mean std.

        ``overshooting``: the mean over ``d = 1..D`` of the free-nats-clipped :func:`overshooting_kl` (0 where a
        distance has no prediction).
        """
        kl = gaussian_kl(post, prior)  # (T, B)
        losses = {"kl": free_bits(kl, self.free_nats),
                  "global_kl": gaussian_kl(post, {"mean": 0.0, "std": torch.ones_like(post["std"])})}
        if self.overshooting:
            over, mask = overshooting_kl(self, post, prev_action, is_first, self.overshooting)
            losses["overshooting"] = (free_bits(over, self.free_nats) * mask).sum(0) / self.overshooting  # (T, B)
        with torch.no_grad():
            info = {"kl": kl.mean(), "prior_entropy": self.dist(prior).entropy().mean(),
                    "post_entropy": self.dist(post).entropy().mean(), "prior_std": prior["std"].mean()}
        return losses, info


def gaussian_kl(lhs: State, rhs: State) -> torch.Tensor:
    """``KL(N(lhs.mean, lhs.std) || N(rhs.mean, rhs.std))`` summed over ``Z``: ``(..., Z)`` -> ``(...)``.

    ``rhs`` may hold plain floats or broadcastable tensors (e.g. the global prior ``mean 0, std 1``).
    """
    var_ratio = (lhs["std"] / rhs["std"]) ** 2
    t1 = ((lhs["mean"] - rhs["mean"]) / rhs["std"]) ** 2
    return (0.5 * (var_ratio + t1 - 1.0 - torch.log(var_ratio))).sum(-1)


def overshooting_kl(rssm: GaussianRSSM, post: State, prev_action: torch.Tensor, is_first: torch.Tensor,
                    distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent overshooting KLs (PlaNet section 4, eq. 7): open-loop priors ``d = 1..distance`` steps ahead.

    For every start ``t - d`` the prior is rolled forward with the observed actions from the posterior at
    ``t - d`` (with gradient) to time ``t`` and compared with the posterior at ``t``, whose gradient is stopped
    (as in the reference): ``kl[d-1, t] = KL(sg(q(s_t | o_<=t)) || p(s_t | s_{t-d}, a_{t-d:t}))``.
    Distance 1 is the standard one-step KL (same value and prior-side gradient as :func:`gaussian_kl` of
    ``observe``'s posterior and prior).

    Args:
        rssm: a :class:`GaussianRSSM`.
        post: posterior states ``(T, B, ...)`` from :meth:`GaussianRSSM.observe`.
        prev_action: ``(T, B, A)``; ``prev_action[t]`` leads into ``t``.
        is_first: ``(T, B)`` bool; a chain never crosses a step where ``is_first`` is set.
        distance: ``D >= 1``.

    Returns:
        ``(kl, mask)``, both ``(D, T, B)``: ``mask[d-1, t]`` is 1 where a prediction ``d`` steps ahead exists
        (``t >= d`` and no ``is_first`` in ``t-d+1 .. t``); ``kl`` is 0 elsewhere.

    Raises:
        ValueError: ``distance < 1``.
    """
    if distance < 1:
        raise ValueError(f"overshooting_kl: distance must be >= 1, got {distance}")
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
