"""Atari 2600 with the DreamerV3 protocols (docs/envs.md), through ale-py and Gymnasium.

Backend ``ale`` (default) wraps, does not rewrite::

    gym.make("ALE/<Game>-v5", frameskip=1, repeat_action_probability=0, ...) -> StickyActions(sticky) (sticky > 0)
    -> AtariFrames (Gymnasium's AtariPreprocessing, with the true final screen) -> LifeLossTerminal (life_loss=terminal)

An agent step is ``action_repeat`` emulator frames (the frame skip; the factory adds no repeat), max-pooled over
the last two and resized to uint8 ``(size, size, 3)`` RGB; rewards are the unclipped sum. The config keys
(``task``, ``sticky``, ``noops``, ``actions``, ``life_loss``, ``max_frames``, ``size``, ``resize``, ``backend``) and
their presets (``configs/env/atari100k.yaml``, ``configs/env/atari.yaml``) are in docs/envs.md.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import AtariPreprocessing

BACKENDS = ("ale", "envpool")
ACTION_SETS = ("minimal", "full")
LIFE_LOSS_MODES = ("ignore", "terminal", "reset")
RESIZES = ("opencv", "pillow")
DEFAULTS = {  # the `atari` preset (configs/env/atari.yaml); atari100k differs in sticky, noops, actions
    "backend": "ale", "action_repeat": 4, "sticky": 0.25, "noops": 0, "actions": "full", "life_loss": "ignore",
    "max_frames": 108_000, "size": 64, "resize": "opencv",
}


def _require_ale():
    try:
        import ale_py
    except ImportError as err:
        raise ImportError(
            "env suite 'atari' needs ale-py (the Atari ROMs ship with it) and OpenCV: "
            "pip install -e '.[atari]' (or pip install ale-py opencv-python-headless)"
        ) from err
    gym.register_envs(ale_py)
    return ale_py


def _normalise(name: str) -> str:
    """``"ALE/MsPacman-v5"``, ``"ms_pacman"``, ``"atari_ms_pacman"``, ``"MsPacman"`` -> ``"mspacman"``."""
    name = name.strip().split("/")[-1]
    name = re.sub(r"(NoFrameskip)?-v\d+$", "", name)
    name = re.sub(r"^atari_", "", name)
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.cache
def _games() -> dict[str, str]:
    """Normalised game name -> ALE CamelCase name (``"mspacman" -> "MsPacman"``), from the registered v5 ids."""
    _require_ale()
    games = {}
    for env_id in gym.registry:
        match = re.fullmatch(r"ALE/(\w+)-v5", env_id)
        if match:
            games[_normalise(match.group(1))] = match.group(1)
    return games


def ale_id(task: str) -> str:
    """The ALE v5 id of a game name, matched ignoring case, ``_``, ``-``, ``ALE/``, ``atari_`` and ``-v<N>``:
    ``pong`` -> ``ALE/Pong-v5``, ``ms_pacman`` -> ``ALE/MsPacman-v5``, ``james_bond`` -> ``ALE/Jamesbond-v5``.

    Raises ValueError: no ALE game has that name (the message lists close ones)."""
    if not task or not isinstance(task, str):
        raise ValueError(f"env.task must name an Atari game, e.g. env.task=pong, got {task!r}")
    games = _games()
    key = _normalise(task)
    if key in games:
        return f"ALE/{games[key]}-v5"
    close = difflib.get_close_matches(key, list(games), n=5, cutoff=0.6)
    names = ", ".join(_snake(games[c]) for c in close) if close else "none"
    raise ValueError(
        f"env.task={task!r} is not an Atari game in ale-py. Names map by dropping case, '_' and '-' "
        f"(pong -> ALE/Pong-v5, ms_pacman -> ALE/MsPacman-v5, ALE/Breakout-v5 also works). Close names: {names}. "
        f"All {len(games)} games: {', '.join(sorted(_snake(g) for g in games.values()))}"
    )


def _snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).lower()


def settings(cfg: Mapping) -> dict[str, Any]:
    """The validated protocol settings of an env config: :data:`DEFAULTS`' keys (missing ones default) and ``task``.

    Raises ValueError: a setting out of range or unknown, or ``backend=envpool`` with ``life_loss=reset``,
    ``resize=pillow`` or ``wrappers``."""
    s = {key: cfg.get(key, default) for key, default in DEFAULTS.items()}
    s["task"] = cfg.get("task")
    for key, choices in (("backend", BACKENDS), ("actions", ACTION_SETS), ("life_loss", LIFE_LOSS_MODES),
                         ("resize", RESIZES)):
        if s[key] not in choices:
            raise ValueError(f"env.{key} must be one of {choices}, got {s[key]!r}")
    for key, low in (("action_repeat", 1), ("noops", 0), ("size", 8)):
        if isinstance(s[key], bool) or not isinstance(s[key], (int, np.integer)) or s[key] < low:
            raise ValueError(f"env.{key} must be an int >= {low}, got {s[key]!r}")
    if not isinstance(s["sticky"], (int, float)) or not 0.0 <= float(s["sticky"]) <= 1.0:
        raise ValueError(f"env.sticky (ALE repeat_action_probability) must be in [0, 1], got {s['sticky']!r}")
    if s["max_frames"] is not None and (isinstance(s["max_frames"], bool) or int(s["max_frames"]) < 1):
        raise ValueError("env.max_frames must be null (no cap) or an int >= 1 (emulator frames), "
                         f"got {s['max_frames']!r}")
    if s["backend"] == "envpool" and s["life_loss"] == "reset":
        raise ValueError("env.backend=envpool does not offer env.life_loss=reset (envpool's episodic_life does "
                         "not restart the game); use env.backend=ale, or life_loss=ignore|terminal")
    if s["backend"] == "envpool" and s["resize"] != "opencv":
        raise ValueError(f"env.backend=envpool resizes with OpenCV INTER_AREA only, not env.resize={s['resize']!r}; "
                         "use env.backend=ale, or resize=opencv")
    if s["backend"] == "envpool" and cfg.get("wrappers"):
        raise ValueError("env.wrappers apply to single Gymnasium envs and cannot wrap envpool's batched env; "
                         "use env.backend=ale with wrappers")
    s["sticky"] = float(s["sticky"])
    return s


class StickyActions(gym.Wrapper):
    """ALE's sticky actions (Machado et al. 2018; ALE ``StellaEnvironment::act``) applied per emulator frame: with
    probability ``p`` the previous frame's action is repeated (NOOP after a reset). Sits on ALE's env made with
    ``frameskip=1, repeat_action_probability=0``, so a checkpoint holds the state (last action, own generator
    seeded by ``reset(seed=...)``) that ALE's ``cloneState`` leaves out; the draws differ from ALE's, the statistics
    match (``tests/envs/test_atari.py``)."""

    NOOP = 0  # index of NOOP in both the minimal and the full action set

    def __init__(self, env: gym.Env, p: float):
        super().__init__(env)
        self.p = float(p)
        self.last = self.NOOP
        self.rng = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng([int(seed), 0x5717C])  # its own stream: ALE's no-op draws unchanged
        self.last = self.NOOP
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self.rng.random() >= self.p:
            self.last = int(action)
        return self.env.step(self.last)


class AtariFrames(AtariPreprocessing):
    """Gymnasium's ``AtariPreprocessing`` (RGB, max-pooled, resized) that returns the true final screen at an episode
    or life end (Gymnasium returns the previous step's) and resizes with OpenCV ``INTER_AREA`` or, for
    ``resize="pillow"``, ``PIL.Image.resize(..., BILINEAR)`` (the official DreamerV3 2025 ``resize: pillow``)."""

    def __init__(self, env: gym.Env, *, resize: str = "opencv", **kwargs):
        if resize not in RESIZES:
            raise ValueError(f"resize must be one of {RESIZES}, got {resize!r}")
        super().__init__(env, **kwargs)
        if resize == "pillow" and (self.grayscale_obs or self.scale_obs):
            raise ValueError("resize='pillow' serves uint8 RGB frames only (grayscale_obs=False, scale_obs=False)")
        self.resize = resize

    def _get_obs(self):
        if self.resize == "opencv":
            return super()._get_obs()
        from PIL import Image

        if self.frame_skip > 1:  # Gymnasium's in-place pooling
            np.maximum(self.obs_buffer[0], self.obs_buffer[1], out=self.obs_buffer[0])
        return np.asarray(Image.fromarray(self.obs_buffer[0]).resize(self.screen_size, Image.BILINEAR), np.uint8)

    def step(self, action):
        before = self.ale.getEpisodeFrameNumber()
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            if self.ale.getEpisodeFrameNumber() - before != self.frame_skip:
                self.obs_buffer[1].fill(0)  # the pooling partner was not read this step: current screen only
            self.ale.getScreenRGB(self.obs_buffer[0])
            obs = self._get_obs()
        return obs, reward, terminated, truncated, info

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the two frame buffers (each step and reset writes them before reading): back as zeros."""
        state = dict(self.__dict__)
        state["obs_buffer"] = [(buffer.shape, buffer.dtype.str) for buffer in self.obs_buffer]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state.setdefault("resize", "opencv")  # pickled before the option existed
        if state.get("obs_buffer") and isinstance(state["obs_buffer"][0], tuple):
            state["obs_buffer"] = [np.zeros(shape, dtype) for shape, dtype in state["obs_buffer"]]
        self.__dict__.update(state)


class LifeLossTerminal(gym.Wrapper):
    """``life_loss=terminal``: a lost life is reported as ``info["is_terminal"] = True`` and the episode goes on.

    The reference's ``lives=discount`` (``life_loss=reset`` is its ``lives=reset``). Wraps :class:`AtariFrames`
    built with ``terminal_on_life_loss=True``; every step's info carries ``is_terminal``, which
    :class:`reverie.envs.stepper.VectorStepper` ORs into the row's flag without setting ``is_last``."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lost_life = bool(terminated) and not self.env.unwrapped.ale.game_over(with_truncation=False)
        info["is_terminal"] = lost_life
        return obs, reward, terminated and not lost_life, truncated, info


def reduce_atari_env(env: Any) -> tuple:
    """How a checkpoint pickles ale-py's ``AtariEnv`` (:func:`reverie.envs.stepper.dumps_envs`): constructor
    arguments, attributes but the emulator, and ``ale.cloneState(include_rng=True)`` (docs/resume.md).

    Raises NotImplementedError when ALE's own sticky actions are on (``repeat_action_probability > 0``): its saved
    state leaves out the repeated action; the checkpoint then holds no envs and the episodes restart.
    """
    sticky = env.ale.getFloat("repeat_action_probability")
    if sticky > 0:
        raise NotImplementedError(f"Atari with sticky actions (repeat_action_probability={sticky:g}) cannot resume "
                                  "exactly: ale-py's saved state leaves out the action a sticky frame repeats")
    attrs = {key: value for key, value in env.__dict__.items() if key != "ale"}
    return restore_atari_env, (env._ezpickle_args, env._ezpickle_kwargs, attrs, env.ale.cloneState(include_rng=True))


def restore_atari_env(args: tuple, kwargs: dict, attrs: dict, ale_state: Any) -> gym.Env:
    """Unpickle :func:`reduce_atari_env`: a new ``AtariEnv`` with the saved attributes and emulator state."""
    _require_ale()
    from ale_py.env import AtariEnv

    env = AtariEnv(*args, **kwargs)
    env.__dict__.update(attrs)
    env.ale.restoreState(ale_state)
    return env


def make_atari(cfg: Mapping, kwargs: dict) -> gym.Env:
    """One Atari env (backend ``ale``; also single envs of ``backend=envpool``) with the protocol of ``cfg``;
    observations uint8 ``(size, size, 3)``. ``kwargs`` go to ``gym.make("ALE/...")`` (e.g. ``render_mode``).

    Raises ValueError on a bad task or setting (:func:`ale_id`, :func:`settings`); ImportError without ale-py or cv2.
    """
    s = settings(cfg)
    env_id = ale_id(s["task"])
    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with OpenCV)
    except ImportError as err:
        raise ImportError("env suite 'atari' resizes frames with OpenCV: pip install opencv-python-headless "
                          "(or pip install -e '.[atari]')") from err
    max_frames = 0 if s["max_frames"] is None else int(s["max_frames"])  # ALE: 0 means no cap
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0,
                   full_action_space=s["actions"] == "full", max_num_frames_per_episode=max_frames, **kwargs)
    if s["sticky"] > 0:  # per frame, by the wrapper: a checkpoint holds its state (ALE's own does not)
        env = StickyActions(env, s["sticky"])
    env = AtariFrames(env, noop_max=s["noops"], frame_skip=s["action_repeat"], screen_size=s["size"],
                      terminal_on_life_loss=s["life_loss"] != "ignore", grayscale_obs=False, resize=s["resize"])
    if s["life_loss"] == "terminal":
        env = LifeLossTerminal(env)
    return env


class EnvpoolAtari(gym.vector.VectorEnv):
    """``N`` Atari envs in envpool (C++ threads), speaking the same contract as ``make_vector_env``.

    Same frame skip, max pooling, OpenCV ``INTER_AREA`` resize and unclipped rewards as backend ``ale``; observations
    ``{"image": (N, 3, size, size) uint8}``; NEXT_STEP auto-reset, which :class:`~reverie.envs.stepper.VectorStepper`
    needs. Differences from ``ale`` (frame cap, reset no-ops, no ``life_loss=reset``): docs/envs.md.

    Raises ImportError without envpool; ValueError on ``life_loss=reset``, user ``wrappers`` or a bad setting.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, cfg: Mapping, seed: int, num_envs: int, kwargs: dict | None = None):
        s = settings(cfg)
        try:
            import envpool
        except ImportError as err:
            raise ImportError("env.backend=envpool needs envpool: pip install envpool "
                              "(or use env.backend=ale)") from err
        game = ale_id(s["task"])[len("ALE/"):]
        steps = [s["max_frames"] // s["action_repeat"]] if s["max_frames"] else []
        if cfg.get("time_limit"):
            steps.append(int(cfg["time_limit"]))
        kwargs = {k: v for k, v in (kwargs or {}).items() if k != "render_mode"}  # render() serves the obs
        self._pool = envpool.make(
            game, env_type="gymnasium", num_envs=num_envs, seed=int(seed) % 2**31, img_height=s["size"],
            img_width=s["size"], gray_scale=False, stack_num=1, frame_skip=s["action_repeat"],
            noop_max=max(s["noops"], 1),
            repeat_action_probability=s["sticky"], full_action_space=s["actions"] == "full", episodic_life=False,
            reward_clip=False, use_fire_reset=False, use_inter_area_resize=True,
            max_episode_steps=min(steps) if steps else 10**9, **kwargs)
        self.num_envs = num_envs
        self.single_observation_space = spaces.Dict({"image": spaces.Box(0, 255, (3, s["size"], s["size"]), np.uint8)})
        self.observation_space = spaces.Dict(
            {"image": spaces.Box(0, 255, (num_envs, 3, s["size"], s["size"]), np.uint8)})
        self.single_action_space = spaces.Discrete(int(self._pool.single_action_space.n))
        self.action_space = spaces.MultiDiscrete(np.full(num_envs, self.single_action_space.n))
        self._terminal_on_life_loss = s["life_loss"] == "terminal"
        self._lives = np.zeros(num_envs, np.int64)
        self._image = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self._pool.reset()
        self._lives = np.asarray(info["lives"], np.int64)
        self._image = obs
        return {"image": obs}, dict(info)

    def step(self, actions):
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions, np.int64))
        lives = np.asarray(info["lives"], np.int64)
        info = dict(info)
        if self._terminal_on_life_loss:  # a lost life while the game goes on (reset rows have elapsed_step 0)
            info["is_terminal"] = (lives < self._lives) & ~np.asarray(terminated, bool) & (info["elapsed_step"] > 0)
        self._lives = lives
        self._image = obs
        return {"image": obs}, np.asarray(reward, np.float32), np.asarray(terminated, bool), \
            np.asarray(truncated, bool), info

    def call(self, name: str, *args, **kwargs):
        """Only ``call("render")``: the last observations as ``N`` frames ``(size, size, 3)`` uint8."""
        if name != "render" or self._image is None:
            raise AttributeError(f"EnvpoolAtari supports call('render') after reset() only, not call({name!r})")
        return [np.ascontiguousarray(np.transpose(image, (1, 2, 0))) for image in self._image]

    def close_extras(self, **kwargs):
        self._pool.close()


def make_envpool_vector(cfg: Mapping, seed: int, num_envs: int, kwargs: dict) -> gym.vector.VectorEnv:
    """``backend=envpool``: an :class:`EnvpoolAtari` of ``num_envs`` copies seeded from ``seed``."""
    return EnvpoolAtari(cfg, seed, num_envs, kwargs)


def metadata(cfg: Mapping) -> dict[str, Any]:
    """Every protocol setting of an Atari env config, for ``env_metadata.json``; ValueError as :func:`settings`."""
    s = settings(cfg)
    out = {
        "task": s["task"],
        "env_id": ale_id(s["task"]),
        "backend": s["backend"],
        "action_repeat": s["action_repeat"],
        "frames_per_agent_step": s["action_repeat"],
        "pooling": "max over the last 2 frames of each agent step",
        "sticky_action_probability": s["sticky"],
        "noops_max": s["noops"],
        "noops_sampling": "uniform 1..noops NOOP frames at reset" if s["noops"] else "none",
        "action_set": s["actions"],
        "life_loss": s["life_loss"],
        "max_frames": s["max_frames"],
        "frame_cap_is": "truncation (is_last without is_terminal)",
        "image_size": [s["size"], s["size"]],
        "resize": s["resize"],
        "image": "RGB uint8 (3, size, size), "
                 + ("OpenCV INTER_AREA" if s["resize"] == "opencv" else "Pillow BILINEAR") + " resize",
        "reward": "sum over frames, unclipped",
    }
    if s["backend"] == "envpool":
        out["max_agent_steps"] = s["max_frames"] // s["action_repeat"] if s["max_frames"] else None
    return out
