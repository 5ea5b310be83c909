"""Atari 2600 with the DreamerV3 protocols (docs/envs.md), through ale-py and Gymnasium.

Backend ``ale`` (default) wraps, does not rewrite::

    gym.make("ALE/<Game>-v5", frameskip=1, repeat_action_probability=0, full_action_space=actions == "full",
             max_num_frames_per_episode=max_frames)
    -> StickyActions(sticky)                                                     (only sticky > 0; ALE's rule)
    -> AtariPreprocessing(noop_max=noops, frame_skip=action_repeat, screen_size=size, grayscale_obs=False,
                          terminal_on_life_loss=life_loss != "ignore")          (Gymnasium; AtariFrames: + resize)
    -> LifeLossTerminal                                                          (only life_loss=terminal)

An agent step is ``action_repeat`` (4) emulator frames; the observation is the pixel-wise max over the last two
of them, resized to ``size x size`` RGB with OpenCV ``INTER_AREA`` (``resize=opencv``, Gymnasium's) or Pillow
``BILINEAR`` (``resize=pillow``, the official DreamerV3 2025 code's): uint8 ``(size, size, 3)``, which the factory
turns into ``image`` uint8 ``(3, size, size)``. Rewards are the unclipped sum over the frames.

Protocol settings (keys of the env config; ``configs/env/atari100k.yaml`` and ``configs/env/atari.yaml``):

=============  ==========================================================================================
``task``       game: ``pong``, ``ms_pacman``, ``Pong``, ``ALE/Pong-v5`` (see :func:`ale_id`)
``sticky``     ALE's ``repeat_action_probability`` rule per frame, applied by :class:`StickyActions` (atari100k 0.0,
               atari 0.25)
``noops``      at reset, ``U{1..noops}`` NOOP frames (Gymnasium's sampling; 0 = none) (atari100k 30, atari 0)
``actions``    ``minimal`` (the game's own set, e.g. 6 for Pong) or ``full`` (all 18)
``life_loss``  ``ignore``: lives are not used. ``terminal``: a lost life sets ``is_terminal`` (reported as
               ``info["is_terminal"]``) and the episode goes on (the reference's ``lives=discount``).
               ``reset``: a lost life ends the episode as terminated and the next reset restarts the game
               (the reference's ``lives=reset``). Either way the frame loop stops at the lost life.
``max_frames`` episode cap in emulator frames, noop frames included (108,000 = 30 min); a truncation
``size``       image side in pixels (64)
``resize``     ``opencv`` (``cv2.INTER_AREA``, Gymnasium's and DreamerV3 2023's) or ``pillow`` (``PIL.Image.resize``
               ``BILINEAR``, DreamerV3 2025's ``resize: pillow``; bit-exact with it:
               ``tests/envs/test_atari_official_recording.py``). ``backend=envpool`` offers ``opencv`` only
``backend``    ``ale`` or ``envpool`` (vector envs only; see :class:`EnvpoolAtari`)
=============  ==========================================================================================

``action_repeat`` (4) is consumed here as the frame skip, so the factory applies no second repeat; frames
are ``agent steps x action_repeat`` (fewer only on the step where an episode or a life ends).

One fix on top of Gymnasium 1.4's ``AtariPreprocessing`` (see :class:`AtariFrames`): when an episode ends
inside the frame-skip loop it returns the previous step's image; we return the true final screen.
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
    """The ALE v5 id of a game name: ``pong`` -> ``ALE/Pong-v5``.

    Names are matched case-, underscore- and dash-insensitively after dropping an ``ALE/`` prefix, an
    ``atari_`` prefix and a ``-v<N>`` suffix, so ``ms_pacman``, ``MsPacman``, ``atari_ms_pacman`` and
    ``ALE/MsPacman-v5`` all give ``ALE/MsPacman-v5`` (and ``james_bond`` gives ``ALE/Jamesbond-v5``).

    Raises:
        ValueError: no ALE game has that name; the message says how names map and lists close ones.
    """
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
    """The validated protocol settings of an env config (missing keys take :data:`DEFAULTS`).

    Returns:
        ``{"task", "backend", "action_repeat", "sticky", "noops", "actions", "life_loss", "max_frames", "size",
        "resize"}``.

    Raises:
        ValueError: a setting out of range or an unknown choice (the message names the key and the choices);
            ``backend=envpool`` with ``life_loss=reset``, ``resize=pillow`` or ``wrappers``.
    """
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
    """ALE's sticky actions (Machado et al. 2018), applied per emulator frame by this wrapper instead of the
    emulator, so that a checkpoint can hold them: at every frame, with probability ``p`` the previous frame's
    action is executed again instead of the one given (ALE ``StellaEnvironment::act``: ``if rng() >= p: action =
    new``; the previous action is NOOP after a reset). It sits directly on ALE's env (``frameskip=1``:
    one ``step`` is one frame), under the frame loop, so the no-op frames at reset are sticky as in ALE.

    ALE keeps the repeated action outside its saved state (``cloneState``), so a game with ALE's own sticky actions
    cannot resume exactly; this wrapper's state is its last action and its own generator (``np.random.Generator``,
    seeded by ``reset(seed=...)``), both pickled with the env. The draws differ from ALE's generator; the rule and
    its statistics are the same (``tests/envs/test_atari.py``).

    Args:
        env: ALE's Gymnasium env made with ``repeat_action_probability=0`` and ``frameskip=1``.
        p: the repeat probability (``env.sticky``; 0.25 in the ALE v5 default and the long Atari protocol).
    """

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
    """Gymnasium's ``AtariPreprocessing`` (RGB, max-pooled, resized), with the true final observation and a choice
    of resize.

    Gymnasium leaves its frame-skip loop on ``terminated``/``truncated`` *before* reading the screen, so the
    observation it returns at an episode (or life) end is the previous agent step's. Here the final observation
    is the current screen, max-pooled with the previous frame when that frame was read in this step (the
    episode ended on the last frame of the skip), otherwise the current screen alone. ``resize="pillow"``
    resizes the pooled ``(210, 160, 3)`` screen with ``PIL.Image.resize(..., BILINEAR)`` (the official DreamerV3
    2025 wrapper's ``resize: pillow``) instead of OpenCV's ``INTER_AREA``. Everything else is Gymnasium's code,
    unchanged.
    """

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
        """Pickled without the two frame buffers (``(2, 210, 160, 3)`` uint8, 200 KB): every step and reset writes
        the frames it returns before reading them (the step's last two frames, or the final screen with the other
        buffer zeroed, see :meth:`step`; a reset reads the screen and zeroes the other), so the saved contents never
        reach an observation. They come back as zeros."""
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

    Wraps an :class:`AtariFrames` built with ``terminal_on_life_loss=True``: a ``terminated`` while the game is
    not over is a lost life, turned into ``terminated=False`` plus ``info["is_terminal"]=True``. Every step's
    info carries ``is_terminal`` (bool), which :class:`reverie.envs.stepper.VectorStepper` ORs into the row's
    ``is_terminal`` flag without setting ``is_last``.
    """

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lost_life = bool(terminated) and not self.env.unwrapped.ale.game_over(with_truncation=False)
        info["is_terminal"] = lost_life
        return obs, reward, terminated and not lost_life, truncated, info


def reduce_atari_env(env: Any) -> tuple:
    """How a checkpoint pickles ale-py's ``AtariEnv`` (:func:`reverie.envs.stepper.dumps_envs`): its constructor
    arguments, its attributes but the emulator (``np_random``, which the no-op resets draw from, among them) and the
    emulator's state with its random generator (``ale.cloneState(include_rng=True)``: RAM, CPU, frame counters,
    sticky-action generator), a few KiB; :func:`restore_atari_env` builds it again.

    ale-py's own pickling (Gymnasium's ``EzPickle``) keeps the constructor arguments only: the game restarts from
    a fresh, randomly seeded emulator while the wrappers above believe the episode goes on.

    Raises:
        NotImplementedError: ALE's own sticky actions are on (``repeat_action_probability > 0``: an env made
            outside :func:`make_atari`, which applies them in :class:`StickyActions`): the emulator's state leaves
            out the action a sticky frame repeats, so the game cannot continue exactly; the checkpoint then holds
            no envs and the episodes in flight restart (:meth:`reverie.envs.stepper.VectorStepper.state_dict`).
    """
    sticky = env.ale.getFloat("repeat_action_probability")
    if sticky > 0:
        raise NotImplementedError(f"Atari with sticky actions (repeat_action_probability={sticky:g}) cannot resume "
                                  "exactly: ale-py's saved state leaves out the action a sticky frame repeats")
    attrs = {key: value for key, value in env.__dict__.items() if key != "ale"}
    return restore_atari_env, (env._ezpickle_args, env._ezpickle_kwargs, attrs, env.ale.cloneState(include_rng=True))


def restore_atari_env(args: tuple, kwargs: dict, attrs: dict, ale_state: Any) -> gym.Env:
    """Unpickle :func:`reduce_atari_env`: a new ``AtariEnv(*args, **kwargs)`` with the saved attributes and emulator
    state (the game continues exactly where it was saved)."""
    _require_ale()
    from ale_py.env import AtariEnv

    env = AtariEnv(*args, **kwargs)
    env.__dict__.update(attrs)
    env.ale.restoreState(ale_state)
    return env


def make_atari(cfg: Mapping, kwargs: dict) -> gym.Env:
    """One Atari env (backend ``ale``) with the protocol of ``cfg``; observations uint8 ``(size, size, 3)``.

    Also used for single envs when ``backend=envpool`` (same spaces and protocol), since envpool only batches.

    Args:
        cfg: the env config (see the module docstring for the keys).
        kwargs: extra keyword arguments for ``gym.make("ALE/...")``, e.g. ``render_mode``, ``mode``, ``difficulty``.

    Raises:
        ValueError: bad task name or setting (see :func:`ale_id`, :func:`settings`).
        ImportError: ale-py or OpenCV is not installed (names the pip command).
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

    Built with ``envpool.make("<Game>-v5", env_type="gymnasium", frame_skip=action_repeat, img_height=size,
    img_width=size, gray_scale=False, stack_num=1, noop_max=noops, repeat_action_probability=sticky,
    full_action_space=..., episodic_life=False, reward_clip=False, use_fire_reset=False,
    use_inter_area_resize=True, max_episode_steps=...)``: the same frame skip, two-frame max pooling, OpenCV
    ``INTER_AREA`` resize, unclipped rewards. Observations ``{"image": (N, 3, size, size) uint8}``; envpool
    auto-resets like Gymnasium's ``NEXT_STEP`` mode (the call after an episode end returns the reset
    observation with reward 0 and ignores the action), which :class:`~reverie.envs.stepper.VectorStepper` needs.

    Differences from backend ``ale``: the episode cap is ``max_frames // action_repeat`` agent steps counted
    after the reset no-ops (ale counts the no-op frames too); envpool always plays at least one NOOP frame at
    reset (``noops=0`` becomes exactly 1; for ``noops >= 1`` both draw ``U{1..noops}``, from their own RNGs);
    a game over in the first two frames of a skip returns the previous step's image (ale returns the final
    screen); the env copies are seeded ``seed, seed+1, ...`` by envpool. ``life_loss=reset`` is not offered (envpool's
    ``episodic_life`` continues the game instead of restarting it); ``terminal`` is derived from ``info["lives"]``.

    Raises:
        ImportError: envpool is not installed.
        ValueError: ``life_loss=reset``, user ``wrappers``, or a bad setting.
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
    """Every protocol setting of an Atari env config, for ``<run_dir>/env_metadata.json``.

    Raises:
        ValueError: as :func:`settings` and :func:`ale_id`.
    """
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
