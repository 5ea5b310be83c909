"""Recurrent state-space model (Hafner et al. 2019 PlaNet section 3; DreamerV3 section 3).

State ``s_t = (h_t, z_t)``: ``deter`` ``h_t`` ``(..., D)`` from a GRU, ``stoch`` ``z_t`` ``(..., S, K)``
one-hot categorical latents (DreamerV3). Timing (see :mod:`reverie.types`)::

    h_t = f(h_{t-1}, z_{t-1}, prev_action_t)      prev_action_t = action_{t-1}, zero where is_first_t
    prior     p(z_t | h_t)                       ("imagine": no observation)
    posterior q(z_t | h_t, embed_t)              ("observe")

Where ``is_first_t`` is set the previous state is replaced by the learned initial state and the previous
action by zero, so a row's states from an ``is_first`` step on do not depend on what came before.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from reverie.models.distributions import UnimixCategorical, one_hot_index, unimix_sample
from reverie.models.networks import MLP, trunc_normal_init_

State = dict[str, torch.Tensor]


class GRUCell(nn.Module):
    """LayerNorm GRU of the DreamerV3 reference (``rssm.py``: ``update = sigmoid(u - 1)``).

    ``forward(x (B, I), h (B, D)) -> (B, D)``.
    """

    def __init__(self, in_dim: int, deter: int, eps: float = 1e-3):
        super().__init__()
        self.linear = nn.Linear(in_dim + deter, 3 * deter, bias=False)
        self.norm = nn.LayerNorm(3 * deter, eps=eps)
        trunc_normal_init_(self.linear.weight)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        parts = self.norm(self.linear(torch.cat([x, h], -1)))
        reset, cand, update = parts.chunk(3, -1)
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        return update * cand + (1.0 - update) * h


class RSSM(nn.Module):
    """Categorical RSSM (DreamerV3): deter GRU ``D``, ``S x K`` one-hot latents with unimix.

    Args:
        action_dim: ``A``.
        embed_dim: ``E``, size of the encoder output.
        deter: ``D`` (reference ``deter``; size presets). stoch: ``S`` groups. classes: ``K`` classes.
        units: hidden width of the input/output layers (``hidden``).
        unimix: uniform mix of the latent distributions (reference ``unimix: 0.01``).
        latent: only ``"categorical"`` here.

    Raises:
        ValueError: for an unknown ``latent``.
    """

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 512, stoch: int = 32, classes: int = 32,
                 units: int = 512, unimix: float = 0.01, latent: str = "categorical"):
        super().__init__()
        if latent != "categorical":
            raise ValueError(f"RSSM latent={latent!r} is not supported; use latent='categorical'")
        self.deter, self.stoch, self.classes, self.unimix = deter, stoch, classes, unimix
        self.action_dim = action_dim
        self.feat_dim = deter + stoch * classes
        # img_in: Linear(cat(z, a)) split in two bias-free parts so the action part is precomputed per sequence.
        self.in_z = nn.Linear(stoch * classes, units, bias=False)
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

    # ----------------------------------------------------------------------------------------------- states
    def initial(self, batch: int) -> State:
        """Learned initial state: ``deter = tanh(w)`` ``(B, D)``, ``stoch`` = prior mode ``(B, S, K)``."""
        deter = torch.tanh(self.initial_deter).expand(batch, self.deter)
        logits = self._prior_logits(deter)
        stoch = self._draw(logits, sample=False)
        return {"deter": deter, "stoch": stoch, "logits": logits}

    def feat(self, state: State) -> torch.Tensor:
        """Model features ``cat(deter, flat stoch)``: ``(..., D + S*K)``."""
        stoch = state["stoch"].flatten(-2)  # (..., S, K) -> (..., S*K)
        return torch.cat([state["deter"], stoch], -1)

    def dist(self, logits: torch.Tensor) -> torch.distributions.Independent:
        """Latent distribution for ``logits`` ``(..., S, K)``; event shape ``(S, K)``."""
        return torch.distributions.Independent(UnimixCategorical(logits, self.unimix), 1)

    def _prior_logits(self, deter: torch.Tensor) -> torch.Tensor:
        return self.prior_net(deter).unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _draw(self, logits: torch.Tensor, sample: bool) -> torch.Tensor:
        if sample:
            return unimix_sample(logits, self.unimix)  # straight-through one-hot (..., S, K)
        return one_hot_index(logits.argmax(-1), self.classes)  # the mode (unimix keeps the argmax)

    def _step_deter(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        x = self.in_norm(self.in_z(state["stoch"].flatten(-2)) + action_proj)
        return self.gru(x, state["deter"])

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
            ``(posterior, prior)``: dicts with ``deter (T, B, D)``, ``stoch (T, B, S, K)``, ``logits (T, B, S, K)``.
            ``prior['stoch']`` is drawn from the prior logits (used by open-loop summaries).
        """
        T, B = is_first.shape
        init = self.initial(B)  # what is_first resets to
        if state is None:
            state = init
        first = is_first.to(embed.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        action_proj = self.in_a(prev_action) * (1.0 - first)  # (T, B, units); zero action where is_first
        embed_proj = self.post_e(embed)  # (T, B, units)
        deters, stochs, logits_all = [], [], []
        deter, stoch = state["deter"], state["stoch"]
        for t in range(T):
            keep = 1.0 - first[t]  # (B, 1)
            deter = deter * keep + init["deter"] * first[t]
            stoch = stoch * keep.unsqueeze(-1) + init["stoch"] * first[t].unsqueeze(-1)
            deter = self._step_deter({"deter": deter, "stoch": stoch}, action_proj[t])
            logits = self.post_out(self.post_norm(self.post_h(deter) + embed_proj[t]))
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

    # ----------------------------------------------------------------------------------------------- imagine
    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step: ``(B, ...)`` state and action ``(B, A)`` -> next prior state ``(B, ...)``."""
        deter = self._step_deter(state, self.in_a(action))
        logits = self._prior_logits(deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits}

    def imagine(self, policy: Callable[[State], torch.Tensor], start: State, horizon: int,
                keys: tuple[str, ...] = ("deter", "stoch", "logits")) -> tuple[State, torch.Tensor]:
        """Roll the prior forward from ``start`` with actions from ``policy`` (DreamerV3 section 4).

        Args:
            policy: maps a state ``(N, ...)`` to an action ``(N, A)``.
            start: start states ``(N, ...)`` (e.g. every posterior state of a batch, ``N = T*B``).
            horizon: ``H`` imagined steps.
            keys: which state entries to stack and return (skip ``logits`` when only features are needed).

        Returns:
            ``(states, actions)``: states ``(H+1, N, ...)`` with ``start`` at index 0; ``actions (H+1, N, A)``
            where ``actions[t]`` was chosen at ``states[t]`` (the last one is never executed).
        """
        states = [start]
        actions = [policy(start)]
        for _ in range(horizon):
            states.append(self.img_step(states[-1], actions[-1]))
            actions.append(policy(states[-1]))
        stacked = {k: torch.stack([s[k] for s in states]) for k in keys}
        return stacked, torch.stack(actions)
