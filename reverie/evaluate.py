"""Evaluation episodes on env copies separate from the training envs."""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from reverie.agents.base import Agent
from reverie.envs import make_vector_env
from reverie.envs.stepper import VectorStepper

EVAL_SEED_OFFSET = 10_000  # eval env copies get seeds disjoint from the training envs'


def evaluate(agent: Agent, env_cfg: Mapping, episodes: int, seed: int, mode: str = "eval",
             max_envs: int = 16) -> dict[str, Any]:
    """Run ``episodes`` full episodes with the agent's policy and return their returns and lengths.

    Episodes are spread over ``min(episodes, max_envs)`` parallel copies with fixed per-copy quotas, so
    short episodes are not over-represented. Env copies are seeded from ``seed + EVAL_SEED_OFFSET``.

    Args:
        agent: anything with the Agent protocol's ``act``.
        env_cfg: the env config the agent was trained with.
        episodes: number of episodes (>= 1).
        seed: run seed.
        mode: ``"eval"`` (policy mode) or ``"sample"`` (sampled actions).

    Returns:
        ``{"returns": [float] * episodes, "lengths": [int] * episodes, "mean", "std", "min", "max"}``.

    Raises:
        ValueError: ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"evaluate: episodes must be >= 1, got {episodes}")
    n = min(episodes, max_envs)
    quota = np.full(n, episodes // n)
    quota[: episodes % n] += 1
    stepper = VectorStepper(make_vector_env(env_cfg, seed + EVAL_SEED_OFFSET, num_envs=n, mode="sync"))
    returns: list[float] = []
    lengths: list[int] = []
    done = np.zeros(n, int)
    try:
        row, state = stepper.reset(), None
        while (done < quota).any():
            action, state = agent.act(row, state, mode)
            row, finished = stepper.step(action)
            for ep in finished:
                if done[ep["env"]] < quota[ep["env"]]:
                    returns.append(ep["return"])
                    lengths.append(ep["length"])
                    done[ep["env"]] += 1
    finally:
        stepper.close()
    r = np.asarray(returns)
    return {"returns": returns, "lengths": lengths, "mean": float(r.mean()), "std": float(r.std()),
            "min": float(r.min()), "max": float(r.max())}


def record_episode(agent: Agent, env_cfg: Mapping, seed: int, mode: str = "eval",
                   max_steps: int = 10_000) -> tuple[np.ndarray | None, float]:
    """Play one episode with ``render_mode="rgb_array"`` and return ``(frames (T, H, W, 3) uint8, return)``.

    Frames are ``None`` (with a warning) when the env cannot render to ``rgb_array``.
    """
    cfg = OmegaConf.create(OmegaConf.to_container(env_cfg, resolve=True) if OmegaConf.is_config(env_cfg)
                           else copy.deepcopy(dict(env_cfg)))
    cfg.kwargs = dict(cfg.get("kwargs") or {}) | {"render_mode": "rgb_array"}
    # pygame-based renderers (Gymnasium classic control) initialise SDL's audio and video although they draw
    # off-screen; on a headless machine SDL then prints an XDG_RUNTIME_DIR error. A user's own setting wins.
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        stepper = VectorStepper(make_vector_env(cfg, seed + EVAL_SEED_OFFSET, num_envs=1, mode="sync"))
    except TypeError as err:  # a user env whose constructor takes no render_mode
        warnings.warn(f"no evaluation video: the env does not accept render_mode='rgb_array' ({err})", stacklevel=2)
        return None, float("nan")
    frames, total = [], 0.0
    try:
        row, state = stepper.reset(), None
        for _ in range(max_steps):
            frame = stepper.env.call("render")[0]
            if frame is None:
                warnings.warn("no evaluation video: env.render() returned None", stacklevel=2)
                return None, float("nan")
            frames.append(np.asarray(frame, np.uint8))
            action, state = agent.act(row, state, mode)
            row, finished = stepper.step(action)
            if finished:
                total = finished[0]["return"]
                frames.append(np.asarray(stepper.env.call("render")[0], np.uint8))
                break
    finally:
        stepper.close()
    return np.stack(frames), total
