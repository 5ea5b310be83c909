"""One training run's objects and bookkeeping, for the loop in :mod:`reverie.train` (and the collector's loop in
:mod:`reverie.loop.collector`, and the offline loop of :mod:`reverie.pretrain`): the envs, the agent, the replay, the
logger and the :class:`LoopState`, with the loop's steps as methods: act, step the envs, count the updates owed,
update, log / evaluate / checkpoint, finish.

Offline (``reverie pretrain``, docs/offline.md): no env is stepped, the replay is filled from a dataset, the run's
step (its length, clocks, metric rows and checkpoint names) counts updates instead of env steps, and an update is the
agent's world-model-only ``update_model`` unless ``pretrain.behavior``. A run started with ``init_from`` loads that
run's agent and (``init.keep_data``) its replay before collecting (:mod:`reverie.state.init_from`).

The data-parallel pieces stay in here: every rank runs the same loop on its own envs and replay shard; the updates
owed are rank 0's count (:func:`reverie.runtime.collectives.broadcast_int`), stop and interrupt flags are agreed
once per env step (:func:`reverie.runtime.collectives.agree`), rank 0 alone evaluates, reports and writes the run's
checkpoint with the agent (ranks > 0 keep their own state and the agent's digest, :mod:`reverie.state.ranks`).
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from reverie.agents.build import build_agent
from reverie.envs import action_spec, make_env, make_vector_env, write_env_metadata
from reverie.envs.stepper import VectorStepper
from reverie.logs.logger import Logger
from reverie.loop.evaluate import evaluate, record_episode
from reverie.loop.progress import Progress
from reverie.loop.state import LoopState
from reverie.replay import Replay
from reverie.replay.cycle import make_schedule
from reverie.runtime import collectives
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.runtime.process_group import DistInfo, rank_path, rank_seed
from reverie.runtime.signals import SignalFlag, sigterm_as_interrupt
from reverie.state import ranks
from reverie.state.checkpoint import BEST_FILE, save_best, save_checkpoint
from reverie.state.preflight import GIB, STEPS_BOUND, describe, preflight
from reverie.state.resume import resume_command, truncate_jsonl, write_summary
from reverie.state.rng import preserved_rng, seed_everything
from reverie.types import ActionSpec
from reverie.viz import report


class NoEnvs:
    """The stepper of an offline run (``reverie pretrain``): there are no envs to step, save or close."""

    restarts, in_flight = 0, False

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: Any) -> bool:
        return False  # nothing restored exactly (and no episode in flight)

    def close(self) -> None:
        pass


def random_actions(rng: np.random.Generator, spec: ActionSpec, n: int) -> np.ndarray:
    """Uniform random policy: one-hot ``(N, A)`` for discrete, ``U[-1, 1]^A`` for continuous. float32."""
    if spec.discrete:
        return np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=n)]
    return rng.uniform(-1.0, 1.0, size=(n, spec.dim)).astype(np.float32)


class Session:
    """A run being trained: built (and restored from ``saved``, a checkpoint payload) by the constructor.

    Attributes the loops read: ``cfg``, ``info``, ``agent``, ``replay``, ``stepper``, ``logger``, ``loop``
    (:class:`LoopState`), ``row`` (the envs' current row ``(N, ...)``), ``act_state`` (what ``agent.act``
    returned last), ``diverged``, ``interrupted``, ``step`` (the run's step: env steps, or updates offline) and
    ``steps`` (where the run stops).

    Args:
        offline: a ``reverie pretrain`` run (module docstring): ``cfg.pretrain`` gives its length and clocks.
        dataset: a validated :class:`reverie.data.Dataset` for a fresh run's replay (offline: the one to learn
            from; with ``init_from``: the replay to keep); None: read from ``cfg.pretrain.data`` (offline) or the
            ``init_from`` run (``init.keep_data``) when needed.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, info: DistInfo, saved: dict | None, offline: bool = False,
                 dataset: Any = None):
        self.cfg, self.run_dir, self.info, self.saved, self.offline = cfg, run_dir, info, saved, offline
        tc = cfg.train
        counted = cfg.pretrain if offline else tc  # the run's length and clocks: updates offline, else env steps
        self.seed = rank_seed(cfg.seed, info.rank)  # the run seed itself on rank 0
        seed_everything(self.seed)
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg.threads))
        if str(cfg.device).startswith("cpu") and cfg.get("cpu_keep_freed_memory", True):
            keep_freed_memory()  # no page faults on every big tensor (reverie/runtime/cpu_memory.py)
        self.steps = int(counted.updates if offline else tc.steps)
        self.prefill = 0 if offline else int(cfg.init.prefill if cfg.get("init_from") else tc.prefill)
        self.eval_episodes = int(counted.eval_episodes)
        self.batch = (int(cfg.agent.batch_size), int(cfg.agent.batch_length))  # B, T
        self.keep = int(tc.get("checkpoint_keep", 2))
        self.repeat = int(cfg.env.get("action_repeat", 1) or 1)
        self.max_bad = int(tc.get("max_nonfinite_updates", 20))
        self.overlap = bool(tc.get("async_collect", False))
        self._build_envs()
        self._build_agent_and_replay()
        self._build_logger()
        every = {"log": counted.log_every, "eval": counted.eval_every, "checkpoint": counted.checkpoint_every,
                 "report": counted.get("report_every", 0)}
        self.loop = LoopState.create(make_schedule(cfg.agent), self.seed, every)
        self._update = self._update_path()
        self.heldout = None  # offline: the held-out data's replay (pretrain.heldout)
        self.row, self.act_state, self._step = None, None, None
        self.row_latent: dict[str, np.ndarray] = {}  # what act() computed for the row add_and_step adds
        self.diverged = self.interrupted = False
        self.bad_in_row, self.written = 0, -1  # updates skipped in a row; env step of the last metrics row
        self.progress: Progress | None = None
        self._flag: SignalFlag | None = None  # several ranks: the signal flag they agree on (see running)
        self._first_update = True
        trained = "world model and behavior" if self._update == self.agent.update else "world model"
        length = (f"{self.steps} updates ({trained}), no env steps" if offline
                  else f"{self.loop.schedule} ({self.steps} env steps, prefill {self.prefill})")
        print(f"[reverie] {self.n} env(s) x {self.spec}; obs {self.obs_shapes}; batch {self.batch[0]}x"
              f"{self.batch[1]}, {length}; run dir {run_dir}")
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

    def _update_path(self) -> Any:
        """``agent.update``, or offline without ``pretrain.behavior`` the world-model-only ``agent.update_model``.

        Raises:
            ValueError: the agent has no ``update_model``.
        """
        if not self.offline or self.cfg.pretrain.behavior:
            return self.agent.update
        if not hasattr(self.agent, "update_model"):
            raise ValueError(f"{type(self.agent).__name__} has no world-model-only update (update_model, the Agent "
                             f"protocol's optional method); set pretrain.behavior=true to run its full update")
        return self.agent.update_model

    # ------------------------------------------------------------------------------------------------- build
    def _build_envs(self) -> None:
        cfg = self.cfg
        if self.offline:  # the spaces only, from one env copy; the replay keeps the online layout of N columns
            env = make_env(cfg.env, self.seed)
            self.obs_space, self.spec = env.observation_space, action_spec(env.action_space)
            env.close()
            self.stepper, self.n = NoEnvs(), int(cfg.env.get("num_envs", 1) or 1)
            self.obs_shapes = {k: tuple(s.shape) for k, s in self.obs_space.spaces.items()}
            return

        def make_envs(restart: int = 0):  # restarts after env failures get fresh seeds
            return make_vector_env(cfg.env, self.seed + 7919 * restart)

        self.stepper = VectorStepper(make_envs(), make=make_envs, max_restarts=int(cfg.train.get("env_retries", 3)))
        if self.overlap and not self.stepper.overlaps:
            kind = type(self.stepper.env).__name__
            self.stepper.close()
            raise ValueError(f"train.async_collect=true needs envs that step in the background (step_async/"
                             f"step_wait), but this env config built a {kind}, which has none (envpool's backend is "
                             f"not supported yet); use env.vector_mode=async with the Gymnasium backend, or "
                             f"train.async_collect=false")
        self.n, self.spec = self.stepper.num_envs, self.stepper.action_spec
        self.obs_space = self.stepper.env.single_observation_space
        self.obs_shapes = {k: tuple(s.shape) for k, s in self.obs_space.spaces.items()}

    def _build_agent_and_replay(self) -> None:
        cfg, info = self.cfg, self.info
        self.agent = build_agent(cfg.agent, self.obs_shapes, self.spec)
        collectives.broadcast_module(self.agent)  # replicas start equal: rank 0's initial weights
        replay_dir = str(rank_path(cfg.replay.directory or self.run_dir / "replay", info))  # this rank's shard
        spec = Replay.spec_for(self.obs_space, self.spec.dim)
        # the replay context (agent=dreamerv3_2025): each row's stored latent, absent (zeros) unless given
        latents = self.agent.replay_latent_spec() if hasattr(self.agent, "replay_latent_spec") else {}
        spec |= latents
        self.context = int(getattr(self.agent, "replay_context", 0) or 0)  # rows before the trained ones
        self.online = bool(cfg.agent.get("replay_online", False))  # the online queue (official replay.online)
        if cfg.replay.get("preflight", True):
            # a dataset (offline, or kept by init_from) may fill the replay beyond the env steps: count all of it
            dataset = bool(self.offline or cfg.get("init_from"))
            held = int(cfg.replay.capacity) if dataset else self.steps
            bound = "replay.capacity (a dataset may fill it)" if dataset else STEPS_BOUND
            fits = preflight(spec, int(cfg.replay.capacity), self.agent, cfg.replay.storage, replay_dir,
                             self.run_dir / "checkpoints", self.keep, steps=held, num_envs=self.n, bound=bound,
                             env_bytes=self._checkpoint_extra_bytes())
            if info.is_main:
                print(f"[reverie] disk: {describe(fits, bound)} under {self.run_dir / 'checkpoints'}; "
                      f"{fits['disk_free'] / GIB:.1f} GiB free")
        window = self.batch[1] + self.context  # official replay length: consec * batch_length + replay_context
        self.replay = Replay(int(cfg.replay.capacity), self.n, spec, storage=cfg.replay.storage,
                             directory=replay_dir, seed=self.seed, optional=tuple(latents),
                             online_window=window if self.online else 0)
        self.replay_lock: Any = contextlib.nullcontext()  # train.control_hz: the collector's lock (write-back)

    CHECKPOINT_REST_BYTES = 32 << 10
    """Bytes of a checkpoint's small parts, counted once in the estimate: random states (about 12 KB), config,
    counters, clocks, evaluation history, the policy's recurrent state."""

    def _checkpoint_extra_bytes(self) -> int:
        """What a checkpoint holds besides the replay and the agent, for the start-up estimate (issue 27): the
        stepper's state pickled now (the envs' compact state; measured, not guessed), plus three observation rows
        of ``N`` envs that are not filled yet before the first reset (the row not yet in replay, the stepper's last
        observation, the vector env's per-copy observations) and :attr:`CHECKPOINT_REST_BYTES`."""
        if isinstance(self.stepper, NoEnvs):
            return self.CHECKPOINT_REST_BYTES
        try:
            envs = len(pickle.dumps(self.stepper.state_dict(), protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 - an estimate: a state that does not pickle is saved without the envs
            envs = 0
        row = sum(int(np.prod(space.shape, dtype=np.int64)) * space.dtype.itemsize
                  for space in self.obs_space.spaces.values()) * self.n
        return envs + 3 * row + self.CHECKPOINT_REST_BYTES

    def _build_logger(self) -> None:
        cfg, info, saved = self.cfg, self.info, self.saved
        wandb_kwargs = {k: v for k, v in cfg.logger.items() if k != "backends"}
        # rows written after the checkpoint (all rows, when a run stopped before its first one) are collected again
        resume_step = 0 if saved is None else saved["counters"]["updates" if self.offline else "env_steps"]
        log_dir = self.run_dir if info.is_main else self.run_dir / f"rank{info.rank}"  # ranks > 0: jsonl files only
        for name in ("metrics.jsonl", "scores.jsonl"):
            truncate_jsonl(log_dir / name, resume_step)
        if saved is not None and saved.get("wandb_id") and "id" not in wandb_kwargs:
            wandb_kwargs["id"] = saved["wandb_id"]
        self.logger = Logger(log_dir, backends=list(cfg.logger.backends) if info.is_main else [],
                             config=OmegaConf.to_container(cfg, resolve=True), wandb_kwargs=wandb_kwargs,
                             purge_step=None if saved is None else resume_step + 1)
        if info.is_main:
            write_env_metadata(cfg.env, self.run_dir)  # env_metadata.json: protocol settings and simulator versions

    def _start(self, dataset: Any) -> None:
        """A fresh run: the ``init_from`` run's agent, then the replay filled with the dataset (offline: the one
        to learn from; with ``init_from`` and ``init.keep_data``: that run's replay)."""
        from reverie.data import fill_replay, load_dataset

        cfg = self.cfg
        if cfg.get("init_from"):
            from reverie.state.init_from import apply_init, load_init

            payload = load_init(cfg.init_from)
            loaded = apply_init(self.agent, payload, self.obs_shapes, self.spec)
            print(f"[reverie] init_from {cfg.init_from}: {', '.join(loaded)} from "
                  f"{Path(payload['checkpoint_path']).name}")
            if dataset is None and cfg.init.keep_data:
                dataset = load_dataset(cfg.init_from, cfg.env)
        elif self.offline and dataset is None:
            dataset = load_dataset(cfg.pretrain.data, cfg.env)
        if dataset is not None:
            filled = fill_replay(self.replay, dataset.episodes)
            left = filled["left_out"]
            ends = sum(int(np.asarray(e.rows["is_last"]).sum()) for e in dataset.episodes)  # finished episodes
            pieces = "" if ends == len(dataset.episodes) else f" in {len(dataset.episodes)} pieces"  # a run's columns
            print(f"[reverie] replay filled with {ends} finished episodes{pieces} of {dataset.source}: "
                  f"{filled['steps']} steps, {filled['rows_per_column']} rows per env column"
                  + (f" ({left} rows of the last episode left out)" if left else ""))

    def _restore(self, saved: dict) -> None:
        """Resume: the agent, the replay as saved, the envs where they pickle (else their episodes restart), and
        the loop state (counters, clocks, schedule, RNG states: restored last)."""
        self.agent.load_state_dict(saved["agent"])
        ranks.check_digest(self.agent, saved.get("agent_digest"), self.info)  # ranks > 0 saved their digest
        self.replay.load(saved["replay_dir"])
        if self.stepper.load_state_dict(saved["stepper"]):  # envs restored exactly: continue the episodes in flight
            self.row, self.act_state = saved["row"], saved["act_state"]
        self.loop.load_state_dict(saved)
        why = (saved["stepper"] or {}).get("env_error")  # e.g. Atari with sticky actions (pretrain: no envs)
        print(f"[reverie] resumed {self.run_dir} from {Path(saved['checkpoint_path']).name}: env step "
              f"{self.loop.env_steps}, {self.loop.updates} updates, replay {len(self.replay)} steps"
              f"{'' if self.row is not None or self.offline else '; episodes in flight restart'}"
              f"{'' if self.row is not None or not why else f' (the envs were not saved: {why})'}")

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
        """True once the prefill is done and replay holds more than one sequence of ``batch_length`` rows."""
        return self.loop.env_steps >= self.prefill and self.replay.num_rows > self.batch[1] + self.context

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
        return self.replay.sample(B, T + self.context, online=self.online, index=bool(self.context))

    def update(self, batch: dict[str, np.ndarray] | None = None) -> bool:
        """:meth:`update_once`; in one process a Ctrl-C / SIGTERM that arrives during the update waits for its end
        (then ``KeyboardInterrupt``), so the final checkpoint never holds a half-stepped model or optimiser."""
        if self._flag is not None:  # several ranks, offline: the loop's own flag, checked once per step
            return self.update_once(batch)
        with SignalFlag() as flag:
            diverged = self.update_once(batch)
        if flag.raised:
            raise KeyboardInterrupt
        return diverged

    def update_once(self, batch: dict[str, np.ndarray] | None = None) -> bool:
        """One agent update (``update``, or offline ``update_model``: :meth:`_update_path`) on ``batch`` (default: a
        fresh replay sample), logged; True once
        ``train.max_nonfinite_updates`` updates in a row had a skipped (non-finite) optimiser step: the run stops."""
        first = self._first_update and self.progress is not None
        if first:  # this process's first update compiles and allocates: say so while it runs
            self.progress.status("first update (compiling/allocating)...")
        batch = self.sample() if batch is None else batch
        metrics = self._update(batch)
        self.write_back(batch)
        if first:
            self.progress.status(None)  # the estimate counts from here
        self._first_update = False
        self.logger.scalars(metrics)
        self.loop.updates += 1
        if metrics.get("guard/nonfinite", 0.0) <= 0:  # the guard: a non-finite loss or gradient changed nothing
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

    def write_back(self, batch: dict[str, np.ndarray]) -> None:
        """After an update with replay context: write the posteriors of the window's trained rows into the rows they
        came from (official ``replay.update(outs['replay'])``, ``embodied/run/train.py:79-80``); rows overwritten
        since the sample are skipped."""
        writes = self.agent.replay_writes() if self.context else None
        if writes is not None and "replay_start" in batch:
            with self.replay_lock:
                self.replay.write(batch["replay_column"], batch["replay_start"] + self.context, writes)

    def report(self) -> None:
        """The open-loop report (``reverie.viz``) when its clock (updates) fires, and once more at the end of a run
        whose reports are on; rank 0 alone."""
        clock = self.loop.clocks["report"]
        if (clock(self.loop.updates) or (self.step >= self.steps and clock.every > 0)) and self.info.is_main:
            self.write_report()

    def write_report(self) -> None:
        """Write the open-loop report now (videos/, plots/ and its metrics; :func:`reverie.viz.report`); offline
        with ``pretrain.heldout``, also the open-loop error on the held-out data (``heldout/...``)."""
        report(self.agent, self.replay, self.logger, self.step, length=self.batch[1])
        if self.heldout is not None:
            from reverie.data.heldout import heldout_errors

            self.logger.scalars(heldout_errors(self.agent, self.heldout, self.batch[1],
                                               int(self.cfg.pretrain.heldout_sequences)))

    def evaluate(self) -> float:
        """Evaluate the agent (``train.eval_episodes``, or ``pretrain.eval_episodes`` offline; policy mode) without
        moving the training random streams; logged at the run's step; returns the mean return."""
        tc, loop, step = self.cfg.train, self.loop, self.step
        with preserved_rng():
            result = evaluate(self.agent, self.cfg.env, self.eval_episodes, self.cfg.seed, mode=tc.eval_mode)
        for ret, length in zip(result["returns"], result["lengths"]):
            self.logger.episode(step, loop.env_steps * self.repeat, ret, length, mode="eval")
        loop.evals.append((step, loop.wall_s(), result["mean"]))
        self.logger.scalars({"eval/return_mean": result["mean"], "eval/return_std": result["std"]})
        if loop.best_eval() == (step, result["mean"]):  # it beats every earlier evaluation: keep it
            save_best(self.run_dir / "checkpoints", {
                "agent": torch.nn.Module.state_dict(self.agent) if isinstance(self.agent, torch.nn.Module)
                else self.agent.state_dict(), "obs_shapes": self.obs_shapes, "action_spec": self.spec,
                "config": OmegaConf.to_container(self.cfg, resolve=True),
                "counters": {"env_steps": loop.env_steps, "updates": loop.updates,
                             "frames": loop.env_steps * self.repeat},
                "eval_return": result["mean"], "eval_episodes": self.eval_episodes})
        return result["mean"]

    def write_metrics(self) -> None:
        """One ``metrics.jsonl`` row (interval means) with the loop's counters and rates."""
        loop, elapsed = self.loop, max(self.loop.wall_s(), 1e-9)
        self.written = self.step
        self.logger.write(self.step, {
            "updates": loop.updates, "frames": loop.env_steps * self.repeat, "wall_s": elapsed,
            "fps/env_steps": loop.env_steps / elapsed, "fps/updates": loop.updates / elapsed,
            "guard/skipped_updates": loop.skipped, "env/restarts": self.stepper.restarts})

    def checkpoint(self) -> None:
        """Save the run (atomically, keeping ``train.checkpoint_keep``): rank 0 the agent and its own state, ranks
        > 0 their state and the agent's digest."""
        info, loop = self.info, self.loop
        save_checkpoint(ranks.checkpoint_dir(self.run_dir, info), self.step, {
            "agent": self.agent.state_dict() if info.is_main else None,
            "agent_digest": None if info.is_main else collectives.param_digest(self.agent),
            "obs_shapes": self.obs_shapes, "action_spec": self.spec,
            "config": OmegaConf.to_container(self.cfg, resolve=True), **loop.state_dict(self.repeat),
            "stepper": self.stepper.state_dict(), "row": self.row, "act_state": self.act_state,
            "wandb_id": self.logger.wandb_run_id}, keep=self.keep, replay=self.replay)

    def tick(self) -> bool:
        """After an env step (an update offline): stop on divergence; evaluate, log and checkpoint on their clocks;
        True when the run stops (``train.stop_return`` reached, a signal on any rank, or divergence)."""
        if self.diverged:
            return True
        loop, clocks, tc, step = self.loop, self.loop.clocks, self.cfg.train, self.step
        stop = False
        if clocks["eval"](step) and self.eval_episodes and self.info.is_main:  # the others wait at `agree`
            mean_return = self.evaluate()
            stop = tc.stop_return is not None and mean_return >= tc.stop_return
        if clocks["log"](step) or stop:
            self.write_metrics()
        if clocks["checkpoint"](step):
            self.checkpoint()
        self.show_progress()
        if self._flag is not None:  # several ranks: every rank stops after the same env step (offline: the update)
            flags = collectives.agree({"stop": stop, "interrupt": self._flag.raised}, self.info)
            stop, self.interrupted = flags["stop"], flags["interrupt"]
            if self.interrupted:
                print(f"\n[reverie] interrupted at {self.where()}: writing metrics and a checkpoint")
        return stop or self.interrupted

    def show_progress(self) -> None:
        if self.progress is not None:
            self.progress.update(self.step, {"updates": self.loop.updates, "last_return": self.loop.last_return})

    def where(self) -> str:
        """``env step <n>`` (``update <n>`` offline), for messages."""
        return f"{'update' if self.offline else 'env step'} {self.step}"

    # ------------------------------------------------------------------------------------------ run, finish
    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The block the loop runs in: the progress bar, and Ctrl-C / SIGTERM turned into a clean stop (one process:
        ``KeyboardInterrupt`` after the step in flight; several ranks, and offline runs: a flag checked once per step,
        see :meth:`tick`, so the run stops after the update in flight and its checkpoint resumes exactly).
        """
        self._flag = SignalFlag().install() if self.info.distributed or self.offline else None
        previous = None if self._flag is not None else sigterm_as_interrupt()
        try:
            with Progress(self.steps, enabled=bool(self.cfg.train.progress) and self.info.is_main,
                          description="pretrain" if self.offline else "train", prefill=self.prefill,
                          start_steps=self.step) as self.progress:
                yield
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
            self.interrupted = True
            self.collected()  # the interrupt came between step_async and the wait
            print(f"\n[reverie] interrupted at {self.where()}: writing metrics and a checkpoint", flush=True)
        finally:
            self.progress = None
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if self._flag is not None:
                self._flag.restore()

    def finish(self) -> dict[str, Any]:
        """The end of the run: a final evaluation (unless the last step just had one), metrics, checkpoint, video,
        ``summary.json`` (uninterrupted finishes only), the resume command of an interrupted run; returns the
        summary (see :func:`reverie.train.train`)."""
        cfg, info, loop = self.cfg, self.info, self.loop
        stopped = self.interrupted or self.diverged
        evaluated = loop.evals and loop.evals[-1][0] == self.step
        if not stopped and not evaluated and self.eval_episodes and info.is_main:
            self.evaluate()
        final = loop.evals[-1][2] if loop.evals else float("nan")
        if self.logger.pending or self.written != self.step:  # no second, empty row after the loop's own
            self.write_metrics()
        self.checkpoint()
        if cfg.train.video and self.eval_episodes and not stopped and info.is_main:
            with preserved_rng():
                frames, _ = record_episode(self.agent, cfg.env, cfg.seed, mode=cfg.train.eval_mode)
            if frames is not None:
                self.logger.video("eval/episode", frames, self.step)
        self.stepper.close()
        self.logger.close()
        wall, best = loop.wall_s(), loop.best_eval()
        summary = {"env_steps": loop.env_steps, "updates": loop.updates, "eval_return": final, "evals": loop.evals,
                   "wall_s": wall, "best_eval_step": None if best is None else best[0],
                   "best_eval_return": float("nan") if best is None else best[1],
                   "interrupted": self.interrupted, "diverged": self.diverged,
                   "resumed_from": None if self.saved is None else self.saved["counters"]["updates" if self.offline
                                                                                        else "env_steps"]}
        if not stopped and info.is_main:
            write_summary(self.run_dir, summary)  # the completion marker: this run (or sweep trial) is finished
        outcome = "interrupted" if self.interrupted else "diverged" if self.diverged else "done"
        where = "update" if self.offline else "env step"
        kept = f" (best {best[1]:.1f} at {where} {best[0]:,}: checkpoints/{BEST_FILE})" if best is not None else ""
        last = f"last eval return {final:.1f}" if np.isfinite(final) else "no evaluation yet"
        print(f"[reverie] {outcome}: {loop.env_steps} env steps, {loop.updates} updates, {last}{kept}, "
              f"{wall / 60:.2f} min; run dir {self.run_dir}")
        if self.interrupted and info.is_main:
            command = "pretrain" if self.offline else "train"
            print(f"[reverie] resume this run with: {resume_command(self.run_dir, command=command)}", flush=True)
        return summary
