"""Open-loop and closed-loop predictions of a world model along replayed sequences (DreamerV3 "report").

For a sequence ``(T, B, ...)`` with ``C`` context steps: posterior states ``q(s_t | h_t, obs_t)`` for ``t < C``,
then prior states driven by the replayed actions, no frames (reset to the initial state at ``is_first``); every
state is decoded, with the 0-step posterior reconstruction and the one-step prior alongside. A world model without
decoders (``wm.decodes`` False, docs/representation.md) gets reward, continue and latent agreement only. Uses only
the world-model API of docs/viz.md; the ``is_first`` reset needs state entries shaped as ``dynamics.initial``'s.
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
    """Predictions along ``T`` steps of ``B`` sequences with ``context`` = ``C`` posterior steps; numpy, time-first.

    ``truth``: key -> ``(T, B, *shape)`` (images uint8 ``(T, B, C_k, H, W)``). ``openloop`` (posterior for
    ``t < C``, then open loop), ``recon`` (posterior, 0-step), ``onestep`` (prior from the posterior at ``t - 1``):
    the same keys decoded, empty without decoders (``decoded`` False). ``reward`` and ``cont`` (empty without a
    continue head): ``{"true", "openloop", "recon"}`` -> ``(T, B)``. ``latent``: ``{"openloop", "onestep"}`` ->
    ``(T, B)`` cosine with the posterior features. ``is_first``: ``(T, B)`` bool. ``quality``: set by a report.
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
    """``agent.wm``, or ``agent`` itself if it has ``encode``, ``dynamics`` and ``reward``; TypeError if neither."""
    wm = getattr(agent, "wm", agent)
    missing = [name for name in ("encode", "dynamics", "reward") if not hasattr(wm, name)]
    if missing:
        raise TypeError(f"{type(agent).__name__} exposes no world model: expected `agent.wm` with encode, dynamics "
                        f"and reward (missing: {', '.join(missing)}). Pass an agent built by reverie "
                        f"(DreamerV3, PlaNet) or its world model.")
    return wm


def has_decoder(wm: Any) -> bool:
    """Whether the world model decodes observations: its ``decodes``, else whether it has a ``decode`` method."""
    return bool(getattr(wm, "decodes", hasattr(wm, "decode")))


def objective_name(wm: Any) -> str:
    """The world model's representation objective (``"reconstruction"`` where it does not say), for messages."""
    return str(getattr(getattr(wm, "representation", None), "name", "reconstruction"))


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The cosine between features ``a`` and ``b`` ``(..., F)`` along ``F`` -> ``(...)`` float32 (0 where one is 0)."""
    a, b = a.float(), b.float()
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
    """Observe ``context`` = ``C`` steps (``1 <= C < T``), then predict the rest open loop with the replayed actions.

    ``batch``: a replay sample ``(T, B, ...)`` with the observation keys, ``prev_action (T, B, A)`` and
    ``is_first``, ``reward``, ``is_terminal`` ``(T, B)``. ``sample``: draw latents or take their mode. ``seed``
    seeds the draws in a forked RNG (the training RNG is untouched); None uses the global RNG. Raises KeyError
    for a key missing from ``batch``, ValueError for ``context`` out of range or ragged shapes.
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
    """Mean absolute errors for logging: ``openloop/<key>_error`` and ``openloop/reward_error`` over ``t >= C``,
    ``recon/<key>_error`` over all steps (images in ``[0, 1]``, vectors raw), ``openloop/latent_cosine``."""
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
