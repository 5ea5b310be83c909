"""A collector thread that commands the envs at a fixed control rate while the learner trains (``train.control_hz``).

The thread owns the :class:`reverie.envs.stepper.VectorStepper` and a policy copy and, each ``1 / control_hz``
seconds, acts on row ``t``, adds it to replay and steps the envs; the main thread runs the updates the train_ratio
owes and refreshes the copy. ``replay_lock`` guards the replay (not thread-safe), ``policy_lock`` the copy and
``_state`` the counters; :meth:`Collector.paused` stops the thread at a step boundary so checkpoints and
evaluations see a consistent state. Not bit-reproducible (docs/speed.md, "A fixed control rate").
"""

from __future__ import annotations

import collections
import contextlib
import copy
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from reverie.runtime.compiling import EagerFallback
from reverie.envs.stepper import VectorStepper
from reverie.replay import Replay


def make_policy_copy(agent: Any) -> Any:
    """A second agent instance for acting: ``copy.deepcopy(agent)``, refreshed by :func:`sync_policy`.

    Compiled callables (:class:`reverie.runtime.compiling.EagerFallback` attributes) are set back to their eager
    methods in the copy: the compiled function would still call the learner's module, acting with the weights being
    trained in another thread. Raises RuntimeError when a compiled callable's eager method is not bound to the
    copied module, and whatever ``deepcopy`` raises.
    """
    policy = copy.deepcopy(agent)
    if isinstance(policy, torch.nn.Module):
        policy.requires_grad_(False)
        for module in policy.modules():
            for name, value in list(vars(module).items()):
                if isinstance(value, EagerFallback):
                    if getattr(value.eager, "__self__", None) is not module:
                        raise RuntimeError(f"make_policy_copy: the compiled {value.name!r} of the copy does not "
                                           f"belong to the copied module; set the agent's compile=false")
                    setattr(module, name, value.eager)
    return policy


@torch.no_grad()
def sync_policy(policy: Any, agent: Any) -> None:
    """Copy the learner's weights into the policy copy in place (parameters and buffers, no optimiser state; else
    ``load_state_dict``). Call it with the policy lock held."""
    if isinstance(agent, torch.nn.Module) and isinstance(policy, torch.nn.Module):
        for mine, theirs in zip(policy.parameters(), agent.parameters(), strict=True):
            mine.copy_(theirs)
        for mine, theirs in zip(policy.buffers(), agent.buffers(), strict=True):
            mine.copy_(theirs)
    else:
        policy.load_state_dict(agent.state_dict())


class Collector:
    """Steps ``stepper`` every ``1 / control_hz`` seconds in a background thread and adds the rows to ``replay``.

    Each step acts on the current ``row`` (``(N, ...)`` arrays; uniform ``random_action()`` while
    ``env_steps < prefill``, else ``policy.act(row, state, "explore")``), adds it with the action to replay and steps
    the envs. Steps count towards the train_ratio (``ratio_steps``) once ``env_steps >= prefill`` and replay holds
    more than ``batch_length`` rows, as in :func:`reverie.train.train`, so the learner owes exactly what the
    synchronous loop would. Collection stops at ``env_steps >= steps``. A step starting more than
    ``late_tolerance`` periods after its deadline is late; ``history`` start times are kept in ``step_starts``.
    Raises ValueError when ``control_hz`` is not a positive number.
    """

    def __init__(self, stepper: VectorStepper, replay: Replay, policy: Any, control_hz: float, *,
                 row: dict[str, np.ndarray], state: Any, env_steps: int, ratio_steps: int, steps: int, prefill: int,
                 batch_length: int, random_action: Callable[[], np.ndarray], late_tolerance: float = 0.1,
                 history: int = 10_000):
        if not control_hz or float(control_hz) <= 0:
            raise ValueError(f"train.control_hz must be a positive number of steps per second, got {control_hz!r}")
        self.stepper, self.replay, self.policy = stepper, replay, policy
        self.period = 1.0 / float(control_hz)  # seconds
        self.row, self.state = row, state
        self.env_steps, self.ratio_steps = int(env_steps), int(ratio_steps)
        self.steps, self.prefill, self.batch_length = int(steps), int(prefill), int(batch_length)
        self.random_action, self.late_tolerance = random_action, float(late_tolerance)
        self.late_steps = 0  # steps that started late (collect/late_steps)
        self.step_starts: collections.deque[float] = collections.deque(maxlen=history)  # monotonic seconds
        self.episodes: queue.Queue[dict] = queue.Queue()  # finished episodes, {"env", "return", "length", "step"}
        self.replay_lock, self.policy_lock = threading.Lock(), threading.Lock()
        self._state = threading.Condition()  # guards the counters, row/state and the pause handshake
        self._stop, self._resume = threading.Event(), threading.Event()
        self._wake = threading.Event()  # cuts the thread's sleep short when a pause or stop is asked for
        self._resume.set()
        self._at_boundary = False  # the thread is parked at a step boundary (paused or finished)
        self.error: BaseException | None = None  # what ended the thread, re-raised by check()
        self._thread = threading.Thread(target=self._run, name="reverie-collector", daemon=True)

    # --- main thread ---
    def start(self) -> None:
        """Start the collector thread."""
        self._thread.start()

    @property
    def done(self) -> bool:
        """True once the thread has ended (``steps`` reached, stopped, or failed: see :meth:`check`)."""
        return not self._thread.is_alive()

    def check(self) -> None:
        """Re-raise, in the caller's thread, the exception that ended the collector thread (if any)."""
        if self.error is not None:
            raise RuntimeError(f"the collector thread failed: {type(self.error).__name__}: {self.error}") \
                from self.error

    def counts(self) -> tuple[int, int, int]:
        """``(env_steps, ratio_steps, late_steps)`` as of the last finished step."""
        with self._state:
            return self.env_steps, self.ratio_steps, self.late_steps

    def wait(self, timeout: float) -> None:
        """Block until the next step finishes, the thread ends, or ``timeout`` seconds pass."""
        with self._state:
            if not self.done:
                self._state.wait(timeout)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the thread at a step boundary for the block; the schedule restarts after it (no lateness).
        Re-raises a collector failure."""
        self._resume.clear()
        self._wake.set()
        with self._state:
            while not self._at_boundary and not self.done:
                self._state.wait(0.05)
        try:
            self.check()
            yield
        finally:
            self._resume.set()

    def stop(self) -> None:
        """Stop at the next step boundary and join the thread (a step in progress finishes first)."""
        self._stop.set()
        self._resume.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    # --- collector thread ---
    def _run(self) -> None:
        try:
            deadline = time.monotonic()
            while not self._stop.is_set():
                if not self._resume.is_set() or self.env_steps >= self.steps:
                    if self.env_steps >= self.steps:
                        return
                    with self._state:
                        self._at_boundary = True
                        self._state.notify_all()
                    self._resume.wait()
                    with self._state:
                        self._at_boundary = False
                    deadline = time.monotonic()  # a pause is not lateness
                    continue
                now = time.monotonic()
                if now < deadline:
                    self._wake.clear()
                    if self._resume.is_set() and not self._stop.is_set():
                        self._wake.wait(deadline - now)
                    continue  # re-check stop and pause requests after sleeping
                start = time.monotonic()
                late = start - deadline > self.late_tolerance * self.period
                self._step(start, late)
                deadline = (start if late else deadline) + self.period
        except BaseException as err:  # noqa: BLE001 - surfaced in the main thread by check()
            self.error = err
        finally:
            with self._state:
                self._at_boundary = True
                self._state.notify_all()

    def _step(self, start: float, late: bool) -> None:
        row, state, latent = self.row, self.state, {}
        if self.env_steps < self.prefill:
            action = self.random_action()
        else:
            with self.policy_lock:
                action, state = self.policy.act(row, state, "explore")
                if hasattr(self.policy, "replay_latent"):  # the replay context's stored latent of this row
                    latent = self.policy.replay_latent(state)
        with self.replay_lock:
            self.replay.add({**row, "action": action, **latent})
            rows = self.replay.num_rows
        new_row, finished = self.stepper.step(action)
        with self._state:
            self.step_starts.append(start)
            self.late_steps += int(late)
            self.env_steps += self.stepper.num_envs
            if self.env_steps >= self.prefill and rows > self.batch_length:
                self.ratio_steps += self.stepper.num_envs
            self.row, self.state = new_row, state
            for ep in finished:
                self.episodes.put({**ep, "step": self.env_steps})
            self._state.notify_all()


def check_async_collect(cfg: DictConfig) -> None:
    """Refuse ``train.async_collect`` and ``train.control_hz`` settings that cannot work, from the config alone.

    ``async_collect`` needs ``env.vector_mode=async`` (raising rather than switching the mode keeps the saved config
    true to what ran, and the mode decides how a resume treats episodes in flight). ``control_hz`` must be positive,
    replaces ``async_collect`` rather than joining it, and needs ``trainer.nproc=1``. Neither serves
    ``agent.schedule=episodes`` (its updates wait for finished episodes). Raises ValueError for any of these and
    for ``train.policy_sync_every`` < 1.
    """
    control_hz = cfg.train.get("control_hz")
    if control_hz is not None:
        if isinstance(control_hz, bool) or not isinstance(control_hz, (int, float)) or control_hz <= 0:
            raise ValueError(f"train.control_hz must be a positive number of env steps per second (or null: off), "
                             f"got {control_hz!r}")
        if cfg.train.get("async_collect", False):
            raise ValueError("train.control_hz and train.async_collect=true both overlap collection with the updates; "
                             "a fixed control rate already steps the envs in its own thread: set "
                             "train.async_collect=false")
        if cfg.agent.get("schedule", "ratio") == "episodes":
            raise ValueError("train.control_hz cannot serve agent.schedule=episodes (its updates wait for finished "
                             "episodes, the collector never waits for the learner); use a train_ratio schedule or "
                             "set train.control_hz=null")
        if int(cfg.train.get("policy_sync_every", 1)) < 1:
            raise ValueError(f"train.policy_sync_every must be >= 1 (updates between policy-copy refreshes), got "
                             f"{cfg.train.policy_sync_every!r}")
        if int((cfg.get("trainer") or {}).get("nproc", 1) or 1) > 1:
            raise ValueError("train.control_hz drives one robot from one process; it cannot run with trainer.nproc > 1 "
                             "(each rank would start its own collector): set trainer.nproc=1")
    if not cfg.train.get("async_collect", False):
        return
    mode = cfg.env.get("vector_mode", "sync")
    if mode != "async":
        raise ValueError(f"train.async_collect=true steps the envs in background processes while the updates run, "
                         f"but env.vector_mode={mode!r} steps them in this process; set env.vector_mode=async "
                         f"(one process per env) or train.async_collect=false")
    if cfg.agent.get("schedule", "ratio") == "episodes":
        raise ValueError("train.async_collect=true cannot overlap agent.schedule=episodes (the updates owed depend on "
                         "the episodes the step ends, known only after it); set train.async_collect=false")


def run_with_collector(run: Any) -> None:
    """The training loop of ``run`` (a :class:`reverie.loop.session.Session`) at a fixed control rate.

    A :class:`Collector` thread acts every ``1 / control_hz`` seconds while this thread runs the updates the
    train_ratio owes (they may lag, never lead) and refreshes the copy every ``train.policy_sync_every`` updates.
    Evaluations and checkpoints pause the collector; updates still owed at a checkpoint are owed again on resume.
    """
    tc, loop, clocks = run.cfg.train, run.loop, run.loop.clocks
    collector = Collector(run.stepper, run.replay, make_policy_copy(run.agent), tc.control_hz, row=run.row,
                          state=run.act_state, env_steps=loop.env_steps, ratio_steps=loop.schedule.env_steps,
                          steps=run.steps, prefill=run.prefill, batch_length=run.batch[1] + run.context,  # + context
                          random_action=run.random_action)
    owed, since_sync, sync_every = 0, 0, max(1, int(tc.get("policy_sync_every", 1)))
    run.replay_lock = collector.replay_lock  # the write-back after each update (replay context)

    def catch_up() -> int:  # read the collector's counters and episodes; returns late steps
        nonlocal owed
        loop.env_steps, ratio_steps, late = collector.counts()
        owed += loop.schedule(ratio_steps - loop.schedule.env_steps)  # the updates the train_ratio owes (may lag)
        while not collector.episodes.empty():
            ep = collector.episodes.get()
            run.episode(ep, ep["step"])
        return late

    collector.start()
    try:
        while True:
            done = collector.done  # read before the counters, so a finished collector's are final
            collector.check()
            late = catch_up()
            if owed:  # one update, then the clocks again (the collector keeps stepping meanwhile)
                with collector.replay_lock:
                    batch = run.sample()
                run.update(batch)
                owed, since_sync = owed - 1, since_sync + 1
                if since_sync >= sync_every:  # train.policy_sync_every
                    with collector.policy_lock:
                        sync_policy(collector.policy, run.agent)
                    since_sync = 0
                if clocks["report"](loop.updates):
                    with collector.replay_lock:
                        run.write_report()
            elif not done:
                collector.wait(0.05)
            if run.diverged:
                break
            run.logger.scalar("collect/update_lag", owed)
            stop = False
            if clocks["eval"].due(loop.env_steps) or clocks["checkpoint"].due(loop.env_steps):
                with collector.paused():  # at a step boundary: no checkpoint holds a half-step
                    late = catch_up()
                    run.row, run.act_state = collector.row, collector.state
                    if clocks["eval"](loop.env_steps):
                        run.evaluate()
                        stop = run.target_reached()
                    if clocks["checkpoint"](loop.env_steps):
                        loop.schedule.updates -= owed  # the owed updates are owed again after a resume
                        run.checkpoint()
                        loop.schedule.updates += owed
            run.stop_reason(stop)
            stop = stop or run.stopped_by is not None
            if clocks["log"](loop.env_steps) or stop:
                run.logger.scalar("collect/late_steps", late)
                run.write_metrics()
            run.show_progress()
            if done and not owed and clocks["report"].every > 0 and clocks["report"].last != loop.updates:
                run.write_report()  # the end one
            if stop or (done and not owed):
                break
    finally:  # Ctrl-C, SIGTERM, divergence, stop_return or the end: stop at a step boundary
        collector.stop()
        catch_up()
        run.row, run.act_state = collector.row, collector.state
        loop.schedule.updates -= owed  # the final checkpoint owes what this run did not do
