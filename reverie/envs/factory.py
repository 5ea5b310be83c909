"""Build contract envs from an ``env`` config group, and translate agent actions for them.

Config keys: ``suite`` (gym | atari | dmc, :data:`SUITES`), ``id`` (gym: a registered id or ``my_pkg.MyEnv``),
``kwargs``, ``action_repeat``, ``time_limit`` (agent steps, a truncation), ``num_envs``, ``vector_mode``
(sync | async), ``wrappers`` (``[{_target_: ..., **kwargs}]``). The chain is raw env -> user ``wrappers`` ->
ActionRepeat (not for atari and dmc, which repeat themselves) -> action normalisation -> DictObservation ->
TimeLimit -> SeededReset (:mod:`reverie.envs.wrappers`).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from reverie.envs.wrappers import (
    ActionRepeat,
    DictObservation,
    SeededReset,
    UnsupportedSpaceError,
    derive_seed,
    normalize_action,
)
from reverie.types import ActionSpec

VECTOR_MODES = ("sync", "async")


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain Python containers (resolved); anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with hydra-core
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _import_callable(path: str):
    """``"pkg.mod.Name"`` -> the object, or None when the module or attribute does not exist."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # only the path's own module missing means "not an import path"; errors inside the user's module propagate
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            return None
        raise
    target = getattr(module, attr, None)
    return target if callable(target) else None


def _make_raw(env_id: str, kwargs: dict) -> gym.Env:
    """Create the un-wrapped env from a registered id or a dotted import path."""
    if env_id in gym.registry:
        return gym.make(env_id, **kwargs)
    target = _import_callable(env_id)
    if target is None:
        close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3)
        hint = f" Close registered ids: {', '.join(close)}." if close else ""
        raise ValueError(
            f"env.id={env_id!r} is neither a registered Gymnasium id nor an importable `module.Callable`.{hint} "
            "Use e.g. env.id=CartPole-v1 or env.id=my_pkg.MyRobotEnv (a gym.Env class or a function returning one)."
        )
    env = target(**kwargs)
    if not isinstance(env, gym.Env):
        raise TypeError(f"env.id={env_id!r} returned {type(env).__name__}, expected a gymnasium.Env")
    return env


def _make_gym(cfg: Mapping, kwargs: dict) -> gym.Env:
    env_id = cfg.get("id")
    if not env_id:
        raise ValueError("the env config has no 'id'; set env.id=CartPole-v1 or env.id=my_pkg.MyRobotEnv")
    return _make_raw(str(env_id), kwargs)


def _make_atari(cfg: Mapping, kwargs: dict) -> gym.Env:
    from reverie.envs import atari

    return atari.make_atari(cfg, kwargs)


def _make_atari_vector(cfg: Mapping, seed: int, num_envs: int, kwargs: dict) -> gym.vector.VectorEnv | None:
    if cfg.get("backend", "ale") != "envpool":
        return None
    from reverie.envs import atari

    return atari.make_envpool_vector(cfg, seed, num_envs, kwargs)


def _make_dmc(cfg: Mapping, kwargs: dict) -> gym.Env:
    from reverie.envs import dmc

    return dmc.make_dmc(cfg, kwargs)


def _gym_metadata(cfg: Mapping) -> dict[str, Any]:
    return {"id": cfg.get("id"), "action_repeat": int(cfg.get("action_repeat", 1) or 1),
            "frames_per_agent_step": int(cfg.get("action_repeat", 1) or 1)}


def _atari_metadata(cfg: Mapping) -> dict[str, Any]:
    from reverie.envs import atari

    return atari.metadata(cfg)


def _dmc_metadata(cfg: Mapping) -> dict[str, Any]:
    from reverie.envs import dmc

    return dmc.metadata(cfg)


@dataclass(frozen=True)
class Suite:
    """How one env suite is built: ``make(cfg, kwargs)`` the raw env; ``repeats`` True when it applies
    ``cfg.action_repeat`` itself; ``packages`` versioned in the run metadata; ``metadata(cfg)`` the protocol settings;
    ``make_vector(cfg, seed, N, kwargs)`` an optional batched backend (None: Gymnasium's vector env)."""

    make: Callable[[Mapping, dict], gym.Env]
    repeats: bool
    packages: tuple[str, ...]
    metadata: Callable[[Mapping], dict[str, Any]]
    make_vector: Callable[..., gym.vector.VectorEnv | None] | None = None


SUITES: dict[str, Suite] = {
    "gym": Suite(_make_gym, False, ("gymnasium",), _gym_metadata),
    "atari": Suite(_make_atari, True, ("gymnasium", "ale-py", "opencv-python-headless", "opencv-python", "envpool"),
                   _atari_metadata, _make_atari_vector),
    "dmc": Suite(_make_dmc, True, ("gymnasium", "dm_control", "mujoco"), _dmc_metadata),
}
"""``env.suite`` -> builder. Add an entry to support another simulator family."""


def get_suite(cfg: Mapping) -> tuple[str, Suite]:
    """``(name, Suite)`` for ``cfg.suite`` (``gym`` when absent); ValueError for an unknown suite."""
    name = cfg.get("suite") or "gym"
    if name not in SUITES:
        raise ValueError(f"env.suite={name!r} is unknown; choose one of {', '.join(SUITES)} "
                         "(or env=atari100k / env=atari / env=dmc_vision / env=dmc_proprio / env=gym)")
    return name, SUITES[name]


def _versions(packages: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for package in packages:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def reward_threshold(cfg: Mapping) -> float | None:
    """Gymnasium's ``EnvSpec.reward_threshold`` of a registered suite ``gym`` id (CartPole-v1 475: mean over 100
    episodes), else None (Pendulum-v1, Atari, DMC, import paths)."""
    if get_suite(cfg)[0] != "gym" or not cfg.get("id"):
        return None
    try:
        threshold = gym.spec(str(cfg["id"])).reward_threshold
    except (gym.error.Error, ModuleNotFoundError, ValueError):
        return None
    return None if threshold is None else float(threshold)


def env_metadata(cfg: Mapping) -> dict[str, Any]:
    """The suite's protocol settings, simulator versions, ``time_limit`` and ``num_envs`` for ``env_metadata.json``:
    ``{"suite", "versions": {package: version}, ...}``. Raises ValueError: unknown suite or invalid setting."""
    name, suite = get_suite(cfg)
    return {"suite": name, "versions": _versions(suite.packages), **suite.metadata(cfg),
            "time_limit": cfg.get("time_limit"), "num_envs": int(cfg.get("num_envs", 1) or 1)}


def write_env_metadata(cfg: Mapping, run_dir: str | Path) -> Path:
    """Write :func:`env_metadata` to ``<run_dir>/env_metadata.json`` and return the path."""
    path = Path(run_dir) / "env_metadata.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(env_metadata(cfg), indent=2, default=str) + "\n", encoding="utf-8")
    return path


def make_raw_env(cfg: Mapping) -> gym.Env:
    """The suite's env with the user's ``env.wrappers`` and the action repeat, in its own observation and action
    spaces (what a Minari dataset records); :func:`make_env` wraps it into the contract and raises the same errors."""
    cfg = _plain(cfg)
    _, suite = get_suite(cfg)
    kwargs = _plain(cfg.get("kwargs")) or {}
    env = suite.make(cfg, dict(kwargs))

    user_wrappers = _plain(cfg.get("wrappers")) or []
    if user_wrappers:
        from hydra.utils import instantiate

        for spec in user_wrappers:
            if not isinstance(spec, Mapping) or "_target_" not in spec:
                raise ValueError(f"each entry of env.wrappers needs a _target_ (a dotted wrapper class), got {spec!r}")
            env = instantiate(spec, env=env)

    repeat = cfg.get("action_repeat", 1)
    if repeat not in (None, 1) and not suite.repeats:
        env = ActionRepeat(env, repeat)
    return env


def make_env(cfg: Mapping, seed: int, index: int = 0) -> gym.Env:
    """One contract env: dict observations (``vector`` float32 ``(F,)``, ``image`` uint8 ``(3, H, W)``, or a Dict
    space's keys), ``Box`` actions in ``[-1, 1]``, ``Discrete`` as ``0..n-1``; the first unseeded ``reset()`` and the
    action space use ``derive_seed(seed, index)``, so each copy ``index`` gets its own stream.

    Raises ValueError (unknown suite; bad ``id``, task, setting, ``action_repeat`` or ``time_limit``),
    UnsupportedSpaceError (a space outside the contract), ImportError (no simulator; names the pip extra).
    """
    cfg = _plain(cfg)
    env = normalize_action(make_raw_env(cfg))
    env = DictObservation(env)
    time_limit = cfg.get("time_limit")
    if time_limit is not None:
        if isinstance(time_limit, bool) or not isinstance(time_limit, (int, np.integer)) or time_limit < 1:
            raise ValueError(f"env.time_limit must be null or an int >= 1 (agent steps), got {time_limit!r}")
        env = TimeLimit(env, max_episode_steps=int(time_limit))
    return SeededReset(env, derive_seed(seed, index))


def make_vector_env(
    cfg: Mapping, seed: int, num_envs: int | None = None, mode: str | None = None
) -> gym.vector.VectorEnv:
    """``N`` contract envs (copy ``i`` is ``make_env(cfg, seed, i)``), or a suite's batched backend of the same
    contract; observations are dicts of ``(N, ...)`` arrays. ``num_envs`` and ``mode`` (``"sync"``/``"async"``)
    default to ``cfg.num_envs`` and ``cfg.vector_mode``.

    ``AutoresetMode.NEXT_STEP`` on purpose: the call ending an episode returns the true final observation, the next
    ignores the action and returns the reset one (reward 0), giving one replay row per env per call
    (:class:`reverie.envs.stepper.VectorStepper`). Raises ValueError: ``num_envs`` < 1 or an unknown ``mode``.
    """
    n = int(num_envs if num_envs is not None else cfg.get("num_envs", 1) or 1)
    if n < 1:
        raise ValueError(f"env.num_envs must be >= 1, got {n}")
    mode = mode if mode is not None else cfg.get("vector_mode", "sync")
    if mode not in VECTOR_MODES:
        raise ValueError(f"env.vector_mode must be one of {VECTOR_MODES}, got {mode!r}")
    _, suite = get_suite(cfg)
    if suite.make_vector is not None:
        batched = suite.make_vector(_plain(cfg), seed, n, dict(_plain(cfg.get("kwargs")) or {}))
        if batched is not None:
            return batched
    fns = [functools.partial(make_env, cfg, seed, i) for i in range(n)]
    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    return cls(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def action_spec(space: spaces.Space) -> ActionSpec:
    """The agent-facing :class:`ActionSpec` of a normalised single-env action space: ``Discrete(n)`` -> discrete
    ``dim=n``, ``Box`` ``(A,)`` -> continuous ``dim=A``; UnsupportedSpaceError otherwise."""
    if isinstance(space, spaces.Discrete):
        return ActionSpec(discrete=True, dim=int(space.n))
    if isinstance(space, spaces.Box) and len(space.shape) == 1:
        return ActionSpec(discrete=False, dim=int(space.shape[0]))
    raise UnsupportedSpaceError("action space", space, "only Discrete(n) and Box of shape (A,) are supported")


def to_env_action(action: np.ndarray, spec: ActionSpec) -> np.ndarray:
    """Model actions ``(N, A)`` float32 -> env actions: discrete ``argmax`` int64 ``(N,)``, continuous clipped to
    ``[-1, 1]`` float32 ``(N, A)``. Raises ValueError unless ``action`` is ``(N, spec.dim)``."""
    action = np.asarray(action)
    if action.ndim != 2 or action.shape[1] != spec.dim:
        raise ValueError(f"actions must have shape (N, {spec.dim}), got {action.shape}")
    if spec.discrete:
        return np.argmax(action, axis=1).astype(np.int64)
    return np.clip(action, -1.0, 1.0).astype(np.float32)
