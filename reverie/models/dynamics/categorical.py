"""The categorical RSSM of DreamerV3 (Hafner et al. 2023, section 3; 2023 reference ``dreamerv3/nets.py``, ``RSSM``).

State: ``deter`` ``h_t (..., D)`` from a LayerNorm GRU, ``stoch`` ``z_t (..., S, K)`` one-hot (1% unimix) and
``logits (..., S, K)``. Reference ``img_step``/``obs_step``: ``h_t = GRU(silu(LN(W_z z_{t-1} + W_a a_{t-1})), h_{t-1})``
("img_in"), prior logits ``prior_net(h_t)`` ("img_out", "imgs_stats"), posterior ``W_out silu(LN(W_h h_t + W_e e_t))``
("obs_out", "obs_stats"); a learned initial state (``initial: learned``); losses ``dyn``/``rep`` (eq. 5).
This file is the readable path; under ``kernels=auto`` :func:`reverie.models.kernels.install` makes the module a
subclass whose observe scan is one autograd node (:mod:`reverie.models.kernels.rssm`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.distributions import UnimixCategorical, one_hot_index, unimix_logits, unimix_sample
from reverie.models.dynamics.base import Policy, RowState, State, free_bits, reset, rollout
from reverie.models.networks import MLP, trunc_normal_init_
from reverie.models.switch import resolve


class GRUCell(nn.Module):
    """LayerNorm GRU (reference ``nets.py`` ``RSSM._gru``, ``update = sigmoid(u - 1)``): ``x (B, I)``, ``h (B, D)``
    -> ``(B, D)`` in ``h``'s dtype or wider (a float32 ``h`` stays float32 under bf16 autocast)."""

    def __init__(self, in_dim: int, deter: int, eps: float = 1e-3):
        super().__init__()
        self.linear = nn.Linear(in_dim + deter, 3 * deter, bias=False)
        self.norm = nn.LayerNorm(3 * deter, eps=eps)
        trunc_normal_init_(self.linear.weight)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # under autocast: what autocast would give the linear layer, without a float32 (B, I + D) copy
        cat_dtype = x.dtype if torch.is_autocast_enabled(x.device.type) else torch.promote_types(x.dtype, h.dtype)
        parts = self.norm(self.linear(torch.cat([x.to(cat_dtype), h.to(cat_dtype)], -1)))
        reset_gate, cand, update = parts.chunk(3, -1)
        cand = torch.tanh(torch.sigmoid(reset_gate) * cand)
        update = torch.sigmoid(update - 1.0)
        # a float32 state stays float32 under bf16 autocast (bf16 learned worse: docs/changelog.md, round 3)
        dtype = torch.promote_types(h.dtype, update.dtype)
        return torch.lerp(h.to(dtype), cand.to(dtype), update.to(dtype))


class CategoricalRSSM(RowState, nn.Module):
    """DreamerV3's RSSM, a :class:`reverie.models.dynamics.Dynamics`: ``deter`` ``D``, ``S = stoch`` groups of
    ``K = classes``, ``units`` (reference ``hidden``), ``unimix`` 0.01, ``free_nats`` 1.0 (``dyn_free``/``rep_free``),
    ``action_clip`` (:func:`scale_action`; 0: off), ``kernels`` ``"auto"`` (install may swap in the fast subclass) or
    ``"off"``.
    Raises ValueError for an unknown ``kernels``.
    """

    loss_keys = ("dyn", "rep")
    state_keys = ("deter", "stoch", "logits")
    feature_keys = ("deter", "stoch")  # what features() reads
    carry_keys = ("deter", "stoch")  # what observe(state=) and img_step read

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 512, stoch: int = 32, classes: int = 32,
                 units: int = 512, unimix: float = 0.01, free_nats: float = 1.0, action_clip: float = 1.0,
                 kernels: str = "auto"):
        super().__init__()
        self.deter, self.stoch, self.classes, self.unimix = deter, stoch, classes, unimix
        self.action_dim, self.embed_dim, self.free_nats = action_dim, embed_dim, free_nats
        self.action_clip = float(action_clip)
        self.feat_dim = deter + stoch * classes
        # img_in: Linear(cat(z, a)) split in two bias-free parts, so the action part is projected once per sequence
        self.in_z = nn.Linear(stoch * classes, units, bias=False)
        self.in_a = nn.Linear(action_dim, units, bias=False)
        self.in_norm = nn.Sequential(nn.LayerNorm(units, eps=1e-3), nn.SiLU())
        trunc_normal_init_(self.in_z.weight)
        trunc_normal_init_(self.in_a.weight)
        self.gru = GRUCell(units, deter)
        self.prior_net = MLP(deter, stoch * classes, units=units, layers=1)
        # obs_out: Linear(cat(h, embed)) split likewise, so the embedding part is projected once per sequence
        self.post_h = nn.Linear(deter, units, bias=False)
        self.post_e = nn.Linear(embed_dim, units, bias=False)
        self.post_norm = nn.Sequential(nn.LayerNorm(units, eps=1e-3), nn.SiLU())
        self.post_out = nn.Linear(units, stoch * classes)
        for layer in (self.post_h, self.post_e, self.post_out):
            trunc_normal_init_(layer.weight)
        nn.init.zeros_(self.post_out.bias)
        self.initial_deter = nn.Parameter(torch.zeros(deter))  # learned initial state (reference initial: learned)
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may swap in its subclass

    def initial(self, batch: int) -> State:
        """Learned initial state ``(batch, ...)``: ``deter = tanh(w)`` ``(B, D)``, ``stoch`` the prior's mode."""
        deter = torch.tanh(self.initial_deter).expand(batch, self.deter)
        logits = self._prior_logits(deter)
        return {"deter": deter, "stoch": self._draw(logits, sample=False), "logits": logits}

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, flat stoch)`` ``(..., D + S*K)``."""
        return torch.cat([state["deter"], state["stoch"].flatten(-2)], -1)  # (..., S, K) -> (..., S*K), concat

    def dist(self, state: State) -> torch.distributions.Independent:
        """The latent distribution of a state or its logits ``(..., S, K)``, event shape ``(S, K)``."""
        logits = state["logits"] if isinstance(state, dict) else state
        return torch.distributions.Independent(UnimixCategorical(logits, self.unimix), 1)

    def _prior_logits(self, deter: torch.Tensor) -> torch.Tensor:
        return self.prior_net(deter).unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _posterior_logits(self, deter: torch.Tensor, embed_proj: torch.Tensor) -> torch.Tensor:
        logits = self.post_out(self.post_norm(self.post_h(deter) + embed_proj))  # (..., S*K)
        return logits.unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _draw(self, logits: torch.Tensor, sample: bool) -> torch.Tensor:
        """One-hot ``(..., S, K)``: a straight-through sample of the unimix distribution, or its mode."""
        if not sample:
            dtype = torch.promote_types(logits.dtype, torch.float32)
            return one_hot_index(logits.argmax(-1), self.classes, dtype)  # the mode (unimix keeps the argmax)
        return unimix_sample(logits, self.unimix)

    def _action_input(self, action: torch.Tensor) -> torch.Tensor:
        """The action's part of the input layer ``(..., units)``."""
        return self.in_a(scale_action(action, self.action_clip))

    def _cell(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        """``h_t`` ``(B, D)`` from the state at ``t - 1`` and the projected action ``(B, units)``."""
        z = state["stoch"].flatten(-2)  # (B, S, K) -> (B, S*K)
        return self.gru(self.in_norm(self.in_z(z) + action_proj), state["deter"])

    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """:meth:`Dynamics.observe`: ``(T, B, ...)`` states; ``prior["stoch"]`` is drawn from the prior."""
        T, B = is_first.shape
        init = self.initial(B)  # what is_first resets to
        state = init if state is None else state
        action_proj = self._action_input(prev_action)  # (T, B, units), in the compute dtype under autocast
        first = is_first.to(action_proj.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        action_proj = action_proj * (1.0 - first)  # zero action where is_first
        embed_proj = self.post_e(embed)  # (T, B, units)
        post = self._observe_steps(action_proj, embed_proj, first, state, init, sample)
        prior_logits = self._prior_logits(post["deter"])  # all steps at once: (T, B, D) -> (T, B, S, K)
        return post, {"deter": post["deter"], "stoch": self._draw(prior_logits, sample), "logits": prior_logits}

    def _observe_steps(self, action_proj: torch.Tensor, embed_proj: torch.Tensor, first: torch.Tensor,
                       state: State, init: State, sample: bool) -> State:
        """The observe scan, step by step: ``(T, B, units)`` projections -> posterior states ``(T, B, ...)``."""
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.state_keys}
        state = {"deter": state["deter"], "stoch": state["stoch"]}
        # unbind, not T selects: their backward would add up T zero-filled (T, B, units) gradients
        steps = zip(action_proj.unbind(0), embed_proj.unbind(0), first.unbind(0))  # T x (B, ...)
        for action_t, embed_t, first_t in steps:
            state = reset(state, init, first_t)  # the initial state where is_first
            deter = self._cell(state, action_t)
            logits = self._posterior_logits(deter, embed_t)  # (B, S, K)
            state = {"deter": deter, "stoch": self._draw(logits, sample)}
            for key, value in (*state.items(), ("logits", logits)):
                out[key].append(value)
        return {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)

    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step: state ``(N, ...)``, action ``(N, A)`` (:func:`scale_action` first) -> ``(N, ...)``."""
        deter = self._cell(state, self._action_input(action))
        logits = self._prior_logits(deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits}

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """:meth:`Dynamics.imagine` (DreamerV3 section 4)."""
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``dyn`` and ``rep`` ``(T, B)`` (:func:`kl_losses`), and the unclipped ``kl`` and the entropies as info."""
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {k: kl[k].mean() for k in ("kl", "prior_entropy", "post_entropy")}


def scale_action(action: torch.Tensor, clip: float) -> torch.Tensor:
    """``action * sg(clip / max(clip, |action|))`` ``(..., A)``: a clamp's value with a nonzero gradient (reference
    ``nets.py`` ``RSSM.img_step``/``obs_step``, ``action_clip: 1.0``); ``clip <= 0``: ``action`` itself."""
    if clip <= 0:
        return action
    return action * (clip / torch.clamp(action.detach().abs(), min=clip))


def categorical_kl(lhs_logits: torch.Tensor, rhs_logits: torch.Tensor) -> torch.Tensor:
    """``KL(lhs || rhs)`` of categoricals ``(..., S, K)`` summed over ``S`` -> ``(...)``; apply unimix first."""
    lhs_logp = F.log_softmax(lhs_logits, -1)
    rhs_logp = F.log_softmax(rhs_logits, -1)
    return (lhs_logp.exp() * (lhs_logp - rhs_logp)).sum((-2, -1))


def kl_losses(post_logits: torch.Tensor, prior_logits: torch.Tensor, free_nats: float = 1.0,
              unimix: float = 0.01) -> dict[str, torch.Tensor]:
    """DreamerV3 eq. 5 from raw logits ``(T, B, S, K)``: ``dyn = max(free, KL(sg(post) || prior))``, ``rep =
    max(free, KL(post || sg(prior)))`` ``(T, B)``, plus unclipped ``kl`` and the entropies (no gradient)."""
    # unimix_logits are already normalised, so no log_softmax; float32 at least (16-bit logits under autocast)
    dtype = torch.promote_types(post_logits.dtype, torch.float32)
    post_logp, prior_logp = unimix_logits(post_logits.to(dtype), unimix), unimix_logits(prior_logits.to(dtype), unimix)
    post_p = post_logp.exp()
    post_p_sg, post_logp_sg, prior_logp_sg = post_p.detach(), post_logp.detach(), prior_logp.detach()
    dyn = (post_p_sg * (post_logp_sg - prior_logp)).sum((-2, -1))
    rep = (post_p * (post_logp - prior_logp_sg)).sum((-2, -1))
    with torch.no_grad():  # entropies of the unimix latent distributions, summed over S (summaries)
        post_entropy = -(post_p_sg * post_logp_sg).sum((-2, -1))
        prior_entropy = -(prior_logp_sg.exp() * prior_logp_sg).sum((-2, -1))
    return {"dyn": free_bits(dyn, free_nats), "rep": free_bits(rep, free_nats), "kl": dyn.detach(),
            "post_entropy": post_entropy, "prior_entropy": prior_entropy}
