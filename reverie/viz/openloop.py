"""Open-loop and closed-loop predictions of a world model along replayed sequences (DreamerV3 "report").

Given a sequence ``(T, B, ...)`` and ``C`` context steps::

    t < C:   posterior states  s_t ~ q(s_t | h_t, obs_t)            (the model sees the frames)
    t >= C:  prior states      s_t ~ p(s_t | h_t),  h_t = f(s_{t-1}, prev_action_t)   (open loop: no frames,
             only the replayed actions; where is_first_t is set the state resets to the initial one, as in observe)

and decodes every state into observations, reward and continue probability. The same pass gives the
closed-loop paths: the posterior reconstruction of every step (0-step) and the one-step prior prediction
(the prior at t from the posterior at t-1), so the three can be compared frame by frame.

A world model without decoders (its representation objective is ``r2`` or ``infonce``; ``wm.decodes`` False,
docs/representation.md) gets everything but the decoded observations: reward, continue and the latent agreement,
the cosine between the open-loop (and one-step prior) features and the posterior features of the same step, which
every model gets.

Only the world model's public API is used (``encode``, ``dynamics.observe``, ``dynamics.truncate``,
``dynamics.img_step``, ``dynamics.initial``, ``dynamics.features`` and ``feature_keys``, ``reward``, optional
``decode`` (with ``decodes``) and ``cont``), so any agent exposing ``agent.wm`` with that API works (DreamerV3's
categorical RSSM, PlaNet's Gaussian one). The reset at ``is_first`` inside the open-loop part replaces each state
entry by the initial state's, so it takes a dynamics whose state entries are shaped as ``dynamics.initial``'s (a
recurrent one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: Replay keys the open-loop pass reads besides the observation keys.
SEQUENCE_KEYS = ("prev_action", "is_first", "reward", "is_terminal")


@dataclass
class OpenLoop:
    """Decoded predictions along ``T`` steps of ``B`` sequences; numpy arrays, time-first.

    Attributes:
        context: ``C``, the number of steps seen through the posterior (``0 < C < T``).
        truth: observation key -> ``(T, B, *shape)`` (images uint8 ``(T, B, C_k, H, W)``, vectors float32).
        openloop: the same keys: decoded posterior for ``t < C``, decoded open-loop prior for ``t >= C``; empty
            without decoders (as ``recon`` and ``onestep``).
        recon: the same keys: decoded posterior at every step (closed loop, 0-step).
        onestep: the same keys: decoded one-step prior prediction at every step (prior at ``t`` from the
            posterior at ``t - 1``; at ``is_first`` steps, from the initial state).
        reward: ``{"true", "openloop", "recon"}`` -> ``(T, B)`` float32 (reward head mean).
        cont: ``{"true" (1 - is_terminal), "openloop", "recon"}`` -> ``(T, B)`` continue probability; empty
            when the world model has no continue head.
        is_first: ``(T, B)`` bool.
        latent: ``{"openloop", "onestep"}`` -> ``(T, B)`` float32: the cosine between those states' features and
            the posterior features of the same step (1 for ``t < C`` in ``openloop``).
        decoded: whether the world model has decoders (``openloop``/``recon``/``onestep`` are filled).
        quality: :func:`reverie.viz.quality.prediction_quality` of this pass, once a report computed it.
    """

    context: int
    truth: dict[str, np.ndarray]
    openloop: dict[str, np.ndarray]
    recon: dict[str, np.ndarray]
    onestep: dict[str, np.ndarray]
    reward: dict[str, np.ndarray]
    cont: dict[str, np.ndarray] = field(default_factory=dict)
    is_first: np.ndarray | None = None
    latent: dict[str, np.ndarray] = field(default_factory=dict)
    decoded: bool = True
    quality: dict[str, float] = field(default_factory=dict)

    @property
    def image_keys(self) -> list[str]:
        """Decoded observation keys holding images (uint8 ``(T, B, C, H, W)``); none without decoders."""
        return [k for k, v in self.truth.items() if v.ndim == 5 and v.dtype == np.uint8 and k in self.openloop]

    @property
    def vector_keys(self) -> list[str]:
        """Decoded observation keys holding vectors (``(T, B, F)``); none without decoders."""
        return [k for k, v in self.truth.items() if v.ndim == 3 and k in self.openloop]


def find_world_model(agent: Any) -> Any:
    """``agent.wm``, or ``agent`` itself when it is a world model (has ``encode``, ``dynamics`` and ``reward``).

    Raises:
        TypeError: neither: the viz code needs a world model with ``encode``/``dynamics``/``reward`` (and
            ``decode`` to show observations: :func:`has_decoder`).
    """
    wm = getattr(agent, "wm", agent)
    missing = [name for name in ("encode", "dynamics", "reward") if not hasattr(wm, name)]
    if missing:
        raise TypeError(f"{type(agent).__name__} exposes no world model: expected `agent.wm` with encode, dynamics "
                        f"and reward (missing: {', '.join(missing)}). Pass an agent built by reverie "
                        f"(DreamerV3, PlaNet) or its world model.")
    return wm


def has_decoder(wm: Any) -> bool:
    """Whether the world model decodes observations: its ``decodes`` (reverie's world models: the representation
    objective is ``reconstruction``), else whether it has a ``decode`` method. Each consumer asks once, when it
    is built, and shows decoded observations or latent, reward and continue predictions accordingly."""
    return bool(getattr(wm, "decodes", hasattr(wm, "decode")))


def objective_name(wm: Any) -> str:
    """The world model's representation objective (``"reconstruction"`` where it does not say), for messages."""
    return str(getattr(getattr(wm, "representation", None), "name", "reconstruction"))


def dense(feat: Any) -> torch.Tensor:
    """Features as a dense tensor ``(..., F)`` (the kernels' split features are rebuilt; a tensor is itself)."""
    return feat.dense() if hasattr(feat, "dense") else feat


def cosine(a: Any, b: Any) -> torch.Tensor:
    """The cosine between features ``a`` and ``b`` ``(..., F)`` along ``F`` -> ``(...)`` float32 (0 where one is 0)."""
    a, b = dense(a).float(), dense(b).float()
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-12)


def to_tensors(wm: Any, batch: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """``keys`` of a numpy/tensor batch as tensors on the world model's device (:meth:`WorldModel.tensors`)."""
    return wm.tensors({k: batch[k] for k in keys})


def decode_mode(wm: Any, feat: torch.Tensor) -> dict[str, np.ndarray]:
    """Mode of every decoder head: images uint8 ``(..., C, H, W)``, vectors float32 ``(..., F)``."""
    out = {}
    for k, dist in wm.decode(feat).items():
        value = dist.mode
        out[k] = value.cpu().numpy() if value.dtype == torch.uint8 else value.float().cpu().numpy()
    return out


def _stack(states: list[dict[str, torch.Tensor]], keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([s[k] for s in states]) for k in keys}  # T x (B, ...) -> (T, B, ...)


@torch.inference_mode()
def open_loop(agent_or_wm: Any, batch: Mapping[str, Any], context: int = 5, sample: bool = True,
              seed: int | None = 0) -> OpenLoop:
    """Observe ``context`` steps, then predict the rest of each sequence open loop with the replayed actions.

    Args:
        agent_or_wm: an agent with ``.wm`` or a world model (see :func:`find_world_model`).
        batch: replay sample ``(T, B, ...)``: the world model's observation keys, ``prev_action (T, B, A)``,
            ``is_first``, ``reward``, ``is_terminal`` ``(T, B)`` (as :meth:`reverie.Replay.sample` returns).
        context: ``C`` posterior steps (default 5, the DreamerV3 report's); must satisfy ``1 <= C < T``.
        sample: draw latents (what the model does in imagination) or take their mode (deterministic).
        seed: seeds the latent draws inside a forked RNG, so a report neither depends on nor advances the
            training RNG; None uses (and advances) the global RNG.

    Returns:
        :class:`OpenLoop` with numpy arrays.

    Raises:
        KeyError: a key missing from ``batch``. ValueError: ``context`` out of range or ragged shapes.
    """
    wm = find_world_model(agent_or_wm)
    obs_keys = tuple(wm.obs_shapes)
    missing = [k for k in (*obs_keys, *SEQUENCE_KEYS) if k not in batch]
    if missing:
        raise KeyError(f"open_loop: the batch lacks {missing}; pass a replay sample (Replay.sample(B, T)) that "
                       f"holds the world model's observation keys {list(obs_keys)} and {list(SEQUENCE_KEYS)}")
    data = to_tensors(wm, batch, (*obs_keys, *SEQUENCE_KEYS))
    T, B = data["is_first"].shape
    if not 1 <= context < T:
        raise ValueError(f"open_loop: context must be in [1, T - 1] = [1, {T - 1}], got {context}; "
                         f"use longer sequences or fewer context steps")
    device = data["is_first"].device
    fork = (torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else [])
            if seed is not None else contextlib.nullcontext())
    with fork:
        if seed is not None:
            torch.manual_seed(seed)
        dynamics = wm.dynamics
        embed = wm.encode({k: data[k] for k in obs_keys})  # (T, B, E)
        post, prior = dynamics.observe(embed, data["prev_action"], data["is_first"], None, sample=sample)
        # --- open loop from the last context posterior: prior steps with the replayed actions ---
        init = dynamics.initial(B)
        state = dynamics.truncate({k: v[:context] for k, v in post.items()})  # (B, ...): after row C - 1
        imagined = []
        for t in range(context, T):
            first = data["is_first"][t].to(embed.dtype)  # (B,)
            state = {k: _where_first(first, init[k], v) for k, v in state.items() if k in init}
            action = data["prev_action"][t] * (1.0 - first)[:, None]  # (B, A), zero where is_first
            state = dynamics.img_step(state, action, sample=sample)
            imagined.append(state)
        imagined = _stack(imagined, dynamics.feature_keys)  # (T - C, B, ...): what features reads
        # (C, B, ...) + (T - C, B, ...) -> (T, B, ...): the context posteriors, then the open loop
        open_states = {k: torch.cat([post[k][:context], imagined[k]]) for k in imagined}
        feat_post, feat_open = dynamics.features(post), dynamics.features(open_states)  # (T, B, F)
        feat_prior = dynamics.features(prior)  # (T, B, F)
        decoded = has_decoder(wm)
        result = OpenLoop(
            context=context,
            truth={k: np.asarray(data[k].cpu().numpy()) for k in obs_keys},
            openloop=decode_mode(wm, feat_open) if decoded else {},
            recon=decode_mode(wm, feat_post) if decoded else {},
            onestep=decode_mode(wm, feat_prior) if decoded else {},
            reward={"true": data["reward"].cpu().numpy(),
                    "openloop": wm.reward(feat_open).mean.float().cpu().numpy(),
                    "recon": wm.reward(feat_post).mean.float().cpu().numpy()},
            is_first=data["is_first"].cpu().numpy(),
            latent={"openloop": cosine(feat_open, feat_post).cpu().numpy(),
                    "onestep": cosine(feat_prior, feat_post).cpu().numpy()},
            decoded=decoded)
        if hasattr(wm, "cont"):
            result.cont = {"true": 1.0 - data["is_terminal"].cpu().numpy(),
                           "openloop": wm.cont(feat_open).mean.float().cpu().numpy(),
                           "recon": wm.cont(feat_post).mean.float().cpu().numpy()}
    return result


def _where_first(first: torch.Tensor, init: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``init`` where ``first`` (B,) is 1, else ``value``; both ``(B, ...)``."""
    mask = first.reshape(-1, *([1] * (value.dim() - 1)))  # (B,) -> (B, 1, ...)
    return init * mask + value * (1.0 - mask)


def prediction_errors(result: OpenLoop) -> dict[str, float]:
    """Mean errors of the open-loop part (``t >= C``), for scalar logging.

    Returns:
        ``openloop/<key>_error``: mean absolute error (images: pixels scaled to ``[0, 1]``; vectors: raw
        units; decoded keys only), ``openloop/reward_error``: mean absolute reward error, ``recon/<key>_error``:
        the same for the posterior reconstruction over all steps, ``openloop/latent_cosine``: the mean latent
        agreement of the open-loop steps (every model).
    """
    c = result.context
    out = {}
    for k, truth in result.truth.items():
        if k not in result.openloop:  # no decoders
            continue
        scale = 255.0 if truth.dtype == np.uint8 else 1.0
        diff = np.abs(result.openloop[k][c:].astype(np.float32) - truth[c:].astype(np.float32)) / scale
        out[f"openloop/{k}_error"] = float(diff.mean())
        diff = np.abs(result.recon[k].astype(np.float32) - truth.astype(np.float32)) / scale
        out[f"recon/{k}_error"] = float(diff.mean())
    out["openloop/reward_error"] = float(np.abs(result.reward["openloop"][c:] - result.reward["true"][c:]).mean())
    if result.latent:
        out["openloop/latent_cosine"] = float(result.latent["openloop"][c:].mean())
    return out
