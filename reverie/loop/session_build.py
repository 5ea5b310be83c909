"""Building a run for :class:`reverie.loop.session.Session`: the envs (offline: the spaces only), the agent and its
replay (the replay context's latents, the disk preflight), the logger, and which update the run calls.
:class:`SessionBuild` holds the methods; the session's constructor calls them: envs, agent and replay, logger, then
the update path."""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from reverie.agents.build import build_agent
from reverie.envs import action_spec, make_env, make_vector_env, write_env_metadata
from reverie.envs.stepper import VectorStepper
from reverie.logs.logger import Logger
from reverie.replay import Replay
from reverie.runtime import collectives
from reverie.runtime.process_group import rank_path
from reverie.state.preflight import GIB, STEPS_BOUND, describe, preflight
from reverie.state.resume import truncate_jsonl
from reverie.types import ActionSpec


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


class SessionBuild:
    """The building steps of :class:`reverie.loop.session.Session` (it sets ``cfg``, ``run_dir``, ``info``, ``saved``,
    ``offline``, ``seed``, ``steps``, ``keep``, ``overlap`` and ``batch`` before calling them)."""

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
            # (a fresh pretrain run holds its dataset and nothing more: bounded by the dataset's steps)
            dataset = bool(self.offline or cfg.get("init_from"))
            known = self.dataset_steps if self.offline else None
            held = known if known is not None else int(cfg.replay.capacity) if dataset else self.steps
            bound = ("min(replay.capacity, the dataset's steps)" if known is not None else
                     "replay.capacity (a dataset may fill it)" if dataset else STEPS_BOUND)
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
