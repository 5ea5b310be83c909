"""Tiny deterministic envs for tests and examples, registered nowhere: use the import path as ``env.id``
(``env.id=reverie.envs.testing.CountingEnv env.kwargs.length=3``); also a scripted controller for
``reverie record --policy`` (:func:`cartpole_balance`)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: Observation code of step ``s`` in episode ``e`` (both counted from 0 since construction): ``e * CODE_BASE + s``.
CODE_BASE = 1000


class CountingEnv(gym.Env):
    """Episodes of exactly ``length`` steps whose float32 ``(obs_dim,)`` observations say where they are:
    ``obs[0] = episode * 1000 + step`` (resets since construction, steps since reset; seed-independent), ``obs[1]``
    the last action with ``echo_action``, else 0. Reward: the step reached (1-based), so a return of
    ``length * (length + 1) / 2``; the end is ``terminated`` if ``terminate`` else ``truncated``. Actions
    ``Discrete(2)`` or ``Box(-1, 1, (1,))``. ValueError: ``length`` < 1, or ``echo_action`` with ``obs_dim`` < 2."""

    metadata = {"render_modes": []}

    def __init__(
        self, length: int = 5, obs_dim: int = 1, discrete: bool = True, terminate: bool = True,
        echo_action: bool = False
    ):
        if length < 1:
            raise ValueError(f"CountingEnv length must be >= 1, got {length}")
        if echo_action and obs_dim < 2:
            raise ValueError(f"CountingEnv(echo_action=True) needs obs_dim >= 2, got {obs_dim}")
        self.length = int(length)
        self.obs_dim = int(obs_dim)
        self.terminate = bool(terminate)
        self.echo_action = bool(echo_action)
        self.observation_space = spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.action_space = spaces.Discrete(2) if discrete else spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.episode = -1
        self.t = 0

    def _obs(self, last_action: float = 0.0) -> np.ndarray:
        obs = np.zeros(self.obs_dim, np.float32)
        obs[0] = self.episode * CODE_BASE + self.t
        if self.echo_action:
            obs[1] = last_action
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.t >= self.length:
            raise RuntimeError("CountingEnv.step() after the episode ended; call reset()")
        self.t += 1
        done = self.t == self.length
        value = float(np.asarray(action).reshape(-1)[0])
        return self._obs(value), float(self.t), done and self.terminate, done and not self.terminate, {}


class ImageCountingEnv(CountingEnv):
    """:class:`CountingEnv` with uint8 ``(size, size, 3)`` images: step % 256 in channel 0, episode % 256 in channel
    1, 0 in channel 2; with ``dict_obs`` a Dict ``{"image", "vector"}`` (the CountingEnv vector)."""

    def __init__(self, length: int = 5, size: int = 64, dict_obs: bool = False, **kwargs):
        super().__init__(length=length, **kwargs)
        self.size = int(size)
        self.dict_obs = bool(dict_obs)
        image = spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        if self.dict_obs:
            self.observation_space = spaces.Dict({"image": image, "vector": self.observation_space})
        else:
            self.observation_space = image

    def _obs(self, last_action: float = 0.0):
        image = np.zeros((self.size, self.size, 3), np.uint8)
        image[..., 0] = self.t % 256
        image[..., 1] = self.episode % 256
        if self.dict_obs:
            return {"image": image, "vector": super()._obs(last_action)}
        return image


class IdentityEnv(gym.Env):
    """Reward for repeating the target shown in the previous observation (a quick learning check); truncated after
    ``length`` steps. Discrete: one-hot float32 ``(n,)`` targets, reward 1 on a match; continuous: a ``(1,)`` target
    in ``[-1, 1]``, reward ``1 - |action - target| / 2``."""

    metadata = {"render_modes": []}

    def __init__(self, n: int = 2, length: int = 10, discrete: bool = True):
        if n < 2 or length < 1:
            raise ValueError(f"IdentityEnv needs n >= 2 and length >= 1, got n={n} length={length}")
        self.n, self.length, self.discrete = int(n), int(length), bool(discrete)
        if self.discrete:
            self.observation_space = spaces.Box(0.0, 1.0, (self.n,), np.float32)
            self.action_space = spaces.Discrete(self.n)
        else:
            self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
            self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
        self.target = 0

    def _obs(self) -> np.ndarray:
        if self.discrete:
            self.target = int(self.np_random.integers(self.n))
            return np.eye(self.n, dtype=np.float32)[self.target]
        self.target = float(self.np_random.uniform(-1.0, 1.0))
        return np.array([self.target], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.discrete:
            reward = float(int(action) == self.target)
        else:
            reward = 1.0 - abs(float(np.asarray(action).reshape(-1)[0]) - self.target) / 2.0
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


class SpaceEnv(gym.Env):
    """Samples of the given space objects as observations, reward 0, never ends: for testing space handling."""

    metadata = {"render_modes": []}

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space):
        self.observation_space = observation_space
        self.action_space = action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class RecordActions(gym.Wrapper):
    """Records every action the wrapped env receives in ``recorded_actions``; first in ``env.wrappers`` it shows
    the raw env's own units (after reverie's ``[-1, 1]`` rescaling)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.recorded_actions: list = []

    def step(self, action):
        self.recorded_actions.append(np.array(action, copy=True))
        return self.env.step(action)


def random_batch(T: int = 8, B: int = 4, features: int = 4, actions: int = 2, p_first: float = 0.1,
                 p_terminal: float = 0.1, seed: int = 0) -> dict[str, np.ndarray]:
    """A random replay batch from ``default_rng(seed)`` for agent tests: ``vector`` ``(T, B, F)`` and ``reward``
    ``(T, B)`` float32 N(0, 1), ``prev_action`` ``(T, B, A)`` one-hot (zero where ``is_first``), ``is_first`` (always at
    t=0, else ``p_first``) and ``is_terminal`` (``p_terminal``) ``(T, B)`` bool."""
    rng = np.random.default_rng(seed)
    is_first = rng.random((T, B)) < p_first
    is_first[0] = True
    return {"vector": rng.normal(size=(T, B, features)).astype(np.float32),
            "prev_action": np.eye(actions, dtype=np.float32)[rng.integers(actions, size=(T, B))] * ~is_first[..., None],
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_terminal": rng.random((T, B)) < p_terminal}


class Sleep(gym.Wrapper):
    """Makes every ``step`` take ``seconds`` (>= 0, else ValueError) longer: a stand-in for a slow simulator, e.g.
    ``env.wrappers=[{_target_: reverie.envs.testing.Sleep, seconds: 0.05}]`` (bench/async_collect.py)."""

    def __init__(self, env: gym.Env, seconds: float = 0.01):
        super().__init__(env)
        if seconds < 0:
            raise ValueError(f"Sleep seconds must be >= 0, got {seconds}")
        self.seconds = float(seconds)

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


class FlakyEnv(gym.Env):
    """A simulator that crashes: obs ``{"vector": [offset + step]}``, reward 1, never ends; ``step`` raises
    ``RuntimeError`` from its ``fail_at``-th call on (over the env's life). For ``train.env_retries`` tests."""

    def __init__(self, fail_at=None, offset=0):
        self.observation_space = spaces.Dict({"vector": spaces.Box(-np.inf, np.inf, (1,), np.float32)})
        self.action_space = spaces.Discrete(2)
        self.fail_at, self.offset, self.calls, self.t = fail_at, offset, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"vector": np.array([self.offset], np.float32)}, {}

    def step(self, action):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("simulator crashed")
        self.t += 1
        return {"vector": np.array([self.offset + self.t], np.float32)}, 1.0, False, False, {}


def cartpole_balance(obs: dict) -> np.ndarray:
    """A scripted CartPole-v1 controller for ``reverie record --policy``: push towards the side the pole falls to;
    ``obs["vector"]`` ``(N, 4)`` (x, x_dot, theta, theta_dot) -> ``(N,)`` action indices."""
    vector = np.asarray(obs["vector"])
    return (vector[:, 2] + vector[:, 3] > 0).astype(np.int64)
