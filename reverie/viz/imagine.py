"""``reverie imagine``: observe ``C`` real frames, then dream ``H`` steps with the world model and decode them.

Timing (``C`` context rows from one env episode, seeded as the run's evaluation envs)::

    t = 0 .. C-1     the agent acts in the env (``agent.act``, policy mode); the world model observes the rows
                     (posterior); the decoded posterior is shown (green bar)
    t = C .. C+H-1   prior steps ``img_step(s_{t-1}, a_{t-1})`` without frames (red bar); the H actions
                     a_{C-1} .. a_{C+H-2} that drive them come from ``actions``, the first one chosen at the last
                     context posterior

``actions``: ``"policy"`` (the mode of ``agent.actor`` on the imagined state), ``"random"`` (one-hot or
``U[-1, 1]``), or an ``(H, A)`` array of model actions (``(H,)`` indices for discrete spaces), row ``i`` driving
imagined step ``i + 1``. Files (docs/viz.md): ``imagine.json``, ``imagine.png`` and ``imagine_<key>.mp4`` per
image key; without decoders, the PNG shows the predicted rewards and continue probabilities alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F
import torch

from reverie.envs import make_vector_env
from reverie.envs.stepper import VectorStepper
from reverie.loop.evaluate import EVAL_SEED_OFFSET
from reverie.logs.video import mp4_writer, pad_even
from reverie.types import ActionSpec
from reverie.viz.figure import figure_to_array, new_figure, shade_context
from reverie.viz.grid import to_hwc, upscale, video_grid
from reverie.viz.openloop import decode_mode, find_world_model, has_decoder, objective_name, to_tensors

#: Frames per row of the PNG (every step is shown; longer trajectories wrap onto more rows).
ROW_FRAMES = 10


@dataclass
class Imagined:
    """An imagined trajectory of ``context`` + ``horizon`` = ``C + H`` steps (context first); numpy arrays.

    ``obs``: key -> decoded ``(C + H, *shape)`` (empty without decoders, see ``objective``). ``truth``: key ->
    ``(C + H', *shape)``: the context rows, then the real env's answer to the imagined actions (``H' <= H``: until
    the episode ended). ``actions`` ``(C + H, A)`` (the last never executed), ``reward`` and ``cont`` ``(C + H,)``
    (``cont`` empty without a head). ``names``: key -> the env's feature names (DMC: ``position[0]``, ...).
    """

    context: int
    horizon: int
    obs: dict[str, np.ndarray]
    truth: dict[str, np.ndarray]
    actions: np.ndarray
    reward: np.ndarray
    cont: np.ndarray
    objective: str = "reconstruction"
    names: dict[str, list[str]] = field(default_factory=dict)


def action_source(agent: Any, spec: ActionSpec, actions: Any, horizon: int, seed: int):
    """``f(i, feat (1, F)) -> (1, A)``: the action at imagination state ``i`` (0: the last context posterior).
    Raises ValueError for an unknown ``actions`` string, ``"policy"`` without an actor, or a bad array."""
    device = next(agent.parameters()).device  # where the imagined actions go
    if isinstance(actions, str) and actions == "policy":
        actor = getattr(agent, "actor", None)
        if actor is None and hasattr(getattr(agent, "ac", None), "policy"):  # agent=storm: its actor-critic's
            return lambda i, feat: F.one_hot(agent.ac.policy(feat).probs.argmax(-1), spec.dim).to(feat.dtype)
        if actor is None:
            raise ValueError(f"{type(agent).__name__} has no actor network to act in imagination; use "
                             f"--actions random or an (H, A) .npy file of actions")
        return lambda i, feat: actor(feat).mode
    if isinstance(actions, str) and actions == "random":
        rng = np.random.default_rng(seed)
        if spec.discrete:
            table = np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=horizon + 1)]
        else:
            table = rng.uniform(-1, 1, size=(horizon + 1, spec.dim)).astype(np.float32)
        return lambda i, feat: torch.as_tensor(table[i][None], device=device)
    if isinstance(actions, str):
        raise ValueError(f"actions must be 'policy', 'random' or an array / .npy file, got {actions!r}")
    table = np.asarray(actions)
    if spec.discrete and table.ndim == 1:
        if table.min() < 0 or table.max() >= spec.dim:
            raise ValueError(f"action indices must be in [0, {spec.dim}), got min {table.min()} max {table.max()}")
        table = np.eye(spec.dim, dtype=np.float32)[table.astype(int)]  # (H,) indices -> (H, A) one-hot
    if table.ndim != 2 or table.shape[1] != spec.dim or len(table) < horizon:
        raise ValueError(f"actions must be shaped (H, A) = ({horizon}, {spec.dim}) (or (H,) indices for discrete "
                         f"actions), got {table.shape}")
    table = np.concatenate([table, table[-1:]]).astype(np.float32)  # one spare row: the never-executed last action
    return lambda i, feat: torch.as_tensor(table[i][None], device=device)


@torch.inference_mode()
def imagine(agent: Any, env_cfg: Any, spec: ActionSpec, seed: int, context: int = 5, horizon: int = 15,
            actions: Any = "policy") -> Imagined:
    """Observe ``context`` env steps with the agent's policy, then imagine ``horizon`` steps (module docstring).

    Raises:
        ValueError: ``context < 1`` or ``horizon < 1``; the episode ended during the context steps; bad
            ``actions`` (see :func:`action_source`).
    """
    if context < 1 or horizon < 1:
        raise ValueError(f"imagine: context and horizon must be >= 1, got {context} and {horizon}")
    wm = find_world_model(agent)
    keys = tuple(wm.obs_shapes)
    decoded = has_decoder(wm)  # without decoders: rewards and continue probabilities only
    stepper = VectorStepper(make_vector_env(env_cfg, seed + EVAL_SEED_OFFSET, num_envs=1, mode="sync"))
    rows, taken = [], []
    try:
        row, state = stepper.reset(), None
        for t in range(context):
            action, state = agent.act(row, state, "eval")
            rows.append(row)
            taken.append(action[0])
            if t < context - 1:
                row, finished = stepper.step(action)
                if finished or row["is_first"][0]:
                    raise ValueError(f"imagine: the episode ended after {t + 1} steps, before the {context} "
                                     f"context steps; use a smaller --context")
        imagined = _imagine_from(agent, wm, keys, rows, taken, spec, actions, horizon, seed)
        names = env_feature_names(stepper.env)
        truth_rows = []  # the real env's answer to the imagined actions, from the last context row on
        for action in imagined["actions"][context - 1:context - 1 + horizon]:
            row, finished = stepper.step(action[None])
            if finished or row["is_first"][0]:
                break
            truth_rows.append(row)
    finally:
        stepper.close()
    truth = {k: np.concatenate([np.stack([r[k][0] for r in rows]),
                                np.stack([r[k][0] for r in truth_rows]).reshape(-1, *rows[0][k].shape[1:])])
             for k in keys}
    feat = imagined["feat"]
    cont = wm.cont(feat).mean.float().cpu().numpy() if hasattr(wm, "cont") else np.zeros(0, np.float32)
    return Imagined(context, horizon, decode_mode(wm, feat) if decoded else {}, truth, imagined["actions"],
                    wm.reward(feat).mean.float().cpu().numpy(), cont, objective_name(wm), names)


def env_feature_names(vector_env: Any) -> dict[str, list[str]]:
    """The first env copy's ``feature_names`` (``{key: [name, ...]}``; the DMC env has them), else ``{}``."""
    try:
        return dict(vector_env.get_attr("feature_names")[0] or {})
    except (AttributeError, IndexError):
        return {}


def _imagine_from(agent: Any, wm: Any, keys: tuple[str, ...], rows: list, taken: list, spec: ActionSpec,
                  actions: Any, horizon: int, seed: int) -> dict[str, Any]:
    """The posterior of the ``C`` context rows, then ``horizon`` prior steps: ``{"feat": (C + H, F),
    "actions": (C + H, A)}`` (the action of each step; the last one is never executed)."""
    batch = {k: np.stack([r[k] for r in rows]) for k in (*keys, "is_first")}  # C x (1, ...) -> (C, 1, ...)
    prev = np.stack([np.zeros_like(taken[0]), *taken[:-1]])  # prev_action_t = action_{t-1}: (C, A)
    batch["prev_action"] = prev[:, None]
    data = to_tensors(wm, batch, (*keys, "is_first", "prev_action"))
    dynamics = wm.dynamics
    post, _ = dynamics.observe(wm.encode({k: data[k] for k in keys}), data["prev_action"], data["is_first"],
                               None, sample=False)
    source = action_source(agent, spec, actions, horizon, seed)
    state = dynamics.truncate(post)  # (1, ...): after the last context row
    action = source(0, dynamics.features(state)).float()  # a_{C-1}, (1, A): the first action of the imagination
    states, acts = [], []
    for i in range(horizon):
        state = dynamics.img_step(state, action, sample=False)
        acts.append(action)
        states.append(state)
        action = source(i + 1, dynamics.features(state)).float()
    acts.append(action)
    # (C, 1, ...) + (H, 1, ...) -> (C + H, ...): the context posteriors, then the imagined states
    trajectory = {k: torch.cat([post[k], torch.stack([s[k] for s in states])])[:, 0]
                  for k in dynamics.feature_keys}  # what features reads
    feat = dynamics.features(trajectory)  # (C + H, F)
    all_actions = np.concatenate([np.stack(taken[:-1]), torch.cat(acts).cpu().numpy()])  # (C - 1 + H + 1, A)
    return {"feat": feat, "actions": all_actions}


def imagined_strip(result: Imagined, per_row: int = ROW_FRAMES) -> np.ndarray:
    """:func:`imagined_figure` drawn: uint8 ``(H, W, 3)``."""
    return figure_to_array(imagined_figure(result, per_row))


def imagined_figure(result: Imagined, per_row: int = ROW_FRAMES) -> Any:
    """The PNG's matplotlib figure: every decoded frame, ``per_row`` a row (context steps' labels grey), or the
    decoded features over t; the predicted reward (bars) and continue probability underneath."""
    T = result.context + result.horizon
    image_keys = [k for k, v in result.obs.items() if v.ndim == 4 and v.dtype == np.uint8]
    rows = (-(-T // per_row) if image_keys else 1) if result.obs else 0  # no decoders: the reward axes alone
    cell = 1.0 * len(image_keys) if image_keys else 2.0
    fig, axes = new_figure(rows + 1, 1, width=max(6.0, 1.0 * min(T, per_row)), height=cell + 0.5,
                           gridspec_kw={"height_ratios": [cell] * rows + [1.6]})
    bottom = axes[-1, 0]
    steps = np.arange(T)
    if image_keys:
        tiles = np.concatenate([to_hwc(result.obs[k]) for k in image_keys], 1)  # (T, K * H, W, 3): keys stacked
        height, width = tiles.shape[1:3]
        for r in range(rows):
            ax, shown = axes[r, 0], steps[r * per_row:(r + 1) * per_row]
            row = np.zeros((height, per_row * width, 3), np.uint8) + 255  # a short last row: white on the right
            row[:, :len(shown) * width] = np.concatenate(list(tiles[shown]), 1)
            ax.imshow(row, interpolation="nearest")
            ax.set_xticks((np.arange(len(shown)) + 0.5) * width, [str(t) for t in shown], fontsize=7)
            for label, t in zip(ax.get_xticklabels(), shown):
                label.set_color("0.5" if t < result.context else "black")
            ax.set_yticks([])
            ax.set_ylabel("/".join(image_keys), fontsize=7)
            ax.set_xlabel("step t", fontsize=7, labelpad=1)
        axes[0, 0].set_title(f"decoded frames by step t (grey: context t < {result.context}, black: imagined)",
                             fontsize=8)
    elif result.obs:
        top = axes[0, 0]
        for k, v in result.obs.items():
            true = result.truth.get(k)
            names = result.names.get(k, [])
            for f in range(min(v.shape[-1], 8)):
                (line,) = top.plot(steps, v[:, f], lw=1, label=names[f] if f < len(names) else f"{k}[{f}]")
                if true is not None and len(true):
                    top.plot(np.arange(len(true)), true[:, f], lw=1, ls="--", color=line.get_color())
        shade_context(top, result.context)
        top.plot([], [], color="0.3", lw=1, label="decoded (solid)")
        top.plot([], [], color="0.3", lw=1, ls="--", label="true: the env's answer to the same actions (dashed)")
        top.legend(fontsize=6, ncol=4)
        top.set_xlabel("step t", fontsize=7)
        top.set_ylabel("value", fontsize=7)
        top.set_title(f"decoded features and the true ones (context t < {result.context}, imagined after)",
                      fontsize=8)
    else:
        bottom.set_title(f"no decoder (representation {result.objective}): predicted reward and continue "
                         f"(context t < {result.context}, imagined after)", fontsize=8)
    shade_context(bottom, result.context)
    bottom.bar(steps, result.reward, color="tab:red", label="predicted reward")
    if len(result.cont):
        twin = bottom.twinx()
        twin.plot(steps, result.cont, color="tab:blue", lw=1, label="continue prob.")
        twin.set_ylim(-0.05, 1.05)
        twin.tick_params(labelsize=7)
        twin.set_ylabel("continue", fontsize=7)
        fig.subplots_adjust(right=1 - 0.6 / fig.get_figwidth())  # room for the right-hand axis labels
    bottom.set_xlim(-0.5, T - 0.5)
    bottom.set_xlabel("step t", fontsize=8)
    bottom.set_ylabel("reward", fontsize=7)
    bottom.tick_params(labelsize=7)
    return fig


def write_imagined(result: Imagined, directory: str | Path, fps: int = 10, scale: int = 4) -> list[Path]:
    """Write ``imagine.json``, ``imagine.png`` and one ``imagine_<key>.mp4`` per image key; returns the paths."""
    import imageio.v3 as iio

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "imagine.json", directory / "imagine.png"]
    paths[0].write_text(json.dumps({"context": result.context, "horizon": result.horizon,
                                    "actions": result.actions.tolist(), "reward": result.reward.tolist(),
                                    "cont": result.cont.tolist(), "representation": result.objective,
                                    "decoded": sorted(result.obs),
                                    "true_steps": len(next(iter(result.truth.values()), []))}) + "\n",
                         encoding="utf-8")
    iio.imwrite(paths[1], imagined_strip(result))
    for k, v in result.obs.items():
        if v.ndim == 4 and v.dtype == np.uint8:
            frames = upscale(video_grid([v[:, None]], result.context), scale)  # (T, C, H, W) -> (T, 1, C, H, W)
            paths.append(directory / f"imagine_{k}.mp4")
            with mp4_writer(paths[-1], fps) as writer:
                for frame in frames:
                    writer.append_data(pad_even(frame))
    return paths
