"""The Gaussian RSSM of PlaNet (Hafner et al. 2019, section 3; google-research/planet ``planet/models/rssm.py``).

State ``s_t = (h_t, z_t)``: ``deter`` ``h_t`` ``(..., D)`` from the block GRU of TensorFlow's ``GRUBlockCell``
(:class:`reverie.models.planet_nets.BlockGRUCell`; ``belief_size`` 200), ``stoch`` ``z_t`` ``(..., Z)`` a diagonal
Gaussian latent (``state_size`` 30) with its ``mean`` and ``std`` (``std = softplus(raw) + min_std``, ``min_stddev``
0.1), one hidden layer of width ``units`` (``embed_size`` 200) with activation ``act`` before the GRU, the prior and
the posterior (the config's ``relu``, ``scripts/configs.py:109,136``, not the class default ``elu``). One step::

    h_t = GRU(act(W_z z_{t-1} + W_a prev_action_t + b), h_{t-1})
    prior     p(z_t | h_t):          (mean, std) = W_2 act(W_1 h_t + b_1) + b_2
    posterior q(z_t | h_t, e_t):     (mean, std) = W_out act(W_h h_t + W_e e_t + b_e) + b_out

Weights are glorot-uniform with the fans of the reference's unsplit layers and biases zero (TensorFlow's defaults).
The initial state is zeros (reference ``zero_state``); ``is_first`` resets to it. Losses (PlaNet section 3-4,
google-research/planet ``training/utility.py:209-227``): ``kl`` = ``max(0, KL(post || prior) - free_nats)`` (3 nats;
both sides trained), ``global_kl`` = ``KL(post || N(0, 1))`` (reference ``global_divergence_scale``, 0 by default),
and with ``overshooting = D >= 2`` the latent overshooting loss ``overshooting`` over distances ``2..D`` (section 4,
eq. 7; :func:`overshooting_loss`). Training is always the readable path (no kernels).
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
    """PlaNet's RSSM, a :class:`reverie.models.dynamics.Dynamics` (module docstring).

    Args:
        action_dim: ``A``. embed_dim: ``E`` (both filled in by the world model).
        deter: ``D`` (``belief_size`` 200). stoch: ``Z`` (``state_size`` 30). units: hidden width (200).
        min_std: floor of the latent std (``min_stddev`` 0.1). free_nats: of ``kl`` and overshooting (3.0).
        overshooting: latent overshooting distance ``D`` (0: off; else ``D >= 2``, distances ``2..D``; the paper
            uses 50). act: activation of the hidden layers (reference config ``activation: relu``).

    State entries: ``deter (..., D)``, ``stoch (..., Z)``, ``mean (..., Z)``, ``std (..., Z)``; features and the
    carry read ``deter`` and ``stoch`` (:class:`reverie.models.dynamics.base.RowState`).

    Raises:
        ValueError: ``min_std <= 0``, ``overshooting`` negative or 1 (distance 1 is the one-step ``kl``), or an
            unknown ``act``.
    """

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
        # TensorFlow's default init of each reference layer: split layers take the whole layer's fans, and the
        # (mean, std) output layers are two Dense(Z) layers in the reference (models/rssm.py:106-107, 127-128)
        fans = {self.in_z: (Z + A, units), self.in_a: (Z + A, units), self.prior_net[0]: (D, units),
                self.prior_net[2]: (units, Z), self.post_h: (D + E, units), self.post_e: (D + E, units),
                self.post_out: (units, Z)}
        for layer, (fan_in, fan_out) in fans.items():
            glorot_uniform_(layer.weight, fan_in, fan_out)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

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
        stoch = mean + std * draws.normal_noise(mean, std) if sample else mean
        return {"deter": deter, "stoch": stoch, "mean": mean, "std": std}

    def _cell(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        """``h_t`` ``(B, D)`` from the state at ``t - 1`` and the projected action ``(B, units)``."""
        return self.gru(self.act(self.in_z(state["stoch"]) + action_proj), state["deter"])

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
            post = self._gaussian(deter, self.post_out(self.act(self.post_h(deter) + embed_proj[t])), sample)
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
        """Roll the prior from ``start`` ``(N, ...)`` with the policy's actions (:meth:`Dynamics.imagine`); the
        states hold :attr:`feature_keys`."""
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``kl``, ``global_kl`` (and ``overshooting``) ``(T, B)``; info: the unclipped ``kl``, the entropies and the
        prior's mean std.

        ``kl`` is :func:`free_nats_hinge` of the one-step KL (reference ``utility.py:209-211``); ``global_kl`` has no
        free nats (the camera-ready reference's ``global_divergence``); ``overshooting`` is :func:`overshooting_loss`.
        """
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
    """``KL(N(lhs.mean, lhs.std) || N(rhs.mean, rhs.std))`` summed over ``Z``: ``(..., Z)`` -> ``(...)``.

    ``rhs`` may hold plain floats or broadcastable tensors (e.g. the global prior ``mean 0, std 1``).
    """
    var_ratio = (lhs["std"] / rhs["std"]) ** 2
    t1 = ((lhs["mean"] - rhs["mean"]) / rhs["std"]) ** 2
    return (0.5 * (var_ratio + t1 - 1.0 - torch.log(var_ratio))).sum(-1)


def free_nats_hinge(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """``max(0, kl - free_nats)`` elementwise (PlaNet, google-research/planet ``training/utility.py:211,226``): the
    gradient of :func:`reverie.models.dynamics.free_bits`, and a loss value that is 0, not ``free_nats``, while the KL
    is below it."""
    return torch.clamp(kl - free_nats, min=0.0)


def overshooting_kl(rssm: GaussianRSSM, post: State, prior: State, prev_action: torch.Tensor, is_first: torch.Tensor,
                    distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent overshooting KLs for distances ``d = 2..distance`` (PlaNet section 4, eq. 7).

    A chain starts at every step ``s = -1 .. T-2`` (``-1``: the state before the batch, the zero state as at the
    start of the reference's chunks), takes the one-step prior of ``observe`` at ``s + 1`` (``prior``; a reset where
    ``is_first[s + 1]``), then rolls the prior forward open-loop with the observed actions (sampled latents, with
    gradient) and at each target time ``t = s + d`` is compared with the posterior at ``t``, whose gradient is
    stopped: ``kl[d-2, t] = KL(sg(q(s_t | o_<=t)) || p(s_t | s_{t-d}, a_{t-d+1:t}))``. Distance 1 is the one-step
    ``kl`` term and is not repeated here. google-research/planet ``tools/overshooting.py`` and
    ``training/utility.py:214-227`` (rows ``1:-1`` of ``overshooting_distance + 1``: distances ``2..D``, from
    ``posterior[t-1]`` or the zero state at ``t = 0``, ``os_stop_posterior_grad: True``).

    Args:
        rssm: a :class:`GaussianRSSM`.
        post, prior: posterior and prior states ``(T, B, ...)`` of :meth:`GaussianRSSM.observe`.
        prev_action: ``(T, B, A)``; ``prev_action[t]`` leads into ``t``.
        is_first: ``(T, B)`` bool; a chain may start at a reset (its first step) but never crosses one after that.
        distance: ``D >= 2``.

    Returns:
        ``(kl, mask)``, both ``(D-1, T, B)``: ``mask[d-2, t]`` is 1 where a chain of length ``d`` ends at ``t``
        (``t >= d - 1`` and no ``is_first`` in ``t-d+2 .. t``); ``kl`` is 0 elsewhere.

    Raises:
        ValueError: ``distance < 2``.
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
    """The ``overshooting`` loss ``(T, B)``: ``sum over d = 2..D of max(0, kl[d-2, t] - free_nats)`` (0 where no
    chain ends) divided by ``D - 1``, so that its mean over ``(T, B)`` is the reference's ``reduce_mean`` over all
    ``B x T x (D - 1)`` (start, distance) entries, chains past the chunk's end counting as 0
    (google-research/planet ``training/utility.py:217-227,233``). The agent scales it by ``overshooting_scale``
    next to the one-step ``kl`` term's ``divergence_scale``: distance 1 has weight 1, distances ``2..D`` share one.

    Raises:
        ValueError: as :func:`overshooting_kl`.
    """
    kl, mask = overshooting_kl(rssm, post, prior, prev_action, is_first, distance)
    return (free_nats_hinge(kl, free_nats) * mask).sum(0) / (distance - 1)  # (D-1, T, B) -> (T, B)
