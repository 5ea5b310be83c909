"""One training run's objects and bookkeeping, for the loops of :mod:`reverie.train`, :mod:`reverie.loop.collector`
and :mod:`reverie.pretrain`: envs, agent, replay, logger and :class:`LoopState`, with the loop's steps as methods.

Offline (``reverie pretrain``, docs/offline.md) no env is stepped, the replay comes from a dataset and the run's step
counts updates. Data parallel: every rank runs the same loop on its own envs and replay shard; the updates owed are
rank 0's count, stop and interrupt flags are agreed once per step, and rank 0 alone evaluates, reports and writes
the checkpoint with the agent (:mod:`reverie.state.ranks`). Building, starting, reporting, checkpoint payloads and
signals live in the ``session_*`` modules.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from reverie.agents.base import UpdateResult
from reverie.configs.compose import variant
from reverie.loop.evaluate import stop_target
from reverie.loop.progress import Progress
from reverie.loop.session_build import NoEnvs, SessionBuild, random_actions
from reverie.loop.session_checkpoint import SessionCheckpoint
from reverie.loop.session_report import SessionReport
from reverie.loop.session_signals import SessionSignals
from reverie.loop.session_start import SessionStart
from reverie.loop.state import LoopState
from reverie.replay.cycle import make_schedule
from reverie.runtime import collectives
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.runtime.process_group import DistInfo, rank_seed
from reverie.runtime.signals import SignalFlag
from reverie.runtime.threads import choose_threads
from reverie.state.checkpoint import BEST_FILE
from reverie.state.resume import resume_command, write_summary
from reverie.state.rng import seed_everything

__all__ = ["NoEnvs", "Session", "random_actions"]


class Session(SessionBuild, SessionStart, SessionReport, SessionCheckpoint, SessionSignals):
    """A run being trained: built (and restored from ``saved``, a checkpoint payload) by the constructor.

    The loops read ``cfg``, ``info``, ``agent``, ``replay``, ``stepper``, ``logger``, ``loop``, ``row`` (the envs'
    current row ``(N, ...)``), ``act_state``, ``diverged``, ``interrupted``, ``step`` and ``steps``. ``offline``: a
    ``reverie pretrain`` run (``cfg.pretrain`` gives its length and clocks); ``dataset``: a validated
    :class:`reverie.data.Dataset` for a fresh run's replay (None: read from ``cfg.pretrain.data`` or the
    ``init_from`` run when needed).
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, info: DistInfo, saved: dict | None, offline: bool = False,
                 dataset: Any = None):
        self.cfg, self.run_dir, self.info, self.saved, self.offline = cfg, run_dir, info, saved, offline
        tc = cfg.train
        counted = cfg.pretrain if offline else tc  # the run's length and clocks: updates offline, else env steps
        self.seed = rank_seed(cfg.seed, info.rank)  # the run seed itself on rank 0
        seed_everything(self.seed)
        threads, why = choose_threads(cfg.get("threads"), info.world_size)
        torch.set_num_threads(threads)
        if info.is_main:
            print(f"[reverie] threads: {threads} ({why})")
        if str(cfg.device).startswith("cpu") and cfg.get("cpu_keep_freed_memory", True):
            keep_freed_memory()  # no page faults on every big tensor (reverie/runtime/cpu_memory.py)
        self.stop_target = stop_target(tc, cfg.env)  # train.stop_return as a number (solved: the env's threshold)
        self.steps = int(counted.updates if offline else tc.steps)
        self.prefill = 0 if offline else int(cfg.init.prefill if cfg.get("init_from") else tc.prefill)
        self.eval_episodes = int(counted.eval_episodes)
        self.batch = (int(cfg.agent.batch_size), int(cfg.agent.batch_length))  # B, T
        self.keep = int(tc.get("checkpoint_keep", 2))
        self.repeat = int(cfg.env.get("action_repeat", 1) or 1)
        self.max_bad = int(tc.get("max_nonfinite_updates", 20))
        self.overlap = bool(tc.get("async_collect", False))
        self.dataset_steps = None if dataset is None else int(dataset.steps)  # a fresh pretrain's replay: just these
        self._build_envs()
        self._build_agent_and_replay()
        self.imagine = getattr(self.agent, "imagine_batch", None)  # (N, C + 1): agent=storm's imagination contexts
        self._build_logger()
        every = {"log": counted.log_every, "eval": counted.eval_every, "checkpoint": counted.checkpoint_every,
                 "report": counted.get("report_every", 0)}
        self.loop = LoopState.create(make_schedule(cfg.agent), self.seed, every)
        self._update = self._update_path()
        self.heldout = None  # offline: the held-out data's replay (pretrain.heldout)
        self.row, self.act_state, self._step = None, None, None
        self.row_latent: dict[str, np.ndarray] = {}  # what act() computed for the row add_and_step adds
        self.diverged = self.interrupted = False
        self.stopped_by: str | None = None  # "stop_return" | "max_minutes": what ended the run before its length
        self.bad_in_row, self.written = 0, -1  # updates skipped in a row; env step of the last metrics row
        self.quality: dict[str, float] = {}  # the last open-loop report's prediction quality (summary.json)
        self.progress: Progress | None = None
        self._flag: SignalFlag | None = None  # several ranks: the signal flag they agree on (see running)
        self._first_update = True
        trained = "world model and behavior" if self._update == self.agent.update else "world model"
        length = (f"{self.steps} updates ({trained}), no env steps" if offline
                  else f"{self.loop.schedule} ({self.steps} env steps, prefill {self.prefill})")
        if info.is_main:  # data parallel: rank 0 speaks for the run
            print(f"[reverie] {self.n} env(s) x {self.spec}; obs {self.obs_shapes}; batch {self.batch[0]}x"
                  f"{self.batch[1]}, {length}; run dir {run_dir}")
        changed = variant(cfg)
        if changed and info.is_main:
            print(f"[reverie] agent {cfg.agent.name} with " + ", ".join(f"{what} {text}" for _, what, text in changed))
        if not offline and self.prefill >= self.steps:
            print(f"[reverie] warning: prefill {self.prefill} >= {self.steps} env steps: this run only collects random "
                  f"actions and never updates; lower train.prefill or raise train.steps", file=sys.stderr)
        if saved is not None:
            self._restore(saved)
        else:
            self._start(dataset)
        if offline and cfg.pretrain.get("heldout"):
            from reverie.data import load_dataset
            from reverie.data.heldout import heldout_replay

            self.heldout = heldout_replay(load_dataset(cfg.pretrain.heldout, cfg.env))
        if self.row is None and not offline:
            self.row, self.act_state = self.stepper.reset(), None

    @property
    def step(self) -> int:
        """The run's step, the x axis of its clocks, metric rows and checkpoints: env steps (updates offline)."""
        return self.loop.updates if self.offline else self.loop.env_steps

    # ------------------------------------------------------------------------------------------- loop steps
    def random_action(self) -> np.ndarray:
        """Uniform random actions ``(N, A)`` from the loop's generator (prefill)."""
        return random_actions(self.loop.rng, self.spec, self.n)

    def act(self) -> np.ndarray:
        """The action for the current row ``(N, A)``: random during prefill, then the agent's exploration policy."""
        self.row_latent = {}  # the row's stored latent (replay context): none for random actions
        if self.loop.env_steps < self.prefill:
            return self.random_action()
        action, self.act_state = self.agent.act(self.row, self.act_state, "explore")
        if self.context:
            self.row_latent = self.agent.replay_latent(self.act_state)
        return action

    def add_and_step(self, action: np.ndarray) -> None:
        """Add row ``t`` = (obs_t, reward_t, flags_t, action_t) to replay and step the envs with ``action``. With
        ``train.async_collect`` the envs step in their processes until :meth:`collected`; the updates between read
        only rows up to ``t``, already in replay, so the run is the same with the switch on or off."""
        self.replay.add({**self.row, "action": action, **self.row_latent})
        self.row_latent = {}
        if self.overlap:
            self.stepper.step_async(action)
        else:
            self._step = self.stepper.step(action)
        self.loop.env_steps += self.n
        if not self.overlap:
            self._collect(*self._step)

    def collected(self) -> None:
        """Wait for an env step in flight (``train.async_collect``) and take its row and finished episodes."""
        if self.stepper.in_flight:
            self._collect(*self.stepper.step_wait())

    def _collect(self, row: dict[str, np.ndarray], finished: list[dict]) -> None:
        self.row = row
        for ep in finished:
            self.episode(ep, self.loop.env_steps)

    def episode(self, ep: dict, step: int) -> None:
        """Count and log a finished training episode (``{"return", "length"}``) at env step ``step``."""
        self.loop.last_return, self.loop.episodes = ep["return"], self.loop.episodes + 1
        self.logger.episode(step, step * self.repeat, ep["return"], ep["length"], mode="train")

    def learning(self) -> bool:
        """True once the prefill is done and replay holds more than one sequence of ``batch_length`` rows (and of the
        agent's imagination contexts, ``imagine_batch``)."""
        rows = max(self.batch[1] + self.context, self.imagine[1] if self.imagine else 0)
        return self.loop.env_steps >= self.prefill and self.replay.num_rows > rows

    def owed(self) -> int:
        """The updates the schedule owes for the env steps (and episodes) just collected: rank 0's count on every
        rank, so an episode-counting schedule (PlaNet) runs the same updates everywhere."""
        finished = 0 if self.overlap else len(self._step[1])  # episodes: PlaNet only (no async_collect there)
        return collectives.broadcast_int(self.loop.schedule(self.n, finished), self.info)

    def sample(self) -> dict[str, np.ndarray]:
        """A training batch ``(T + context, B, ...)``: fresh windows of the online queue first
        (``agent.replay_online``), with each window's column and start (``replay_column``, ``replay_start``) when the
        agent has replay context."""
        B, T = self.batch
        batch = self.replay.sample(B, T + self.context, online=self.online, index=bool(self.context))
        if self.imagine:
            batch["imagine"] = self.replay.sample(*self.imagine)
        return batch

    def update_once(self, batch: dict[str, np.ndarray] | None = None) -> bool:
        """One agent update (``update``, or offline ``update_model``) on ``batch`` (default: a fresh sample), logged;
        True once ``train.max_nonfinite_updates`` updates in a row skipped their (non-finite) optimiser step."""
        first = self._first_update and self.progress is not None
        if first:  # this process's first update compiles and allocates: say so while it runs
            self.progress.status("first update (compiling/allocating)...")
        batch = self.sample() if batch is None else batch
        result = UpdateResult.of(self._update(batch))
        self.write_back(batch, result.replay_writes)
        if first:
            self.progress.status(None)  # the estimate counts from here
        self._first_update = False
        self.logger.scalars(result)
        self.loop.updates += 1
        if result.skipped <= 0:  # the guard: a non-finite loss or gradient changed nothing
            self.bad_in_row = 0
            return False
        self.loop.skipped, self.bad_in_row = self.loop.skipped + 1, self.bad_in_row + 1
        warnings.warn(f"update {self.loop.updates}: non-finite loss or gradient, optimiser step(s) skipped "
                      f"({self.bad_in_row} in a row, {self.loop.skipped} in total)", RuntimeWarning)
        if 0 < self.max_bad <= self.bad_in_row:
            self.diverged = True
            print(f"[reverie] stopping: {self.bad_in_row} updates in a row had non-finite losses or gradients "
                  f"(train.max_nonfinite_updates={self.max_bad}); the checkpoint holds the last finite model")
        return self.diverged

    def write_back(self, batch: dict[str, np.ndarray], writes: dict[str, np.ndarray] | None) -> None:
        """After an update with replay context: write the posteriors of the window's trained rows into the rows they
        came from (official ``replay.update(outs['replay'])``, ``embodied/run/train.py:79-80``); rows overwritten
        since the sample are skipped."""
        if self.context and writes is not None and "replay_start" in batch:
            with self.replay_lock:
                self.replay.write(batch["replay_column"], batch["replay_start"] + self.context, writes)

    def stop_reason(self, reached: bool) -> None:
        """Record why the run stops early (``stopped_by`` in ``summary.json``): ``reached`` (``train.stop_return``),
        else ``train.max_minutes`` spent (online runs only)."""
        if self.stopped_by is None:
            if reached:
                self.stopped_by = "stop_return"
            elif not self.offline and self.loop.out_of_time(self.cfg.train.max_minutes):
                self.stopped_by = "max_minutes"

    def target_reached(self) -> bool:
        """After an evaluation: True when the last ``train.stop_evals`` evaluations reached ``train.stop_return``
        and, with ``train.stop_confirm`` episodes, a confirmation evaluation of that many episodes did too
        (:meth:`confirm`; Gymnasium's "solved" is the mean over 100 consecutive episodes)."""
        tc = self.cfg.train
        in_a_row = int(tc.get("stop_evals", 1))
        if not self.loop.reached(self.stop_target, in_a_row):
            return False
        episodes = int(tc.get("stop_confirm", 0) or 0)
        if episodes:
            return self.confirm(episodes)
        print(f"[reverie] env step {self.step:,}: eval return {self.loop.evals[-1][2]:.1f} >= train.stop_return "
              f"{self.stop_target:g}" + (f" at {in_a_row} evaluations in a row" if in_a_row > 1 else "")
              + ": stopping", flush=True)
        return True

    def tick(self) -> bool:
        """After an env step (an update offline): stop on divergence; evaluate, log and checkpoint on their clocks;
        True when the run stops (``train.stop_return`` reached at ``train.stop_evals`` evaluations in a row,
        ``train.max_minutes`` spent, a signal on any rank, or divergence)."""
        if self.diverged:
            return True
        loop, clocks, tc, step = self.loop, self.loop.clocks, self.cfg.train, self.step
        stop = False
        if clocks["eval"](step) and self.eval_episodes and self.info.is_main:  # the others wait at `agree`
            self.evaluate()
            stop = self.target_reached()
        self.stop_reason(stop)
        stop = stop or self.stopped_by is not None
        if clocks["log"](step) or stop:
            self.write_metrics()
        if clocks["checkpoint"](step):
            self.checkpoint()
        self.show_progress()
        return self.agree_stop(stop)

    # ------------------------------------------------------------------------------------------------- finish
    def finish(self) -> dict[str, Any]:
        """The end of the run: a final evaluation (unless the last step just had one), metrics, checkpoint, video,
        ``summary.json`` (uninterrupted finishes only), the resume command of an interrupted run; returns the
        summary (see :func:`reverie.train.train`)."""
        cfg, info, loop = self.cfg, self.info, self.loop
        stopped = self.interrupted or self.diverged
        evaluated = loop.evals and loop.evals[-1][0] == self.step
        if not stopped and not evaluated and self.eval_episodes and info.is_main:
            print(f"[reverie] final evaluation: {self.eval_episodes} episode(s)", flush=True)
            self.evaluate()
        final = loop.evals[-1][2] if loop.evals else float("nan")
        if self.logger.pending or self.written != self.step:  # no second, empty row after the loop's own
            self.write_metrics()
        self.checkpoint()
        if cfg.train.video and self.eval_episodes and not stopped and info.is_main:
            self.final_video()
        self.stepper.close()
        self.logger.close()
        wall, best = loop.wall_s(), loop.best_eval()
        summary = {"env_steps": loop.env_steps, "updates": loop.updates, "eval_return": final, "evals": loop.evals,
                   "wall_s": wall, "best_eval_step": None if best is None else best[0],
                   "best_eval_return": float("nan") if best is None else best[1],
                   "interrupted": self.interrupted, "diverged": self.diverged, "stopped_by": self.stopped_by,
                   "resumed_from": None if self.saved is None else self.saved["counters"]["updates" if self.offline
                                                                                        else "env_steps"]}
        summary |= self.quality  # the last open-loop report's prediction quality (a sweep objective)
        if not stopped and info.is_main:
            write_summary(self.run_dir, summary)  # the completion marker: this run (or sweep trial) is finished
        outcome = "interrupted" if self.interrupted else "diverged" if self.diverged else "done"
        if outcome == "done" and self.stopped_by == "max_minutes":
            outcome = f"done (train.max_minutes={cfg.train.max_minutes:g} spent)"
        where = "update" if self.offline else "env step"
        kept = f" (best {best[1]:.1f} at {where} {best[0]:,}: checkpoints/{BEST_FILE})" if best is not None else ""
        last = f"last eval return {final:.1f}" if np.isfinite(final) else "no evaluation yet"
        if info.is_main:  # rank 0 evaluates: its line is the run's (the other ranks hold no evaluation)
            print(f"[reverie] {outcome}: {loop.env_steps} env steps, {loop.updates} updates, {last}{kept}, "
                  f"{wall / 60:.2f} min; run dir {self.run_dir}")
        if self.interrupted and info.is_main:
            command = "pretrain" if self.offline else "train"
            print(f"[reverie] resume this run with: {resume_command(self.run_dir, command=command)}", flush=True)
        return summary
