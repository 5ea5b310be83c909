"""Record episodes from a policy into the dataset format (``reverie record``; docs/offline.md).

Policies (:func:`make_policy`): ``random`` (as the training prefill); a run directory or checkpoint (``load_run``'s
agent, acting in ``mode``); an import path ``pkg.module.name`` or ``pkg.module:Class`` (instantiated without
arguments): ``policy(obs) -> actions``, obs a dict of ``(N, ...)`` arrays with ``is_first``, actions ``(N,)`` indices
or ``(N, A)`` model actions. Rows are those ``reverie train`` adds to its replay, except that an ``is_last`` row's
action is stored as zeros, so the npz and Minari formats hold the same rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from reverie.data.episodes import DatasetError, Episode
from reverie.loop.session import random_actions
from reverie.types import ActionSpec

Policy = Callable[[dict[str, np.ndarray], Any], tuple[np.ndarray, Any]]


def make_policy(name: str, spec: ActionSpec, rng: np.random.Generator, mode: str = "explore") -> tuple[Policy, str]:
    """``(policy(obs, state) -> (actions (N, A) float32, state), description)`` for ``random``, a run or an import
    path; DatasetError for anything else, or a run whose action space differs from ``spec``."""
    if name == "random":
        return (lambda obs, state: (random_actions(rng, spec, len(obs["is_first"])), None)), "random"
    if Path(name).exists():
        from reverie.state.saved_run import RunError, load_run

        try:
            run = load_run(name)
        except RunError as err:
            raise DatasetError(f"record error: {err}") from err
        if run.action_spec != spec:
            raise DatasetError(f"record error: the run {name} acts in {run.action_spec}, the env config in {spec}; "
                               f"record with the run's env config (leave out env overrides)")
        return (lambda obs, state: run.agent.act(obs, state, mode)), f"run {run.checkpoint} ({mode})"
    controller = _import(name)
    if isinstance(controller, type):
        controller = controller()

    def scripted(obs: dict[str, np.ndarray], state: Any) -> tuple[np.ndarray, Any]:
        return _model_actions(np.asarray(controller(obs)), spec, len(obs["is_first"]), name), None

    return scripted, f"controller {name}"


def _import(path: str) -> Any:
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attr) if module_name else None
    except (ImportError, AttributeError):
        target = None
    if not callable(target):
        raise DatasetError(f"record error: --policy {path!r} is not 'random', an existing run directory, nor an "
                           f"importable callable (pkg.module.function or pkg.module:Class)")
    return target


def _model_actions(action: np.ndarray, spec: ActionSpec, n: int, name: str) -> np.ndarray:
    """A controller's output -> model actions ``(N, A)`` float32 (indices become one-hot rows)."""
    if spec.discrete and action.shape == (n,) and np.issubdtype(action.dtype, np.integer):
        if ((action < 0) | (action >= spec.dim)).any():
            raise DatasetError(f"record error: controller {name} returned {action.tolist()}, outside 0..{spec.dim - 1}")
        return np.eye(spec.dim, dtype=np.float32)[action]
    if action.shape != (n, spec.dim):
        raise DatasetError(f"record error: controller {name} returned shape {action.shape}; expected ({n},) indices "
                           f"or ({n}, {spec.dim}) model actions")
    return action.astype(np.float32)


def _executed(state: Any, action: np.ndarray) -> Any:
    """A world-model agent's acting state ``(dynamics state, prev_action (N, A))`` with the actions the envs really
    took (epsilon swaps), so its next filtering step sees them; any other state unchanged."""
    import torch

    if isinstance(state, tuple) and len(state) == 2 and torch.is_tensor(state[1]) and state[1].shape == action.shape:
        return state[0], torch.as_tensor(action, dtype=state[1].dtype, device=state[1].device)
    return state


def record(env_cfg: Mapping, policy: str, episodes: int, seed: int = 0, epsilon: float = 0.0,
           mode: str = "explore", on_episode: Callable[[int, int, float], None] | None = None
           ) -> tuple[list[Episode], str]:
    """Run ``policy`` in the env config's ``N`` envs (seeded as a run of ``seed``) until ``episodes`` have finished.
    ``epsilon``: per-step probability of a uniform random action; ``mode``: a run agent's act mode;
    ``on_episode(done, episodes, episode_return)`` after each finished episode. Returns ``(episodes, description)``:
    episodes in finishing order (running ones dropped), a description for the dataset's metadata. DatasetError: a
    bad ``policy``, ``episodes < 1`` or ``epsilon`` outside ``[0, 1]``."""
    from reverie.envs import make_vector_env
    from reverie.envs.stepper import VectorStepper

    if episodes < 1 or not 0.0 <= epsilon <= 1.0:
        raise DatasetError(f"record error: need episodes >= 1 and epsilon in [0, 1], got {episodes} and {epsilon}")
    rng = np.random.default_rng(seed)
    stepper = VectorStepper(make_vector_env(env_cfg, seed))
    spec, n = stepper.action_spec, stepper.num_envs
    act, description = make_policy(policy, spec, rng, mode)
    running: list[list[dict[str, np.ndarray]]] = [[] for _ in range(n)]
    done: list[Episode] = []
    try:
        row, state = stepper.reset(), None
        while len(done) < episodes:
            action, state = act(row, state)
            action = np.array(action, np.float32)
            if epsilon > 0:
                swap = rng.random(n) < epsilon  # (N,)
                action[swap] = random_actions(rng, spec, int(swap.sum()))
                state = _executed(state, action)
            stored = action * ~row["is_last"][:, None]  # an is_last row's action is never used: zeros
            for i in range(n):
                running[i].append({**{k: v[i] for k, v in row.items()}, "action": stored[i]})
                if row["is_last"][i]:
                    rows = {k: np.stack([r[k] for r in running[i]]) for k in running[i][0]}  # T x (...) -> (T, ...)
                    done.append(Episode(f"recorded episode {len(done)}", rows))
                    running[i] = []
                    if on_episode is not None and len(done) <= episodes:
                        on_episode(len(done), episodes, float(np.sum(rows["reward"], dtype=np.float64)))
            row, _ = stepper.step(action)
    finally:
        stepper.close()
    mix = f", epsilon {epsilon} uniform random actions" if epsilon else ""
    return done[:episodes], f"{description}{mix}, seed {seed}"
