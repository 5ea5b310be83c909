"""DeepMind Control Suite through dm_control: pixels (``env=dmc_vision``) and/or proprio (``env=dmc_proprio``).

:class:`DMCEnv` adapts ``dm_control.suite.load(domain, task)`` to ``gym.Env`` (not Shimmy's wrapper: a dependency
that renders on every physics step; this one renders once per agent step). Observations: ``image`` uint8
``(size, size, 3)`` and/or ``vector`` float32 ``(F,)`` (every proprio entry flattened in dm_control's order); the
action repeat (default 2) sums rewards; dm_control's time limit is a truncation, a discount of 0 a termination.
Pickling stores MuJoCo's state instead of the simulator (:meth:`DMCEnv.__getstate__`, docs/resume.md); rendering
needs headless OpenGL (:func:`~reverie.envs.gl.select_gl`). Settings and tasks: docs/envs.md.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from reverie.envs import dmc_subtle
from reverie.envs.gl import GLUnavailableError, select_gl

DEFAULT_CAMERAS = {"quadruped": 2}  # DreamerV3 reference (embodied/envs/dmc.py); every other domain uses 0
TASK_ALIASES = {"cup_catch": "ball_in_cup_catch"}  # the reference's spelling
DEFAULTS = {"action_repeat": 2, "image": True, "proprio": False, "size": 64, "camera": None, "proprio_split": False}
RESERVED = ("image", "reward", "is_first", "is_last", "is_terminal", "prev_action", "action")  # not entry names

def _require_dm_control(required_gl: bool):
    if importlib.util.find_spec("dm_control") is None or importlib.util.find_spec("mujoco") is None:
        raise ImportError("env suite 'dmc' needs dm_control and MuJoCo < 4: pip install -e '.[dmc]' "
                          "(or pip install dm_control 'mujoco<4')")
    select_gl(required_gl)
    from dm_control import suite

    return suite


def subtle_domain(name: str) -> str:
    """The suite domain of a DMC-Subtle task (``"ball_in_cup_catch_subtle"`` -> ``"ball_in_cup"``)."""
    return "ball_in_cup" if name.startswith("ball_in_cup") else "point_mass" if name.startswith("point_mass") \
        else name.split("_", 1)[0]


def dmc_task(name: str, all_tasks=None) -> tuple[str, str]:
    """``"cartpole_swingup"`` -> ``("cartpole", "swingup")``, ``"cup_catch"`` -> ``("ball_in_cup", "catch")``, among
    ``all_tasks`` (default ``suite.ALL_TASKS``). ValueError: no such task (the message lists close ones)."""
    if all_tasks is None:
        all_tasks = _require_dm_control(required_gl=False).ALL_TASKS
    names = {f"{domain}_{task}": (domain, task) for domain, task in all_tasks}
    key = TASK_ALIASES.get(str(name), str(name))
    if key in names:
        return names[key]
    pool = {**{n: n for n in names}, **{a: real for a, real in TASK_ALIASES.items() if real in names}}
    close = list(dict.fromkeys(pool[c] for c in difflib.get_close_matches(str(name), list(pool), n=5, cutoff=0.6)))
    raise ValueError(
        f"env.task={name!r} is not a DeepMind Control Suite task. Names are <domain>_<task> "
        f"(cartpole_swingup, walker_walk, ball_in_cup_catch). Close names: {', '.join(close) or 'none'}. "
        f"All tasks: {', '.join(sorted(names))}; DMC-Subtle: {', '.join(dmc_subtle.TASKS)}"
    )


class DMCEnv(gym.Env):
    """One dm_control suite (or DMC-Subtle) task ``<domain>_<task>`` as a Gymnasium env with dict observations:
    ``image`` uint8 ``(size, size, 3)``, ``vector`` float32 ``(F,)`` or, with ``proprio_split``, each dm_control entry
    its own key (``obs_`` prefix on a clash with a row key), as the official DreamerV3 DMC envs give them.
    ``action_repeat`` control steps per agent step; ``camera`` None picks quadruped 2, else 0; ``task_kwargs`` and
    ``environment_kwargs`` go to ``suite.load``. Raises ValueError (bad task, no observation, bad ``action_repeat``
    or ``size``), GLUnavailableError (``image`` without headless OpenGL)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, task: str, action_repeat: int = 2, image: bool = True, proprio: bool = False, size: int = 64,
                 camera: int | None = None, render_mode: str | None = None, task_kwargs: dict | None = None,
                 environment_kwargs: dict | None = None, proprio_split: bool = False):
        if not image and not proprio:
            raise ValueError("DMC env needs env.image=true and/or env.proprio=true (no observation otherwise)")
        for key, value, low in (("action_repeat", action_repeat, 1), ("size", size, 8)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"env.{key} must be an int >= {low}, got {value!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"DMC env render_mode must be None or 'rgb_array', got {render_mode!r}")
        suite = _require_dm_control(required_gl=image or render_mode is not None)
        self.subtle = str(task) in dmc_subtle.TASKS  # DMC-Subtle (reverie.envs.dmc_subtle): a suite task, smaller
        self.domain, self.task_name = (subtle_domain(task), str(task)) if self.subtle else dmc_task(task,
                                                                                                  suite.ALL_TASKS)
        self.repeat, self.size, self.image, self.proprio = int(action_repeat), int(size), bool(image), bool(proprio)
        self.proprio_split = bool(proprio_split)
        self.camera = DEFAULT_CAMERAS.get(self.domain, 0) if camera is None else int(camera)
        self.render_mode = render_mode
        self._load_kwargs = {"task_kwargs": dict(task_kwargs or {}), "environment_kwargs": environment_kwargs}
        self._env = self._load(suite)
        self.proprio_keys = list(self._env.observation_spec())
        self.observation_space = self._observation_space()
        widths = {k: int(np.prod(spec.shape, dtype=np.int64)) for k, spec in self._env.observation_spec().items()}
        # names of the vector's entries, for plots (reverie imagine): "position[0]", ..., "velocity[1]"
        self.feature_names = {"vector": [f"{k}[{i}]" if w > 1 else k for k, w in widths.items() for i in range(w)]} \
            if self.proprio and not self.proprio_split else {}
        act = self._env.action_spec()
        self.action_space = spaces.Box(np.asarray(act.minimum, np.float32), np.asarray(act.maximum, np.float32),
                                       act.shape, np.float32)

    def _observation_space(self) -> spaces.Dict:
        entries = {}
        if self.image:
            entries["image"] = spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        if self.proprio:
            widths = {k: int(np.prod(spec.shape, dtype=np.int64)) for k, spec in self._env.observation_spec().items()}
            if self.proprio_split:
                for key, width in widths.items():
                    entries[self.entry_key(key)] = spaces.Box(-np.inf, np.inf, (width,), np.float32)
            else:
                entries["vector"] = spaces.Box(-np.inf, np.inf, (sum(widths.values()),), np.float32)
        return spaces.Dict(entries)

    @staticmethod
    def entry_key(name: str) -> str:
        """The observation key of dm_control entry ``name`` with ``proprio_split``."""
        return f"obs_{name}" if name in RESERVED else name

    def _obs(self, timestep) -> dict[str, np.ndarray]:
        obs = {}
        if self.image:
            obs["image"] = self.render_image()
        if self.proprio:
            parts = [np.asarray(timestep.observation[k], np.float32).reshape(-1) for k in self.proprio_keys]
            if self.proprio_split:
                obs |= {self.entry_key(k): part for k, part in zip(self.proprio_keys, parts)}
            else:
                obs["vector"] = np.concatenate(parts)
        return obs

    def render_image(self) -> np.ndarray:
        """The camera image, uint8 ``(size, size, 3)``."""
        return self._env.physics.render(self.size, self.size, camera_id=self.camera)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._env.task.random.seed(seed)  # dm_control draws initial states from the task's RandomState
        return self._obs(self._env.reset()), {}

    def step(self, action):
        action = np.asarray(action, np.float64)
        total, timestep = 0.0, None
        for _ in range(self.repeat):
            timestep = self._env.step(action)
            total += float(timestep.reward or 0.0)
            if timestep.last():
                break
        terminated = bool(timestep.last() and timestep.discount == 0)
        truncated = bool(timestep.last() and not terminated)
        return self._obs(timestep), total, terminated, truncated, {}

    def render(self):
        return self.render_image() if self.render_mode == "rgb_array" else None

    def close(self):
        """Free the simulator and its OpenGL context. Call it on the thread that rendered: dm_control's EGL
        context is current there, and freeing it from another thread fails (``EGL_BAD_ACCESS``)."""
        self._env.close()
        physics = getattr(self._env, "_physics", None)
        if physics is not None and hasattr(physics, "_data"):
            physics.free()  # frees the GL contexts now, on this thread, instead of in dm_control's atexit callback

    def _load(self, suite):
        """``suite.load`` of this task; remembers the digests of the fresh model's fields (:func:`model_fields`)."""
        if getattr(self, "subtle", False):  # (an env pickled before DMC-Subtle existed has no such attribute)
            env = dmc_subtle.load(self.task_name, dict(self._load_kwargs["task_kwargs"]),
                                  self._load_kwargs["environment_kwargs"])
        else:
            env = suite.load(self.domain, self.task_name, task_kwargs=dict(self._load_kwargs["task_kwargs"]),
                             environment_kwargs=self._load_kwargs["environment_kwargs"])
        self._model_digests = {name: _digest(value) for name, value in model_fields(env.physics.model.ptr).items()}
        return env

    def __getstate__(self) -> dict[str, Any]:
        """The env without the simulator: its attributes but ``_env`` and ``observation_space``, plus ``"_dmc"``:
        ``versions``, ``sizes``, ``physics`` (float64 ``mj_getState(mjSTATE_INTEGRATION)``), ``model`` (the fields
        that differ from the freshly loaded model), ``environment`` and ``task`` (their attributes, the task's
        ``random`` among them). An env from an old whole-pickle checkpoint (no ``_load_kwargs``) pickles whole."""
        state = dict(self.__dict__)
        if "_load_kwargs" not in state:  # restored from an old whole pickle: its load arguments are unknown
            return state
        import mujoco

        env = state.pop("_env")
        for rebuilt in ("_model_digests", "observation_space"):  # made again when the model is loaded again
            state.pop(rebuilt, None)
        physics = env.physics
        model, data = physics.model.ptr, physics.data.ptr
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        flat = np.empty(mujoco.mj_stateSize(model, spec), np.float64)
        mujoco.mj_getState(model, data, flat, spec)
        fields = model_fields(model)
        state["_dmc"] = {
            "versions": _versions(), "sizes": _sizes(model),
            "physics": flat,
            "model": {name: np.array(value, copy=True) for name, value in fields.items()
                      if _digest(value) != self._model_digests.get(name)},
            "environment": {k: v for k, v in env.__dict__.items() if k not in ("_physics", "_task")},
            "task": dict(env.task.__dict__),
        }
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Load the task again and put the :meth:`__getstate__` state back (a whole pickle is taken as it is).
        Raises ValueError for another dm_control or MuJoCo version or other model sizes (the episodes then
        restart), GLUnavailableError as the constructor."""
        saved = state.pop("_dmc", None)
        self.__dict__.update(state)
        if saved is None:
            return
        import mujoco

        if saved["versions"] != _versions():
            raise ValueError(f"the DMC env state was saved with {saved['versions']}, this is {_versions()}; the "
                             "simulator may step differently, so the episodes in flight restart")
        suite = _require_dm_control(required_gl=self.image or self.render_mode is not None)
        env = self._load(suite)
        physics = env.physics
        model, data = physics.model.ptr, physics.data.ptr
        if saved["sizes"] != _sizes(model):
            raise ValueError(f"the reloaded {self.domain}_{self.task_name} model has sizes {_sizes(model)}, the "
                             f"saved state {saved['sizes']}")
        fields = model_fields(model)
        for name, value in saved["model"].items():
            _set_field(model, name, fields[name], value)
        env.__dict__.update(saved["environment"])
        env.task.__dict__.update(saved["task"])
        self._env = env
        self.observation_space = self._observation_space()
        mujoco.mj_setState(model, data, np.asarray(saved["physics"], np.float64),
                           mujoco.mjtState.mjSTATE_INTEGRATION)
        physics.forward()  # the derived quantities (positions, contacts, sensors) the next step starts from


def model_fields(model) -> dict[str, Any]:
    """The ``mujoco.MjModel`` fields a task may change: every array (views into the model) and the numbers and
    arrays of ``opt`` and ``stat`` (as ``"opt.timestep"``); ``vis`` (rendering only) is left out."""
    fields: dict[str, Any] = {}
    for name in dir(model):
        if not name.startswith("_"):
            value = getattr(model, name, None)
            if isinstance(value, np.ndarray):
                fields[name] = value
    for part in ("opt", "stat"):
        struct = getattr(model, part)
        for name in dir(struct):
            value = getattr(struct, name, None) if not name.startswith("_") else None
            if isinstance(value, (np.ndarray, int, float)) and not isinstance(value, bool):
                fields[f"{part}.{name}"] = value
    return fields


def _set_field(model, name: str, current: Any, value: Any) -> None:
    if isinstance(current, np.ndarray):
        current[...] = value
    else:
        part, attr = name.split(".")
        setattr(getattr(model, part), attr, type(current)(value))


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(value).view(np.uint8), digest_size=16).digest()


def _versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("dm_control", "mujoco")}


def _sizes(model) -> dict[str, int]:
    import mujoco

    return {"nq": int(model.nq), "nv": int(model.nv), "na": int(model.na),
            "state": int(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_INTEGRATION))}


def settings(cfg: Mapping) -> dict[str, Any]:
    """The env config's DMC settings (missing keys take :data:`DEFAULTS`) plus ``task``."""
    return {"task": cfg.get("task"), **{key: cfg.get(key, default) for key, default in DEFAULTS.items()}}


def make_dmc(cfg: Mapping, kwargs: dict) -> gym.Env:
    """A :class:`DMCEnv` from an env config plus ``kwargs`` (``render_mode``, ``task_kwargs``,
    ``environment_kwargs``); raises as :class:`DMCEnv`, and ValueError without ``task``."""
    s = settings(cfg)
    if not s["task"]:
        raise ValueError("the DMC env config needs env.task, e.g. env.task=cartpole_swingup")
    return DMCEnv(**s, **kwargs)


def metadata(cfg: Mapping) -> dict[str, Any]:
    """The DMC protocol settings of an env config, for ``<run_dir>/env_metadata.json`` (no GL or dm_control import)."""
    s = settings(cfg)
    domain = None
    if s["task"]:
        domain = TASK_ALIASES.get(str(s["task"]), str(s["task"]))
        domain = "ball_in_cup" if domain.startswith("ball_in_cup_") else domain.split("_", 1)[0]
    camera = s["camera"] if s["camera"] is not None else DEFAULT_CAMERAS.get(domain, 0)
    return {
        "task": s["task"],
        "action_repeat": s["action_repeat"],
        "frames_per_agent_step": s["action_repeat"],
        "observations": [k for k, on in (("image", s["image"]), ("vector", s["proprio"] and not s["proprio_split"]),
                                          ("<dm_control entries>", s["proprio"] and s["proprio_split"])) if on],
        "image_size": [s["size"], s["size"]] if s["image"] else None,
        "camera": camera if s["image"] else None,
        "vector": None if not s["proprio"] else "each dm_control entry its own key" if s["proprio_split"] else
        "all proprio entries flattened in dm_control's order",
        "episode_end": "dm_control time limit -> truncation; discount 0 -> termination",
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
    }
