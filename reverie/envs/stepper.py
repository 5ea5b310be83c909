"""Turn a NEXT_STEP Gymnasium vector env into contract rows (one row per env per call) and episode stats."""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces

from reverie.envs.factory import action_spec, to_env_action
from reverie.types import ActionSpec


class _Filled(NamedTuple):
    """An array whose elements are all ``value``: pickled as this, filled again on load."""

    dtype: np.dtype
    shape: tuple[int, ...]
    value: Any

    @classmethod
    def of(cls, array: Any) -> Any:
        """``array`` as a :class:`_Filled` if an ndarray of 2+ elements, all equal and not NaN; else ``array``."""
        if not isinstance(array, np.ndarray) or array.size < 2:
            return array
        flat = array.reshape(-1)
        if flat.dtype.kind == "f" and np.isnan(flat[0]) or not np.all(flat == flat[0]):
            return array
        return cls(array.dtype, array.shape, flat[0].item())


def _full_box(state: dict[str, Any]) -> spaces.Box:
    """Unpickle a ``Box`` written by :class:`_EnvPickler`: its attributes, the uniform arrays filled again."""
    box = spaces.Box.__new__(spaces.Box)
    box.__dict__.update({key: np.full(value.shape, value.value, value.dtype) if isinstance(value, _Filled) else value
                         for key, value in state.items()})
    return box


def _reduce_atari(env: Any) -> tuple:
    from reverie.envs.atari import reduce_atari_env

    return reduce_atari_env(env)


COMPACT_REDUCERS: dict[str, Callable[[Any], tuple]] = {"ale_py.env.AtariEnv": _reduce_atari}
"""``"module.Class"`` -> ``reduce(obj)`` (a ``__reduce__`` tuple) for simulators whose own pickling is too large or
loses state; :class:`_EnvPickler` uses it for objects of exactly that class. (DMC's env pickles compactly by
itself: :meth:`reverie.envs.dmc.DMCEnv.__getstate__`.)"""


class _EnvPickler(cloudpickle.Pickler):
    """cloudpickle for checkpoints: a ``Box`` whose bounds hold one value is written as that value and its shape (a
    64x64x3 image space: 49 KB -> under 1 KB); a class in :data:`COMPACT_REDUCERS` as its compact state."""

    def reducer_override(self, obj):
        kind = type(obj)
        if kind is spaces.Box:
            return _full_box, ({key: _Filled.of(value) for key, value in obj.__dict__.items()},)
        reduce = COMPACT_REDUCERS.get(f"{kind.__module__}.{kind.__qualname__}")
        if reduce is not None:
            return reduce(obj)
        return super().reducer_override(obj)


def dumps_envs(env: Any) -> bytes:
    """``env`` pickled by :class:`_EnvPickler` (read back with ``cloudpickle.loads``); raises what pickling raises
    (e.g. ``TypeError`` for a simulator handle that does not pickle)."""
    buffer = io.BytesIO()
    _EnvPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(env)
    return buffer.getvalue()


class VectorStepper:
    """Steps ``N`` envs and returns contract rows: obs keys ``(N, ...)``, ``reward`` and the flags ``(N,)``.

    Per env (:mod:`reverie.types`): ``reset()`` and the step after an ``is_last`` row (its action ignored) give the
    reset observation, reward 0, ``is_first``; other steps the new (true final) observation and reward,
    ``is_terminal`` = terminated or ``info["is_terminal"]`` (e.g. Atari ``life_loss=terminal``), ``is_last`` =
    terminated or truncated. The caller adds ``action`` ``(N, A)`` before ``Replay.add`` (row ``t``: ``obs_t``,
    ``action_t``). When ``env.step`` raises and ``make`` is given, all copies are rebuilt with ``make(restart_index)``
    and the row closes every episode as a truncation (not in ``episodes``); the next call returns the reset row; more
    than ``max_restarts`` (``train.env_retries``) failures in a row raise. ValueError: ``env``'s autoreset mode is not
    NEXT_STEP (:func:`reverie.envs.factory.make_vector_env`).
    """

    def __init__(self, env: gym.vector.VectorEnv, make: Callable[[int], gym.vector.VectorEnv] | None = None,
                 max_restarts: int = 3):
        self.make, self.max_restarts = make, int(max_restarts)
        self.restarts = 0  # env rebuilds so far
        self._failures = 0  # consecutive failed steps
        self._pending: dict[str, np.ndarray] | None = None  # reset row of a rebuilt env, returned next call
        self._obs: dict[str, np.ndarray] | None = None  # last observation (N, ...) per key
        self._in_flight = False  # between step_async and step_wait
        self._deferred: np.ndarray | None = None  # env action of a step that runs in step_wait (no step_async)
        self._send_error: Exception | None = None  # step_async failed: step_wait restarts or re-raises
        self._check(env)
        self._set_env(env)

    @staticmethod
    def _check(env: gym.vector.VectorEnv) -> None:
        mode = env.metadata.get("autoreset_mode")
        if mode != gym.vector.AutoresetMode.NEXT_STEP:
            raise ValueError(
                f"VectorStepper needs a vector env with autoreset_mode=AutoresetMode.NEXT_STEP, got {mode!r}; "
                "build it with reverie.envs.make_vector_env"
            )

    def _set_env(self, env: gym.vector.VectorEnv) -> None:
        self.env = env
        self.num_envs: int = env.num_envs
        self.action_spec: ActionSpec = action_spec(env.single_action_space)
        self._last: np.ndarray | None = None  # (N,) bool: previous row had is_last
        self._return = np.zeros(self.num_envs, np.float64)  # (N,) running episode return
        self._length = np.zeros(self.num_envs, np.int64)  # (N,) running episode length in agent steps

    def _row(self, obs: dict, reward, is_first, is_last, is_terminal) -> dict[str, np.ndarray]:
        row = {key: np.asarray(value) for key, value in obs.items()}
        self._obs = {key: value.copy() for key, value in row.items()}
        row["reward"] = np.asarray(reward, np.float32)
        row["is_first"] = np.asarray(is_first, bool)
        row["is_last"] = np.asarray(is_last, bool)
        row["is_terminal"] = np.asarray(is_terminal, bool)
        return row

    def reset(self) -> dict[str, np.ndarray]:
        """Reset all envs: the reset observations, reward 0, ``is_first`` True, ``is_last``/``is_terminal`` False."""
        self._refuse_in_flight("reset")
        obs, _ = self.env.reset()
        self._pending = None
        n = self.num_envs
        self._last = np.zeros(n, bool)
        self._return[:] = 0.0
        self._length[:] = 0
        return self._row(obs, np.zeros(n), np.ones(n, bool), np.zeros(n, bool), np.zeros(n, bool))

    @property
    def overlaps(self) -> bool:
        """True when :meth:`step_async` returns while the envs still step (``AsyncVectorEnv``), False when the step
        runs in :meth:`step_wait` (``SyncVectorEnv``, batched backends)."""
        return callable(getattr(self.env, "step_async", None)) and callable(getattr(self.env, "step_wait", None))

    @property
    def in_flight(self) -> bool:
        """True between :meth:`step_async` and :meth:`step_wait`."""
        return self._in_flight

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], list[dict]]:
        """:meth:`step_async` then :meth:`step_wait`: ``action`` ``(N, A)`` float32 model actions (one-hot or in
        ``[-1, 1]``) -> ``(row, episodes)``, one ``{"env": i, "return": float, "length": int}`` (agent steps; exact
        float64 sum) per episode ended on this call. Raises RuntimeError before ``reset()`` or with a step in flight,
        ValueError for a wrong shape."""
        self.step_async(action)
        return self.step_wait()

    def step_async(self, action: np.ndarray) -> None:
        """Start stepping the envs with ``action`` ``(N, A)``; :meth:`step_wait` returns the row, exactly that of
        :meth:`step`. Only :attr:`overlaps` envs step meanwhile; a send failure is handled in :meth:`step_wait`.
        Raises as :meth:`step`."""
        if self._last is None:
            raise RuntimeError("VectorStepper.step() called before reset(); call reset() first")
        if self._in_flight:
            raise RuntimeError("VectorStepper.step_async() called while a step is in flight; call step_wait() first")
        action = np.asarray(action)
        if action.shape[0] != self.num_envs:
            raise ValueError(f"actions must have shape ({self.num_envs}, {self.action_spec.dim}), got {action.shape}")
        self._in_flight, self._deferred, self._send_error = True, None, None
        if self._pending is not None:  # the env was rebuilt on the previous call: nothing to send, action ignored
            return
        env_action = to_env_action(action, self.action_spec)
        if not self.overlaps:
            self._deferred = env_action
            return
        try:
            self.env.step_async(env_action)
        except Exception as err:  # noqa: BLE001 - handled in step_wait (restart or re-raise), like a step failure
            self._send_error = err

    def step_wait(self) -> tuple[dict[str, np.ndarray], list[dict]]:
        """Finish the step of :meth:`step_async`; ``(row, episodes)`` as :meth:`step`. RuntimeError: no step in flight,
        or the env failed more than ``max_restarts`` times in a row."""
        if not self._in_flight:
            raise RuntimeError("VectorStepper.step_wait() called with no step in flight; call step_async() first")
        self._in_flight = False
        deferred, send_error, self._deferred, self._send_error = self._deferred, self._send_error, None, None
        if self._pending is not None:  # the env was rebuilt on the previous call: its reset row, action ignored
            row, self._pending = self._pending, None
            self._obs = {key: value.copy() for key, value in row.items()}
            self._last = np.zeros(self.num_envs, bool)
            self._return[:] = 0.0
            self._length[:] = 0
            return row, []
        try:
            if send_error is not None:
                raise send_error
            if deferred is not None:
                obs, reward, terminated, truncated, info = self.env.step(deferred)
            else:
                obs, reward, terminated, truncated, info = self.env.step_wait()
        except Exception as err:  # noqa: BLE001 - any simulator failure: restart (bounded) or re-raise
            if self.make is None:
                raise
            return self._restart(err), []
        self._failures = 0
        is_first = self._last.copy()
        reward = np.where(is_first, 0.0, np.asarray(reward, np.float64))
        is_last = (np.asarray(terminated, bool) | np.asarray(truncated, bool)) & ~is_first
        is_terminal = (np.asarray(terminated, bool) | np.asarray(info.get("is_terminal", False), bool)) & ~is_first

        self._return = np.where(is_first, 0.0, self._return + reward)
        self._length = np.where(is_first, 0, self._length + 1)
        episodes = [
            {"env": int(i), "return": float(self._return[i]), "length": int(self._length[i])}
            for i in np.flatnonzero(is_last)
        ]
        self._last = is_last
        return self._row(obs, reward, is_first, is_last, is_terminal), episodes

    def _restart(self, err: Exception) -> dict[str, np.ndarray]:
        """Rebuild the env after ``err``; return the row closing every episode (a pending reset: a one-row episode)."""
        closing = {key: value.copy() for key, value in self._obs.items()}
        n = self.num_envs
        while True:
            self._failures += 1
            if self._failures > self.max_restarts:
                raise RuntimeError(f"the env failed {self._failures} times in a row (last error: "
                                   f"{type(err).__name__}: {err}); giving up after train.env_retries="
                                   f"{self.max_restarts} restarts") from err
            self.restarts += 1
            warnings.warn(f"env raised {type(err).__name__}: {err}; closing the episodes (is_last) and "
                          f"restarting the env (restart {self.restarts}, failure {self._failures} in a row)",
                          RuntimeWarning, stacklevel=3)
            try:
                self.env.close()
            except Exception:  # noqa: BLE001 - the broken env may not close cleanly; it is dropped anyway
                pass
            try:
                env = self.make(self.restarts)
                self._check(env)
                obs, _ = env.reset()
            except Exception as again:  # noqa: BLE001 - a failed rebuild counts as another failure
                err = again
                continue
            self.env = env
            break
        self._pending = None
        pending = self._row(obs, np.zeros(n), np.ones(n, bool), np.zeros(n, bool), np.zeros(n, bool))
        row = self._row(closing, np.zeros(n), self._last.copy(), np.ones(n, bool), np.zeros(n, bool))
        self._pending = pending
        self._last = np.ones(n, bool)
        return row

    def _refuse_in_flight(self, name: str) -> None:
        if self._in_flight:
            raise RuntimeError(f"VectorStepper.{name}() called while a step is in flight; call step_wait() first")

    def state_dict(self) -> dict[str, Any]:
        """Episode bookkeeping and, when the env is a ``SyncVectorEnv`` whose copies pickle (:func:`dumps_envs`; DMC
        and Atari as their compact state), the envs in ``"env"``, so :meth:`load_state_dict` continues every episode
        exactly; otherwise ``"env"`` is None and ``"np_random"`` holds each copy's generator where readable.
        RuntimeError: a step is in flight."""
        self._refuse_in_flight("state_dict")
        state: dict[str, Any] = {
            "last": self._last, "return": self._return.copy(), "length": self._length.copy(),
            "restarts": self.restarts, "pending": self._pending, "obs": self._obs, "env": None, "np_random": None,
        }
        if isinstance(self.env, gym.vector.SyncVectorEnv):
            try:
                state["env"] = dumps_envs(self.env)
            except Exception as err:  # noqa: BLE001 - not every simulator pickles; fall back to a restart
                state["env_error"] = f"{type(err).__name__}: {err}"
        if state["env"] is None:
            try:
                state["np_random"] = list(self.env.get_attr("np_random"))
            except Exception:  # noqa: BLE001 - best effort: the env RNGs then restart from the run seed
                state["np_random"] = None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore :meth:`state_dict`: True when the envs were restored exactly; False when the caller must
        :meth:`reset` (episodes in flight restart; saved RNGs kept where possible). RuntimeError: a step is in flight.
        """
        self._refuse_in_flight("load_state_dict")
        self.restarts = int(state.get("restarts", 0))
        if state.get("env") is not None:
            try:
                env = cloudpickle.loads(state["env"])
                self._check(env)
            except Exception as err:  # noqa: BLE001 - e.g. a simulator version change: restart instead
                warnings.warn(f"could not restore the saved envs ({type(err).__name__}: {err}); episodes in "
                              f"flight restart", RuntimeWarning, stacklevel=2)
            else:
                self.env.close()
                self._set_env(env)
                self._last = None if state["last"] is None else np.array(state["last"], bool)
                self._return = np.array(state["return"], np.float64)
                self._length = np.array(state["length"], np.int64)
                self._pending = state.get("pending")
                self._obs = state.get("obs")
                return True
        if state.get("np_random") is not None:
            try:
                self.env.set_attr("np_random", state["np_random"])
            except Exception:  # noqa: BLE001 - best effort, see state_dict
                pass
        return False

    def close(self) -> None:
        """Close the vector env (a step in flight is abandoned)."""
        self._in_flight, self._deferred, self._send_error = False, None, None
        self.env.close()
