"""The categorical RSSM of DreamerV3 (Hafner et al. 2023, section 3; 2023 reference ``dreamerv3/nets.py``, ``RSSM``).

State ``s_t = (h_t, z_t)``: ``deter`` ``h_t`` ``(..., D)`` from a LayerNorm GRU, ``stoch`` ``z_t`` ``(..., S, K)``,
``S`` one-hot categorical latents of ``K`` classes mixed with 1% uniform ("unimix"), and their ``logits``
``(..., S, K)``. One step (reference ``img_step`` and ``obs_step``)::

    x_t    = silu(LN(W_z z_{t-1} + W_a prev_action_t))         input layer ("img_in")
    h_t    = GRU(x_t, h_{t-1})                                 LayerNorm GRU, update = sigmoid(u - 1)
    prior     p(z_t | h_t):          logits = prior_net(h_t)                        ("img_out", "imgs_stats")
    posterior q(z_t | h_t, e_t):     logits = W_out silu(LN(W_h h_t + W_e e_t))     ("obs_out", "obs_stats")
    z_t    = straight-through one-hot sample of unimix(logits)

``is_first_t`` replaces ``(h_{t-1}, z_{t-1})`` by the learned initial state (``deter = tanh(w)``, ``stoch`` its
prior mode; reference ``initial: learned``) and zeroes ``prev_action_t``. The losses are DreamerV3 eq. 5: ``dyn``
and ``rep``, the KL in both stop-gradient directions, each clipped below at ``free_nats`` (1 nat).

This file is the readable path (``kernels="off"``) and imports nothing from the kernels. Once
:func:`reverie.models.kernels.install` has set ``self.kernels`` (an agent with ``kernels="auto"``), the methods
marked "kernels" hand the same computation to :mod:`reverie.models.kernels.rssm` (the observe scan as one autograd
node, deferred weight gradients, features with the one-hot part as class indices, imagination by class index, the
straight-through sample as one node): the same values and draws, gradients up to float rounding.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.distributions import UnimixCategorical, one_hot_index, unimix_logits, unimix_sample
from reverie.models.dynamics.base import Policy, RowState, State, free_bits, reset, rollout
from reverie.models.networks import MLP, trunc_normal_init_
from reverie.models.switch import resolve


class GRUCell(nn.Module):
    """LayerNorm GRU of the DreamerV3 reference (``nets.py`` ``RSSM._gru``: ``update = sigmoid(u - 1)``).

    ``forward(x (B, I), h (B, D)) -> (B, D)``: the gates in the compute dtype, the state in ``h``'s dtype or
    wider (float32 from a float32 ``h`` under bf16 autocast), mixed as ``lerp(h, cand, update)`` (the reference's
    ``update * cand + (1 - update) * h``, one kernel instead of four).
    """

    def __init__(self, in_dim: int, deter: int, eps: float = 1e-3):
        super().__init__()
        self.linear = nn.Linear(in_dim + deter, 3 * deter, bias=False)
        self.norm = nn.LayerNorm(3 * deter, eps=eps)
        trunc_normal_init_(self.linear.weight)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # under autocast h in x's (compute) dtype before the concatenation: the values autocast would give the
        # linear layer (a float32 cat rounded to bf16), without the float32 (B, I + D) copy; otherwise promoted
        cat_dtype = x.dtype if torch.is_autocast_enabled(x.device.type) else torch.promote_types(x.dtype, h.dtype)
        parts = self.norm(self.linear(torch.cat([x.to(cat_dtype), h.to(cat_dtype)], -1)))
        reset_gate, cand, update = parts.chunk(3, -1)
        cand = torch.tanh(torch.sigmoid(reset_gate) * cand)
        update = torch.sigmoid(update - 1.0)
        # h as it is: a float32 state stays float32 under bf16 autocast (rounding it to bf16 was 2-3% faster but
        # learned CartPole worse in the same seeds: docs/changelog.md, round 3)
        dtype = torch.promote_types(h.dtype, update.dtype)
        return torch.lerp(h.to(dtype), cand.to(dtype), update.to(dtype))


class CategoricalRSSM(RowState, nn.Module):
    """DreamerV3's RSSM, a :class:`reverie.models.dynamics.Dynamics` (module docstring).

    Args:
        action_dim: ``A``. embed_dim: ``E``, the encoder's output width (both filled in by the world model).
        deter: ``D`` (reference ``deter``; size presets). stoch: ``S`` latent groups. classes: ``K`` per group.
        units: hidden width of the input and posterior layers and the prior net (reference ``hidden``).
        unimix: uniform mix of the latent distributions (reference ``unimix: 0.01``).
        free_nats: free bits of ``dyn`` and ``rep`` (reference ``dyn_free``/``rep_free``: 1.0).
        action_clip: every action entering the dynamics (replayed and imagined) is scaled elementwise by
            ``sg(clip / max(clip, |a|))`` (:func:`scale_action`; reference ``rssm.action_clip: 1.0``, ``nets.py``
            ``RSSM.obs_step``/``img_step``); 0 turns it off.
        kernels: ``"auto"``: :func:`reverie.models.kernels.install` may give it the fast paths of
            :mod:`reverie.models.kernels.rssm` (an agent with ``kernels="auto"`` does, after building it);
            ``"off"``: this file only, whatever installs kernels. Built alone it runs this file until installed.

    State entries: ``deter (..., D)``, ``stoch (..., S, K)``, ``logits (..., S, K)``; features and the carry read
    ``deter`` and ``stoch`` (:class:`reverie.models.dynamics.base.RowState`: starts are posterior rows, the carry the
    last row, the replay context stores ``deter (D,)`` and ``stoch (S, K)``).

    Raises:
        ValueError: an unknown ``kernels``.
    """

    loss_keys = ("dyn", "rep")
    state_keys = ("deter", "stoch", "logits")
    feature_keys = ("deter", "stoch")  # what features() reads (kernels: deter and the class index)
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
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may put its fast paths here
        self.kernels = None  # install: the fast paths (reverie.models.kernels.rssm.RSSMKernels), used where not None

    # ------------------------------------------------------------------------------------------------ states
    def initial(self, batch: int) -> State:
        """Learned initial state ``(batch, ...)``: ``deter = tanh(w)`` ``(B, D)``, ``stoch`` the prior's mode."""
        deter = torch.tanh(self.initial_deter).expand(batch, self.deter)
        logits = self._prior_logits(deter)
        return {"deter": deter, "stoch": self._draw(logits, sample=False), "logits": logits}

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, flat stoch)`` ``(..., D + S*K)``. kernels: the same as a
        :class:`reverie.models.kernels.onehot_linear.SplitFeat` (every head's first layer reads either)."""
        if self.kernels is not None:
            return self.kernels.features(state)
        return torch.cat([state["deter"], state["stoch"].flatten(-2)], -1)  # (..., S, K) -> (..., S*K), concat

    def dist(self, state: State) -> torch.distributions.Independent:
        """The latent distribution of a state (or of its logits ``(..., S, K)``): event shape ``(S, K)``."""
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
        return unimix_sample(logits, self.unimix, fast=self.kernels is not None)  # kernels: one autograd node

    def _action_input(self, action: torch.Tensor) -> torch.Tensor:
        """The action's part of the input layer ``(..., units)``, the action scaled into ``[-clip, clip]`` first."""
        return self.in_a(scale_action(action, self.action_clip))

    def _cell(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        """``h_t`` ``(B, D)`` from the state at ``t - 1`` and the projected action ``(B, units)``."""
        z = state["stoch"].flatten(-2) if self.kernels is None else self.kernels.cell_input(state)  # (B, S*K)
        return self.gru(self.in_norm(self.in_z(z) + action_proj), state["deter"])

    # ----------------------------------------------------------------------------------------------- observe
    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Posterior and prior states along observed sequences (:meth:`reverie.models.dynamics.Dynamics.observe`):
        ``embed (T, B, E)``, ``prev_action (T, B, A)``, ``is_first (T, B)`` -> states ``(T, B, ...)``;
        ``prior["stoch"]`` is drawn from the prior (open-loop summaries read it).

        kernels: sampled, with autograd, on CPU the scan runs as one autograd node (the same values and draws).
        """
        T, B = is_first.shape
        init = self.initial(B)  # what is_first resets to
        state = init if state is None else state
        action_proj = self._action_input(prev_action)  # (T, B, units), in the compute dtype under autocast
        first = is_first.to(action_proj.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        action_proj = action_proj * (1.0 - first)  # zero action where is_first
        embed_proj = self.post_e(embed)  # (T, B, units)
        post = None
        if self.kernels is not None:
            post = self.kernels.observe(action_proj, embed_proj, first, is_first, state, init, sample)
        if post is None:
            post = self._observe_steps(action_proj, embed_proj, first, state, init, sample)
        prior_logits = self._prior_logits(post["deter"])  # all steps at once: (T, B, D) -> (T, B, S, K)
        return post, {"deter": post["deter"], "stoch": self._draw(prior_logits, sample), "logits": prior_logits}

    def _observe_steps(self, action_proj: torch.Tensor, embed_proj: torch.Tensor, first: torch.Tensor,
                       state: State, init: State, sample: bool) -> State:
        """The observe scan, step by step: ``(T, B, units)`` projections -> posterior states ``(T, B, ...)``."""
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.state_keys}
        state = {"deter": state["deter"], "stoch": state["stoch"]}
        # one unbind per sequence tensor rather than a select per step (the backward of T selects would add up T
        # zero-filled (T, B, units) gradients)
        steps = zip(action_proj.unbind(0), embed_proj.unbind(0), first.unbind(0))  # T x (B, ...)
        with self.kernels.deferred_weights() if self.kernels is not None else contextlib.nullcontext():
            for action_t, embed_t, first_t in steps:
                state = reset(state, init, first_t)  # the initial state where is_first
                deter = self._cell(state, action_t)
                logits = self._posterior_logits(deter, embed_t)  # (B, S, K)
                state = {"deter": deter, "stoch": self._draw(logits, sample)}
                for key, value in (*state.items(), ("logits", logits)):
                    out[key].append(value)
        return {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)

    # ----------------------------------------------------------------------------------------------- imagine
    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step: state ``(N, ...)`` and action ``(N, A)`` -> the next prior state ``(N, ...)``. The action
        is scaled into ``[-clip, clip]`` first (:func:`scale_action`), with the gradient of ``a * sg(scale)``."""
        deter = self._cell(state, self._action_input(action))
        logits = self._prior_logits(deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits}

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior from ``start`` ``(N, ...)`` (DreamerV3 section 4; :meth:`Dynamics.imagine`).

        The states hold :attr:`feature_keys` (``deter``, ``stoch``). kernels: what :meth:`features` reads there
        (``deter`` and the class ``index``; ``stoch`` only where a gradient flows through it) and, without autograd,
        skip the one-hot latent altogether.
        """
        if self.kernels is not None:
            return self.kernels.imagine(policy, start, horizon)
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``dyn`` and ``rep`` ``(T, B)`` (:func:`kl_losses`), and the unclipped ``kl`` and the entropies as info."""
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {k: kl[k].mean() for k in ("kl", "prior_entropy", "post_entropy")}


def scale_action(action: torch.Tensor, clip: float) -> torch.Tensor:
    """``action * sg(clip / max(clip, |action|))`` elementwise: the value of ``clamp(action, -clip, clip)`` with the
    gradient of a pass-through scaled by ``sg(clip / |action|)`` where ``|action| > clip`` (a clamp would give 0
    there). 2023 DreamerV3 reference ``nets.py`` ``RSSM.img_step``/``obs_step`` (``action_clip: 1.0``): continuous
    actions sampled from the actor's unbounded normal enter the dynamics inside ``[-1, 1]``. One-hot actions are
    unchanged. ``clip <= 0``: ``action`` itself. Shapes ``(..., A)`` in and out."""
    if clip <= 0:
        return action
    return action * (clip / torch.clamp(action.detach().abs(), min=clip))


def categorical_kl(lhs_logits: torch.Tensor, rhs_logits: torch.Tensor) -> torch.Tensor:
    """``KL(lhs || rhs)`` of independent categoricals ``(..., S, K)`` summed over ``S`` -> ``(...)``.

    Logits are normalised here; apply :func:`reverie.models.distributions.unimix_logits` first where the
    distributions use unimix.
    """
    lhs_logp = F.log_softmax(lhs_logits, -1)
    rhs_logp = F.log_softmax(rhs_logits, -1)
    return (lhs_logp.exp() * (lhs_logp - rhs_logp)).sum((-2, -1))


def kl_losses(post_logits: torch.Tensor, prior_logits: torch.Tensor, free_nats: float = 1.0,
              unimix: float = 0.01) -> dict[str, torch.Tensor]:
    """Dynamics and representation losses with free bits (DreamerV3 eq. 5).

    ``dyn = max(free, KL(sg(post) || prior))`` trains the prior; ``rep = max(free, KL(post || sg(prior)))``
    trains the encoder/posterior. ``free`` clips each ``(t, b)`` KL after summing over latents (reference
    ``dyn_free``/``rep_free``: 1 nat). Inputs: raw logits ``(T, B, S, K)`` (``unimix`` is applied here, as in the
    latent distributions). Outputs ``(T, B)`` each, plus the unclipped ``kl`` and the entropies
    ``post_entropy``/``prior_entropy`` (no gradient).
    """
    # unimix_logits are normalised log-probabilities: categorical_kl's log_softmax would return them unchanged,
    # so the KL is written out once on them (the same numbers, a quarter of the passes over (T, B, S, K)); float32
    # at least, as every distribution (the logits come from 16-bit layers under autocast)
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
