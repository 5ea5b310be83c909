"""Recurrent state-space model (Hafner et al. 2019 PlaNet section 3; DreamerV3 section 3).

State ``s_t = (h_t, z_t)``: ``deter`` ``h_t`` ``(..., D)`` from a GRU and ``stoch`` ``z_t``, either ``(..., S, K)``
one-hot categorical latents (``latent="categorical"``, DreamerV3; state also holds ``logits``) or ``(..., Z)``
diagonal Gaussian latents (``latent="gaussian"``, PlaNet; state also holds ``mean`` and ``std``, ``std =
softplus(raw) + min_std``). Timing (see :mod:`reverie.types`)::

    h_t = f(h_{t-1}, z_{t-1}, prev_action_t)      prev_action_t = action_{t-1}, zero where is_first_t
    prior     p(z_t | h_t)                       ("imagine": no observation)
    posterior q(z_t | h_t, embed_t)              ("observe")

Where ``is_first_t`` is set the previous state is replaced by the learned initial state and the previous
action by zero, so a row's states from an ``is_first`` step on do not depend on what came before.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.conv import ACTIVATIONS
from reverie.models.distributions import UnimixCategorical, one_hot_index, unimix_sample, unimix_sample_index
from reverie.models.networks import MLP, trunc_normal_init_
from reverie.models.onehot_linear import FeatLinear, SplitFeat, one_hot_argmax
from reverie.models.observe_scan import observe_scan
from reverie.models.planet_nets import BlockGRUCell, glorot_uniform_
from reverie.models.scan_linear import ScanLinears

State = dict[str, torch.Tensor]

# The cell's input layer takes the one-hot latent by row gathers from this many rows on (imagination: T*B); below,
# in the observe scan (B rows per step), the dense product is cheaper than the gather's extra small ops.
_GATHER_MIN_ROWS = 256


class GRUCell(nn.Module):
    """LayerNorm GRU of the DreamerV3 reference (``rssm.py``: ``update = sigmoid(u - 1)``).

    ``forward(x (B, I), h (B, D)) -> (B, D)``: the gates in the compute dtype, the state in ``h``'s dtype or
    wider (float32 from a float32 ``h`` under bf16 autocast), mixed as ``lerp(h, cand, update)`` (the reference's
    ``update * cand + (1 - update) * h``, one kernel instead of four).
    """

    def __init__(self, in_dim: int, deter: int, eps: float = 1e-3):
        super().__init__()
        self.linear = nn.Linear(in_dim + deter, 3 * deter, bias=False)
        self.norm = nn.LayerNorm(3 * deter, eps=eps)
        trunc_normal_init_(self.linear.weight)

    def forward(self, x: torch.Tensor, h: torch.Tensor, linear: Callable | None = None) -> torch.Tensor:
        """``linear``: applies ``self.linear`` instead of calling it (a scan's :class:`ScanLinears`)."""
        # under autocast h in x's (compute) dtype before the concatenation: the values autocast would give the
        # linear layer (a float32 cat rounded to bf16), without the float32 (B, I + D) copy; otherwise promoted
        cat_dtype = x.dtype if torch.is_autocast_enabled(x.device.type) else torch.promote_types(x.dtype, h.dtype)
        parts = self.norm((linear or self.linear)(torch.cat([x.to(cat_dtype), h.to(cat_dtype)], -1)))
        reset, cand, update = parts.chunk(3, -1)
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        # h as it is: a float32 state stays float32 under bf16 autocast (rounding it to bf16 here was 2-3% faster
        # but learned CartPole worse in the same seeds: docs/speed.md, round 3)
        dtype = torch.promote_types(h.dtype, update.dtype)
        return torch.lerp(h.to(dtype), cand.to(dtype), update.to(dtype))


class RSSM(nn.Module):
    """One RSSM with categorical (DreamerV3) or Gaussian (PlaNet) latents.

    ``latent="categorical"``: LayerNorm GRU ``D``, ``S x K`` one-hot latents with unimix, learned initial state
    (DreamerV3 2023 reference ``rssm``). ``latent="gaussian"``: the block GRU ``D`` of
    :class:`reverie.models.planet_nets.BlockGRUCell`, ``Z = stoch`` diagonal Gaussian latents with ``std =
    softplus(raw) + min_std``, one hidden layer of width ``units`` with activation ``act`` before the GRU, before the
    prior and before the posterior, glorot-uniform weights and zero biases, zero initial state (PlaNet
    ``models/rssm.py``: ``state_size 30``, ``belief_size 200``, ``embed_size 200``, ``min_stddev 0.1``; the
    activation is the config's ``relu``, ``scripts/configs.py:109,136``, not the class default ``elu``).

    Args:
        action_dim: ``A``.
        embed_dim: ``E``, size of the encoder output.
        deter: ``D`` (reference ``deter``; size presets). stoch: ``S`` groups (categorical) or ``Z`` (gaussian).
        classes: ``K`` classes (categorical only).
        units: hidden width of the input/output layers (``hidden``).
        unimix: uniform mix of the latent distributions (categorical; reference ``unimix: 0.01``).
        latent: ``"categorical"`` or ``"gaussian"``.
        min_std: lower bound of the Gaussian std (gaussian only; PlaNet ``min_stddev: 0.1``).
        act: activation of the Gaussian RSSM's hidden layers (gaussian only; PlaNet ``activation: relu``; ``elu``
            is what reverie used before and the reference class's own default).
        onehot_gather: categorical only: the one-hot latent enters linear layers by row gathers (the cell's
            input layer here, and :meth:`features` hands the heads a :class:`SplitFeat`), same values as the
            dense product up to float rounding (:mod:`reverie.models.onehot_linear`); False: dense features.
        action_clip: categorical only: every action entering the dynamics (replayed and imagined) is scaled
            elementwise by ``sg(clip / max(clip, |a|))`` (:func:`scale_action`; 2023 reference ``rssm.action_clip:
            1.0``, ``nets.py`` ``RSSM.obs_step``/``img_step``); 0 turns it off. PlaNet (gaussian) has none.

    State entries (:attr:`state_keys`): categorical ``deter (..., D)``, ``stoch (..., S, K)``,
    ``logits (..., S, K)``; gaussian ``deter (..., D)``, ``stoch (..., Z)``, ``mean (..., Z)``, ``std (..., Z)``.

    Raises:
        ValueError: for an unknown ``latent`` or ``act``, or a ``min_std`` <= 0.
    """

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 512, stoch: int = 32, classes: int = 32,
                 units: int = 512, unimix: float = 0.01, latent: str = "categorical", min_std: float = 0.1,
                 onehot_gather: bool = True, action_clip: float = 1.0, act: str = "relu"):
        super().__init__()
        if latent not in ("categorical", "gaussian"):
            raise ValueError(f"RSSM latent={latent!r} is not supported; use latent='categorical' (DreamerV3) "
                             f"or latent='gaussian' (PlaNet)")
        self.latent = latent
        self.deter, self.stoch, self.classes, self.unimix = deter, stoch, classes, unimix
        self.action_dim = action_dim
        self.action_clip = float(action_clip) if latent == "categorical" else 0.0
        self.onehot_gather = bool(onehot_gather) and latent == "categorical"
        self.defer_weight_grads = latent == "categorical"  # observe scan: see _scan_linears (off to compile)
        self.fused_observe = latent == "categorical"  # observe scan as one autograd node: see _fused_scan
        if latent == "gaussian":
            self._build_gaussian(embed_dim, units, min_std, act)
            return
        self.feat_dim = deter + stoch * classes
        # img_in: Linear(cat(z, a)) split in two bias-free parts so the action part is precomputed per sequence.
        self.in_z = FeatLinear(stoch * classes, units, bias=False)  # one-hot input: row gathers (onehot_gather)
        self.in_a = nn.Linear(action_dim, units, bias=False)
        self.in_norm = nn.Sequential(nn.LayerNorm(units, eps=1e-3), nn.SiLU())
        trunc_normal_init_(self.in_z.weight)
        trunc_normal_init_(self.in_a.weight)
        self.gru = GRUCell(units, deter)
        self.prior_net = MLP(deter, stoch * classes, units=units, layers=1)
        # posterior: Linear(cat(h, embed)) split so the embedding part is precomputed per sequence.
        self.post_h = nn.Linear(deter, units, bias=False)
        self.post_e = nn.Linear(embed_dim, units, bias=False)
        self.post_norm = nn.Sequential(nn.LayerNorm(units, eps=1e-3), nn.SiLU())
        self.post_out = nn.Linear(units, stoch * classes)
        for layer in (self.post_h, self.post_e, self.post_out):
            trunc_normal_init_(layer.weight)
        nn.init.zeros_(self.post_out.bias)
        self.initial_deter = nn.Parameter(torch.zeros(deter))  # learned initial state (reference initial: learned)

    def _build_gaussian(self, embed_dim: int, units: int, min_std: float, act: str) -> None:
        if min_std <= 0:
            raise ValueError(f"RSSM(latent='gaussian') needs min_std > 0 (PlaNet min_stddev 0.1), got {min_std}")
        if act not in ACTIVATIONS:
            raise ValueError(f"RSSM(latent='gaussian'): act must be one of {tuple(ACTIVATIONS)}, got {act!r}")
        self.min_std = float(min_std)
        self.feat_dim = self.deter + self.stoch
        self.act = ACTIVATIONS[act]()
        Z, A, D = self.stoch, self.action_dim, self.deter
        # Linear(cat(z, a)) split so the action part is precomputed per sequence (one bias, on the z part).
        self.in_z = nn.Linear(Z, units)
        self.in_a = nn.Linear(A, units, bias=False)
        self.gru = BlockGRUCell(units, D)
        self.prior_net = nn.Sequential(nn.Linear(D, units), self.act, nn.Linear(units, 2 * Z))
        # Linear(cat(h, embed)) split so the embedding part is precomputed per sequence.
        self.post_h = nn.Linear(D, units, bias=False)
        self.post_e = nn.Linear(embed_dim, units)
        self.post_out = nn.Linear(units, 2 * Z)
        # TensorFlow's default init of each reference layer: split layers take the whole layer's fans, and the
        # (mean, std) output layers are two Dense(Z) layers in the reference (rssm.py:106-107, 127-128)
        fans = {self.in_z: (Z + A, units), self.in_a: (Z + A, units), self.prior_net[0]: (D, units),
                self.prior_net[2]: (units, Z), self.post_h: (D + embed_dim, units),
                self.post_e: (D + embed_dim, units), self.post_out: (units, Z)}
        for layer, (fan_in, fan_out) in fans.items():
            glorot_uniform_(layer.weight, fan_in, fan_out)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    @property
    def state_keys(self) -> tuple[str, ...]:
        """Entries of a state dict: ``(deter, stoch, logits)`` or ``(deter, stoch, mean, std)``."""
        return ("deter", "stoch", "logits") if self.latent == "categorical" else ("deter", "stoch", "mean", "std")

    # ----------------------------------------------------------------------------------------------- states
    def initial(self, batch: int) -> State:
        """Initial state ``(B, ...)``. Categorical: learned, ``deter = tanh(w)`` ``(B, D)``, ``stoch`` = prior mode
        ``(B, S, K)``. Gaussian: zeros (PlaNet ``zero_state``), ``std`` ones."""
        if self.latent == "gaussian":
            zeros = self.in_a.weight.new_zeros(batch, self.stoch)
            return {"deter": self.in_a.weight.new_zeros(batch, self.deter), "stoch": zeros, "mean": zeros,
                    "std": torch.ones_like(zeros)}
        deter = torch.tanh(self.initial_deter).expand(batch, self.deter)
        logits = self._prior_logits(deter)
        stoch = self._draw(logits, sample=False)
        return {"deter": deter, "stoch": stoch, "logits": logits}

    def feat(self, state: State) -> torch.Tensor:
        """Model features ``cat(deter, flat stoch)``: ``(..., D + S*K)`` or ``(..., D + Z)``."""
        if self.latent == "gaussian":
            return torch.cat([state["deter"], state["stoch"]], -1)
        stoch = state["stoch"].flatten(-2)  # (..., S, K) -> (..., S*K)
        return torch.cat([state["deter"], stoch], -1)

    def features(self, state: State) -> torch.Tensor | SplitFeat:
        """The features the heads read: :meth:`feat` ``(..., F)``, or with ``onehot_gather`` the same features as
        a :class:`SplitFeat` (``deter (..., D)``, ``stoch (..., S, K)``, ``index (..., S)``: ``state["index"]``
        where the state carries it, else the argmax of the exact one-hot ``stoch``; a state with ``index`` may
        leave out ``stoch`` when no gradient has to reach it)."""
        if not self.onehot_gather:
            return self.feat(state)
        index = state.get("index")
        if index is None:
            return SplitFeat.from_state(state["deter"], state["stoch"])
        return SplitFeat(state["deter"], state.get("stoch"), index, self.classes)  # stoch: only where needed

    def dist(self, logits: torch.Tensor | State) -> torch.distributions.Independent:
        """Latent distribution of a state (or, categorical only, of ``logits`` ``(..., S, K)``).

        Categorical: event shape ``(S, K)``. Gaussian: ``Normal(mean, std)`` with event shape ``(Z,)``.

        Raises:
            TypeError: a tensor for a Gaussian RSSM (pass the state dict with ``mean`` and ``std``).
        """
        if self.latent == "gaussian":
            if not isinstance(logits, dict):
                raise TypeError("RSSM(latent='gaussian').dist needs a state dict with 'mean' and 'std', not a tensor")
            return torch.distributions.Independent(
                torch.distributions.Normal(logits["mean"].float(), logits["std"].float(), validate_args=False), 1)
        if isinstance(logits, dict):
            logits = logits["logits"]
        return torch.distributions.Independent(UnimixCategorical(logits, self.unimix), 1)

    def _gaussian(self, raw: torch.Tensor, sample: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``raw (..., 2Z)`` -> ``(stoch, mean, std)``, ``std = softplus(raw_std) + min_std`` (PlaNet)."""
        mean, std = raw.chunk(2, -1)
        std = F.softplus(std) + self.min_std
        stoch = mean + std * torch.randn_like(std) if sample else mean
        return stoch, mean, std

    def _prior_gaussian(self, deter: torch.Tensor, sample: bool) -> State:
        stoch, mean, std = self._gaussian(self.prior_net(deter), sample)
        return {"deter": deter, "stoch": stoch, "mean": mean, "std": std}

    def _prior_logits(self, deter: torch.Tensor) -> torch.Tensor:
        return self.prior_net(deter).unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _draw(self, logits: torch.Tensor, sample: bool) -> torch.Tensor:
        if sample:
            return unimix_sample(logits, self.unimix)  # straight-through one-hot (..., S, K)
        return one_hot_index(logits.argmax(-1), self.classes)  # the mode (unimix keeps the argmax)

    def _step_deter(self, state: State, action_proj: torch.Tensor, scan: ScanLinears | None = None) -> torch.Tensor:
        """``h_t`` from the state at ``t-1`` and the projected action; ``scan`` (observe) applies ``in_z`` and the
        GRU's linear layer with deferred weight gradients."""
        if self.latent == "gaussian":
            x = self.act(self.in_z(state["stoch"]) + action_proj)
            return self.gru(x, state["deter"])
        stoch, index = state.get("stoch"), state.get("index")  # a state from _img_step_index has no one-hot
        if self.onehot_gather and (stoch is None or stoch.shape[:-2].numel() >= _GATHER_MIN_ROWS):
            z = SplitFeat(None, stoch, one_hot_argmax(stoch) if index is None else index, self.classes)  # S rows
            x = self.in_z(z)
        else:
            z = stoch.flatten(-2)  # (..., S, K) -> (..., S*K)
            x = self.in_z(z) if scan is None else scan("in_z", z)
        x = self.in_norm(x + action_proj)
        return self.gru(x, state["deter"], None if scan is None else partial(scan, "gru"))

    # ----------------------------------------------------------------------------------------------- observe
    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Posterior and prior states along observed sequences (the "observe" scan).

        Args:
            embed: ``(T, B, E)`` encoder outputs.
            prev_action: ``(T, B, A)`` action that led to each observation (zeroed where is_first).
            is_first: ``(T, B)`` bool.
            state: state before the first step, ``(B, ...)`` dict, or None for the initial state
                (``is_first`` at ``t = 0`` resets it anyway).
            sample: draw latents (training) or take the mode (tests, deterministic summaries).

        Returns:
            ``(posterior, prior)``: dicts with ``deter (T, B, D)``, ``stoch (T, B, S, K)``, ``logits (T, B, S, K)``
            (gaussian: ``stoch``, ``mean``, ``std`` ``(T, B, Z)``). ``prior['stoch']`` is drawn from the prior
            (used by open-loop summaries).

        Categorical, sampled, with autograd on CPU: the scan runs as one autograd node
        (:mod:`reverie.models.observe_scan`, the same values and draws); otherwise step by step below.
        """
        if self.latent == "gaussian":
            return self._observe_gaussian(embed, prev_action, is_first, state, sample)
        T, B = is_first.shape
        init = self.initial(B)  # what is_first resets to
        given = state is not None
        if not given:
            state = init
        action = self.in_a(scale_action(prev_action, self.action_clip))  # (T, B, units), compute dtype under autocast
        first = is_first.to(action.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        action_proj = action * (1.0 - first)  # zero action where is_first
        embed_proj = self.post_e(embed)  # (T, B, units)
        resets = _reset_steps(is_first)  # steps without any is_first skip the reset arithmetic
        if self._fused_scan(action_proj, embed_proj, sample):  # one autograd node for the whole scan (CPU)
            deter_seq, logits, stoch = observe_scan(self, action_proj, embed_proj, first, resets, state["deter"],
                                                    state["stoch"], init, action_proj.dtype)
            post = {"deter": deter_seq, "stoch": stoch, "logits": logits.unflatten(-1, (self.stoch, self.classes))}
            prior_logits = self._prior_logits(deter_seq)  # all steps at once: (T, B, D) -> (T, B, S, K)
            return post, {"deter": deter_seq, "stoch": self._draw(prior_logits, sample), "logits": prior_logits}
        deters, stochs, logits_all = [], [], []
        deter, stoch = state["deter"], state["stoch"]
        # one unbind per sequence tensor, not a select per step: the backward of T selects would build T
        # zero-filled (T, B, units) gradients and add them up; unbind's stacks the T step gradients once
        action_steps, embed_steps = action_proj.unbind(0), embed_proj.unbind(0)  # T x (B, units)
        if given and not any(resets):  # the learned initial state keeps its (zero) gradient, as with the arithmetic
            deter = deter + 0.0 * init["deter"]
        scan = self._scan_linears()
        for t in range(T):
            if resets[t]:
                keep = 1.0 - first[t]  # (B, 1)
                deter = deter * keep + init["deter"] * first[t]
                stoch = stoch * keep.unsqueeze(-1) + init["stoch"] * first[t].unsqueeze(-1)
            deter = self._step_deter({"deter": deter, "stoch": stoch}, action_steps[t], scan)
            if scan is None:
                logits = self.post_out(self.post_norm(self.post_h(deter) + embed_steps[t]))
            else:
                logits = scan("post_out", self.post_norm(scan("post_h", deter) + embed_steps[t]))
            logits = logits.unflatten(-1, (self.stoch, self.classes))  # (B, S*K) -> (B, S, K)
            stoch = self._draw(logits, sample)
            deters.append(deter)
            stochs.append(stoch)
            logits_all.append(logits)
        deter_seq = torch.stack(deters)  # T x (B, D) -> (T, B, D)
        post = {"deter": deter_seq, "stoch": torch.stack(stochs), "logits": torch.stack(logits_all)}
        prior_logits = self._prior_logits(deter_seq)  # all steps at once: (T, B, D) -> (T, B, S, K)
        prior = {"deter": deter_seq, "stoch": self._draw(prior_logits, sample), "logits": prior_logits}
        return post, prior

    def _compute_dtype(self) -> torch.dtype:
        device = self.in_a.weight.device.type
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.in_a.weight.dtype

    def _fused_scan(self, action_proj: torch.Tensor, embed_proj: torch.Tensor, sample: bool) -> bool:
        """Whether :meth:`observe` runs :func:`reverie.models.observe_scan.observe_scan`: sampled, recording
        gradients, on CPU (measured there: docs/speed.md), not traced (``compile`` sets ``defer_weight_grads``
        off and keeps the per-op loop), and both projections in the compute dtype (they come out of linear
        layers, so under autocast they are in its dtype whatever the encoder's)."""
        return (sample and self.fused_observe and self.defer_weight_grads and torch.is_grad_enabled()
                and action_proj.device.type == "cpu" and action_proj.dtype == embed_proj.dtype == self._compute_dtype())

    def _scan_linears(self) -> ScanLinears | None:
        """The observe scan's per-step linear layers with deferred weight gradients (:mod:`.scan_linear`: one
        product per weight instead of one per step), or None with ``defer_weight_grads`` off (``compile``)."""
        if not self.defer_weight_grads:
            return None
        return ScanLinears({"in_z": self.in_z, "gru": self.gru.linear, "post_h": self.post_h,
                            "post_out": self.post_out}, self._compute_dtype())

    def _observe_gaussian(self, embed, prev_action, is_first, state, sample):
        T, B = is_first.shape
        init = self.initial(B)  # zeros: what is_first resets to
        if state is None:
            state = init
        first = is_first.to(embed.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        action_proj = self.in_a(prev_action) * (1.0 - first)  # (T, B, units); zero action where is_first
        embed_proj = self.post_e(embed)  # (T, B, units)
        deter, stoch = state["deter"], state["stoch"]
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.state_keys}
        for t in range(T):
            keep = 1.0 - first[t]  # (B, 1); the initial state is zeros, so a reset is a multiplication
            deter = self._step_deter({"deter": deter * keep, "stoch": stoch * keep}, action_proj[t])
            raw = self.post_out(self.act(self.post_h(deter) + embed_proj[t]))  # (B, 2Z)
            stoch, mean, std = self._gaussian(raw, sample)
            for k, v in zip(self.state_keys, (deter, stoch, mean, std)):
                out[k].append(v)
        post = {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)
        prior = self._prior_gaussian(post["deter"], sample)  # all steps at once: (T, B, D) -> (T, B, Z)
        return post, prior

    # ----------------------------------------------------------------------------------------------- imagine
    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step: ``(B, ...)`` state and action ``(B, A)`` -> next prior state ``(B, ...)``. The action is
        scaled into ``[-clip, clip]`` first (:func:`scale_action`), with the gradient of ``a * sg(scale)``."""
        deter = self._step_deter(state, self.in_a(scale_action(action, self.action_clip)))
        if self.latent == "gaussian":
            return self._prior_gaussian(deter, sample)
        logits = self._prior_logits(deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits}

    def _img_step_index(self, state: State, action: torch.Tensor) -> State:
        """:meth:`img_step` (sampled, no autograd) returning ``deter``, ``index (B, S)`` and ``logits``, without the
        one-hot ``stoch``: the same values and random draws as ``img_step`` (whose ``stoch`` is the one-hot of
        this ``index``), for rollouts whose readers take the class index (``onehot_gather``)."""
        deter = self._step_deter(state, self.in_a(scale_action(action, self.action_clip)))
        logits = self._prior_logits(deter)
        return {"deter": deter, "index": unimix_sample_index(logits, self.unimix), "logits": logits}

    def imagine(self, policy: Callable[[State], torch.Tensor], start: State, horizon: int,
                keys: tuple[str, ...] | None = None) -> tuple[State, torch.Tensor]:
        """Roll the prior forward from ``start`` with actions from ``policy`` (DreamerV3 section 4).

        Args:
            policy: maps a state ``(N, ...)`` to an action ``(N, A)``. With ``onehot_gather`` the states it sees
                also hold ``index (N, S)``, the class of each latent group (for :meth:`features`); without
                autograd and with ``stoch`` not in ``keys``, the imagined states hold ``index`` instead of the
                one-hot ``stoch`` (the same draws: ``stoch`` would be its one-hot).
            start: start states ``(N, ...)`` (e.g. every posterior state of a batch, ``N = T*B``).
            horizon: ``H`` imagined steps.
            keys: which state entries to stack and return (skip ``logits`` when only features are needed;
                ``index`` with ``onehot_gather``); None: all of :attr:`state_keys`.

        Returns:
            ``(states, actions)``: states ``(H+1, N, ...)`` with ``start`` at index 0; ``actions (H+1, N, A)``
            where ``actions[t]`` was chosen at ``states[t]`` (the last one is never executed). Without autograd
            each step is written into preallocated ``(H+1, N, ...)`` buffers; with it, stacked once at the end.

        Raises:
            KeyError: ``keys`` names an entry the states do not have.
        """
        keys = self.state_keys if keys is None else keys
        steps = {k: _Steps(horizon + 1) for k in keys}
        action_steps = _Steps(horizon + 1)
        state = self._with_index(start)
        # Without autograd and with readers of the class index only, the rollout never builds the one-hot latent.
        by_index = self.onehot_gather and not torch.is_grad_enabled() and "stoch" not in keys
        for t in range(horizon + 1):
            if t > 0:
                state = (self._img_step_index(state, action) if by_index
                         else self._with_index(self.img_step(state, action)))
            action = policy(state)
            for k, buf in steps.items():
                buf.put(t, state[k])
            action_steps.put(t, action)
        return {k: buf.result() for k, buf in steps.items()}, action_steps.result()

    def _with_index(self, state: State) -> State:
        """``state`` plus ``index (..., S)`` (argmax of the exact one-hot ``stoch``) when ``onehot_gather``."""
        if not self.onehot_gather or "index" in state:
            return state
        return {**state, "index": one_hot_argmax(state["stoch"])}


def scale_action(action: torch.Tensor, clip: float) -> torch.Tensor:
    """``action * sg(clip / max(clip, |action|))`` elementwise: the value of ``clamp(action, -clip, clip)`` with the
    gradient of a pass-through scaled by ``sg(clip / |action|)`` where ``|action| > clip`` (a clamp would give 0
    there). 2023 DreamerV3 reference ``nets.py`` ``RSSM.img_step``/``obs_step`` (``action_clip: 1.0``): continuous
    actions sampled from the actor's unbounded normal enter the dynamics inside ``[-1, 1]``. One-hot actions are
    unchanged. ``clip <= 0``: ``action`` itself. Shapes ``(..., A)`` in and out."""
    if clip <= 0:
        return action
    return action * (clip / torch.clamp(action.detach().abs(), min=clip))


def _reset_steps(is_first: torch.Tensor) -> list[bool]:
    """Which steps of ``is_first (T, B)`` reset any row. The others skip ``x * keep + init * first`` (``x * 1 +
    init * 0`` is ``x`` exactly). Reading the flags is free on CPU; on an accelerator it would be a host sync in
    the update, so there every step resets."""
    if is_first.device.type != "cpu":
        return [True] * is_first.shape[0]
    return is_first.any(1).tolist()


class _Steps:
    """Per-step tensors ``(N, ...)`` gathered into one ``(steps, N, ...)`` tensor: written into a preallocated
    buffer when autograd is off at the first :meth:`put` (no list, no ``torch.stack`` copy), else kept in a list
    and stacked once (autograd cannot record in-place writes into a shared buffer)."""

    def __init__(self, steps: int):
        self.steps, self.buffer, self.items = steps, None, []

    def put(self, t: int, x: torch.Tensor) -> None:
        if self.buffer is None and not self.items and not torch.is_grad_enabled():
            self.buffer = x.new_empty((self.steps, *x.shape))
        if self.buffer is not None:
            self.buffer[t].copy_(x)
        else:
            self.items.append(x)

    def result(self) -> torch.Tensor:
        if self.buffer is not None:
            return self.buffer
        return torch.stack(self.items)  # steps x (N, ...) -> (steps, N, ...)
