"""Evaluation episodes on env copies separate from the training envs, their videos and returns table."""

from __future__ import annotations

import copy
import csv
import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from reverie.agents.base import Agent
from reverie.envs import make_vector_env, reward_threshold
from reverie.envs.stepper import VectorStepper

EVAL_SEED_OFFSET = 10_000  # eval env copies get seeds disjoint from the training envs'


def evaluate(agent: Agent, env_cfg: Mapping, episodes: int, seed: int, mode: str = "eval",
             max_envs: int = 16, recorder: Any = None,
             on_episode: Callable[[int, int, float], None] | None = None,
             on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run ``episodes`` (>= 1, else ValueError) full episodes with ``agent.act`` in ``mode`` (``"eval"``/``"sample"``).

    Episodes are spread over ``min(episodes, max_envs)`` copies with fixed quotas, so short episodes are not
    over-represented; copies are seeded from ``seed + EVAL_SEED_OFFSET``, so ``reverie eval`` reproduces a run's
    evaluations. A ``recorder`` (:class:`reverie.viz.episodes.EpisodeRecorder`) gets a video of every kept episode
    (rendering leaves dynamics and seeds unchanged); ``on_episode(done, episodes, return)`` and ``on_step(steps)``
    report progress. Returns ``{"returns", "lengths", "mean", "std", "min", "max"}``.
    """
    if episodes < 1:
        raise ValueError(f"evaluate: episodes must be >= 1, got {episodes}")
    n = min(episodes, max_envs)
    quota = np.full(n, episodes // n)
    quota[: episodes % n] += 1
    render = recorder is not None and recorder.render
    stepper = VectorStepper(make_vector_env(render_config(env_cfg) if render else env_cfg, seed + EVAL_SEED_OFFSET,
                                            num_envs=n, mode="sync"))
    returns: list[float] = []
    lengths: list[int] = []
    done = np.zeros(n, int)
    steps = 0

    def frames() -> list | None:
        return list(stepper.env.call("render")) if render else None

    try:
        row, state = stepper.reset(), None
        if recorder is not None:
            recorder.observe(row, frames())
        while (done < quota).any():
            action, state = agent.act(row, state, mode)
            if recorder is not None:
                recorder.act(action)
            row, finished = stepper.step(action)
            steps += 1
            if on_step is not None:
                on_step(steps)
            if recorder is not None:
                recorder.observe(row, frames())
            for ep in finished:
                keep = done[ep["env"]] < quota[ep["env"]]
                if keep:
                    returns.append(ep["return"])
                    lengths.append(ep["length"])
                    done[ep["env"]] += 1
                    if on_episode is not None:
                        on_episode(len(returns), episodes, float(ep["return"]))
                if recorder is not None:
                    recorder.finish(ep["env"], len(returns) - 1 if keep else None)
    finally:
        stepper.close()
        if recorder is not None:
            recorder.close()
    r = np.asarray(returns)
    return {"returns": returns, "lengths": lengths, "mean": float(r.mean()), "std": float(r.std()),
            "min": float(r.min()), "max": float(r.max())}


def stop_target(train_cfg: Mapping, env_cfg: Mapping) -> float | None:
    """The return ``train.stop_return`` asks for: a number as given, None for null, ``solved`` the env's registered
    ``reward_threshold`` (:func:`reverie.envs.reward_threshold`); ValueError for ``solved`` without one or another
    string."""
    value = train_cfg.get("stop_return")
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    if value == "solved":
        threshold = reward_threshold(env_cfg)
        if threshold is None:
            raise ValueError(f"train.stop_return=solved: {env_cfg.get('id') or env_cfg.get('suite')} registers no "
                             f"reward_threshold; give the return to stop at as a number (e.g. train.stop_return=-200 "
                             f"for Pendulum-v1) or null")
        return threshold
    raise ValueError(f"train.stop_return={value!r}: give a number, solved (the env's registered reward_threshold) "
                     f"or null")


def render_config(env_cfg: Mapping) -> Any:
    """A copy of ``env_cfg`` whose envs render to ``rgb_array`` (dynamics unchanged); sets SDL's dummy drivers."""
    cfg = OmegaConf.create(OmegaConf.to_container(env_cfg, resolve=True) if OmegaConf.is_config(env_cfg)
                           else copy.deepcopy(dict(env_cfg)))
    cfg.kwargs = dict(cfg.get("kwargs") or {}) | {"render_mode": "rgb_array"}
    # pygame-based renderers (Gymnasium classic control) initialise SDL's audio and video although they draw
    # off-screen; on a headless machine SDL then prints an XDG_RUNTIME_DIR error. A user's own setting wins.
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    return cfg


def write_returns(result: Mapping[str, Any], directory: str | Path, **info: Any) -> tuple[Path, Path]:
    """Write :func:`evaluate`'s table to ``directory`` as ``returns.json`` (its stats, returns and lengths, plus
    ``info``) and ``returns.csv`` (``episode,return,length``); returns ``(json_path, csv_path)``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table = {k: result[k] for k in ("mean", "std", "min", "max")} | {"episodes": len(result["returns"]),
                                                                      "returns": list(result["returns"]),
                                                                      "lengths": list(result["lengths"])} | info
    json_path, csv_path = directory / "returns.json", directory / "returns.csv"
    json_path.write_text(json.dumps(table, indent=1, default=str) + "\n", encoding="utf-8")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["episode", "return", "length"])
        for i, (ret, length) in enumerate(zip(result["returns"], result["lengths"])):
            writer.writerow([i, ret, length])
    return json_path, csv_path


def format_returns(result: Mapping[str, Any], title: str = "") -> str:
    """The returns table of :func:`evaluate` as text (rich): one row per episode (return, length in agent steps),
    then mean +- std (population std, as ``returns.json``), min and max of the returns."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("episode", justify="right")
    table.add_column("return", justify="right")
    table.add_column("length", justify="right")
    for k, (ret, length) in enumerate(zip(result["returns"], result["lengths"])):
        table.add_row(str(k), f"{ret:.1f}", str(int(length)))
    table.add_section()
    table.add_row("mean", f"{result['mean']:.1f} +- {result['std']:.1f}", "")
    table.add_row("min", f"{result['min']:.1f}", "")
    table.add_row("max", f"{result['max']:.1f}", "")
    out = io.StringIO()
    Console(file=out, width=100, color_system=None, force_terminal=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()).strip("\n")


def record_episode(agent: Agent, env_cfg: Mapping, seed: int, mode: str = "eval", max_steps: int = 10_000,
                   on_frame: Callable[[np.ndarray], None] | None = None) -> tuple[list[np.ndarray] | None, float]:
    """Play one episode with ``render_mode="rgb_array"`` and return ``(frames, return)``, ``T`` uint8 ``(H, W, 3)``
    frames in a list; with ``on_frame`` each frame goes to it instead and the list stays empty (streaming: a
    500-step CartPole episode is 360 MB). Frames are None (with a warning) when the env cannot render."""
    cfg = render_config(env_cfg)
    try:
        stepper = VectorStepper(make_vector_env(cfg, seed + EVAL_SEED_OFFSET, num_envs=1, mode="sync"))
    except TypeError as err:  # a user env whose constructor takes no render_mode
        warnings.warn(f"no evaluation video: the env does not accept render_mode='rgb_array' ({err})", stacklevel=2)
        return None, float("nan")
    frames, total = [], 0.0
    keep = frames.append if on_frame is None else on_frame
    try:
        row, state = stepper.reset(), None
        for _ in range(max_steps):
            frame = stepper.env.call("render")[0]
            if frame is None:
                warnings.warn("no evaluation video: env.render() returned None", stacklevel=2)
                return None, float("nan")
            keep(np.asarray(frame, np.uint8))
            action, state = agent.act(row, state, mode)
            row, finished = stepper.step(action)
            if finished:
                total = finished[0]["return"]
                keep(np.asarray(stepper.env.call("render")[0], np.uint8))
                break
    finally:
        stepper.close()
    return frames, total
