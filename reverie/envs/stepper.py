"""Turn a NEXT_STEP Gymnasium vector env into contract rows (one row per env per call) and episode stats."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from reverie.envs.factory import action_spec, to_env_action
from reverie.types import ActionSpec


class VectorStepper:
    """Steps ``N`` envs and returns contract rows: obs keys + ``reward``, ``is_first``, ``is_last``, ``is_terminal``.

    Row semantics per env (DESIGN.md section 2, ``reverie.types``):

    - ``reset()``: the reset observation, reward 0, ``is_first`` True, ``is_last``/``is_terminal`` False.
    - ``step(action)`` after a row with ``is_last``: the env ignores the action and the row is the reset
      observation, reward 0, ``is_first`` True, ``is_last``/``is_terminal`` False.
    - ``step(action)`` otherwise: the new observation (the TRUE final one when the episode ends), the env's
      reward, ``is_first`` False, ``is_terminal`` = terminated (or the env's ``info["is_terminal"]``, an MDP end
      that does not end the episode, e.g. a lost Atari life with ``life_loss=terminal``), ``is_last`` =
      terminated or truncated.

    The caller adds ``action`` ``(N, A)`` (the action it then passes to ``step``) to the row before
    ``Replay.add``, so row ``t`` holds ``obs_t`` and ``action_t`` as the timing diagram says.

    Args:
        env: a vector env built with ``autoreset_mode=AutoresetMode.NEXT_STEP``
            (:func:`reverie.envs.factory.make_vector_env`) and dict observations.

    Raises:
        ValueError: the vector env uses another autoreset mode.
    """

    def __init__(self, env: gym.vector.VectorEnv):
        mode = env.metadata.get("autoreset_mode")
        if mode != gym.vector.AutoresetMode.NEXT_STEP:
            raise ValueError(
                f"VectorStepper needs a vector env with autoreset_mode=AutoresetMode.NEXT_STEP, got {mode!r}; "
                "build it with reverie.envs.make_vector_env"
            )
        self.env = env
        self.num_envs: int = env.num_envs
        self.action_spec: ActionSpec = action_spec(env.single_action_space)
        self._last: np.ndarray | None = None  # (N,) bool: previous row had is_last
        self._return = np.zeros(self.num_envs, np.float64)  # (N,) running episode return
        self._length = np.zeros(self.num_envs, np.int64)  # (N,) running episode length in agent steps

    def _row(self, obs: dict, reward, is_first, is_last, is_terminal) -> dict[str, np.ndarray]:
        row = {key: np.asarray(value) for key, value in obs.items()}
        row["reward"] = np.asarray(reward, np.float32)
        row["is_first"] = np.asarray(is_first, bool)
        row["is_last"] = np.asarray(is_last, bool)
        row["is_terminal"] = np.asarray(is_terminal, bool)
        return row

    def reset(self) -> dict[str, np.ndarray]:
        """Reset all envs.

        Returns:
            ``{obs keys: (N, ...), reward: (N,) float32 zeros, is_first: (N,) True, is_last/is_terminal: (N,) False}``.
        """
        obs, _ = self.env.reset()
        n = self.num_envs
        self._last = np.zeros(n, bool)
        self._return[:] = 0.0
        self._length[:] = 0
        return self._row(obs, np.zeros(n), np.ones(n, bool), np.zeros(n, bool), np.zeros(n, bool))

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], list[dict]]:
        """Send model actions to the envs and return the next row.

        Args:
            action: ``(N, A)`` float32 model actions (one-hot for Discrete, ``[-1, 1]`` for Box);
                converted with :func:`reverie.envs.factory.to_env_action`.

        Returns:
            ``(row, episodes)``: ``row`` as in :meth:`reset` (see the class docstring for the flags), and
            ``episodes``, one ``{"env": i, "return": float, "length": int}`` per episode that ended on this
            call (``length`` in agent steps, ``return`` the exact float64 sum of its rewards).

        Raises:
            RuntimeError: ``reset()`` was not called first.
            ValueError: ``action`` is not ``(N, A)``.
        """
        if self._last is None:
            raise RuntimeError("VectorStepper.step() called before reset(); call reset() first")
        action = np.asarray(action)
        if action.shape[0] != self.num_envs:
            raise ValueError(f"actions must have shape ({self.num_envs}, {self.action_spec.dim}), got {action.shape}")
        obs, reward, terminated, truncated, info = self.env.step(to_env_action(action, self.action_spec))
        is_first = self._last.copy()
        reward = np.where(is_first, 0.0, np.asarray(reward, np.float64))
        is_last = (np.asarray(terminated, bool) | np.asarray(truncated, bool)) & ~is_first
        # info["is_terminal"]: an MDP end that does not end the episode (Atari life_loss=terminal)
        is_terminal = (np.asarray(terminated, bool) | np.asarray(info.get("is_terminal", False), bool)) & ~is_first

        self._return = np.where(is_first, 0.0, self._return + reward)
        self._length = np.where(is_first, 0, self._length + 1)
        episodes = [
            {"env": int(i), "return": float(self._return[i]), "length": int(self._length[i])}
            for i in np.flatnonzero(is_last)
        ]
        self._last = is_last
        return self._row(obs, reward, is_first, is_last, is_terminal), episodes

    def close(self) -> None:
        """Close the vector env."""
        self.env.close()
