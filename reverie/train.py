"""The training loop: collect -> add -> ratio -> update -> log / eval / checkpoint.

It owns time (env steps, the train_ratio clock, log/eval/save clocks) and knows agents only through the
:class:`reverie.agents.base.Agent` protocol, so every agent shares it unchanged (DESIGN.md section 1).
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import hydra.utils
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from reverie import distributed
from reverie.checkpoint import save_checkpoint
from reverie.envs import make_vector_env, write_env_metadata
from reverie.envs.stepper import VectorStepper
from reverie.evaluate import evaluate, record_episode
from reverie.logging import Logger
from reverie.preflight import preflight
from reverie.progress import Progress
from reverie.replay import Replay
from reverie.replay.cycle import make_schedule
from reverie.resume import check_resumable, check_resume_config, read_summary, truncate_jsonl, write_summary
from reverie.types import ActionSpec
from reverie.viz import report


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from the run seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Every global random stream (python, numpy, torch CPU and CUDA) plus ``rng``'s, for a checkpoint."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if rng is not None:
        state["generator"] = rng.bit_generator.state
    return state


def set_rng_state(state: dict[str, Any], rng: np.random.Generator | None = None) -> None:
    """Restore what :func:`rng_state` captured (CUDA streams only when the device count matches)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    if rng is not None and "generator" in state:
        rng.bit_generator.state = state["generator"]


@contextlib.contextmanager
def preserved_rng():
    """Run a block (evaluation, videos) without moving the training random streams, so eval cadence (a safe
    resume change) never changes what training does."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def build_agent(agent_cfg: DictConfig, obs_shapes: dict[str, tuple[int, ...]], spec: ActionSpec) -> Any:
    """Instantiate ``agent_cfg.module`` (a ``_target_`` block) with the env's observation shapes and actions."""
    factory = hydra.utils.instantiate(agent_cfg.module, _partial_=True, _convert_="all")
    return factory(obs_shapes=obs_shapes, action_spec=spec)


def random_actions(rng: np.random.Generator, spec: ActionSpec, n: int) -> np.ndarray:
    """Uniform random policy: one-hot ``(N, A)`` for discrete, ``U[-1, 1]^A`` for continuous. float32."""
    if spec.discrete:
        return np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=n)]
    return rng.uniform(-1.0, 1.0, size=(n, spec.dim)).astype(np.float32)


class Clock:
    """Fires when ``step`` crosses a multiple of ``every`` (never when ``every <= 0``)."""

    def __init__(self, every: int):
        self.every, self.last = int(every or 0), 0  # ``last``: the step it last fired at (checkpointed)

    def __call__(self, step: int) -> bool:
        if self.every <= 0 or step // self.every == self.last // self.every:
            return False
        self.last = step
        return True


def check_async_collect(cfg: DictConfig) -> None:
    """Refuse ``train.async_collect=true`` where nothing can overlap, from the config alone (no env is built).

    The overlap needs envs stepping in other processes (``env.vector_mode=async``, Gymnasium's
    ``AsyncVectorEnv``); with ``sync`` the updates and the env steps would run one after the other anyway. This
    raises instead of switching the mode silently, so the saved config says what ran: the mode also decides
    whether a resume continues the episodes in flight (sync envs pickle) or restarts them (docs/resume.md).

    An update schedule that counts finished episodes (``agent.schedule=episodes``, PlaNet's cycle) needs the
    step's result before its updates, so there is nothing to overlap: refused too.

    Raises:
        ValueError: ``train.async_collect`` is true and ``env.vector_mode`` is not ``async``, or the agent's
            updates wait for finished episodes (``agent.schedule=episodes``).
    """
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


def train(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Train the configured agent on the configured env, resuming ``run_dir``'s checkpoint if it has one.

    Args:
        cfg: the resolved root config (``reverie/configs/config.yaml`` plus overrides).
        run_dir: where ``config.yaml``, ``metrics.jsonl``, ``scores.jsonl``, ``tb/``, ``checkpoints/``,
            ``replay/``, ``videos/`` and, once finished, ``summary.json`` go.

    Resume (docs/resume.md): when ``run_dir/checkpoints`` holds a readable checkpoint, everything in it is
    restored (agent, replay exactly as saved, train_ratio clock, counters, clocks, RNG states, the envs where
    they pickle, else their episodes restart) and the run continues to ``cfg.train.steps``; metric and score
    rows written after the checkpoint are dropped (they are collected again). ``cfg`` may differ from the
    saved config only in :data:`reverie.resume.SAFE_KEYS`. A finished run (``summary.json``) whose
    ``train.steps`` is not raised is not trained again: its summary is returned.

    Returns:
        ``{"env_steps", "updates", "eval_return" (the last evaluation's mean), "evals": [(env_step, wall_s,
        mean_return), ...], "wall_s", "interrupted", "diverged", "resumed_from" (env step or None)}``.
        Ctrl-C or SIGTERM stops collection, writes the metrics and a checkpoint, and returns with
        ``interrupted`` True; ``train.max_nonfinite_updates`` skipped updates in a row do the same with
        ``diverged`` True. Only an uninterrupted finish writes ``summary.json`` (this dict as JSON).

    Data parallel (``trainer.nproc > 1``, docs/speed.md): when started by torchrun (``reverie train ...
    trainer.nproc=2`` does that), each rank runs this loop with its own envs and replay shard
    (``replay/rank<r>``), seeded by :func:`reverie.distributed.rank_seed`, and the agent averages its gradients
    over ranks; rank 0 alone evaluates, reports, records videos and writes TensorBoard/wandb and summary.json;
    ranks > 0 keep their own ``metrics.jsonl``/``scores.jsonl`` and checkpoints under ``run_dir/rank<r>/``.

    Raises:
        reverie.resume.ResumeError: ``cfg`` changes a key that is not safe to change on resume.
        reverie.preflight.PreflightError: the replay and model do not fit in RAM or on disk.
        ValueError: a bad ``trainer`` block, or ``trainer.nproc`` other than the number of processes started;
            ``train.async_collect`` is true but the envs cannot step in the background (set
            ``env.vector_mode=async``) or the agent's schedule waits for finished episodes
            (:func:`check_async_collect`).

    ``train.async_collect`` (docs/speed.md, "Collection in parallel"): the envs step in their worker processes
    while the updates the train_ratio owes run, then the loop waits for the new row. Row ``t`` is added to
    replay before the envs step and the updates never read the row being collected, so a run gives exactly the
    same updates, replay, scores and metrics (wall time aside) with the switch on or off.
    """
    nproc, backend = distributed.trainer_settings(cfg.get("trainer"), cfg.device)
    timeout = (cfg.get("trainer") or {}).get("timeout_min")
    info = distributed.init_process_group(cfg.device, backend, timeout_s=None if timeout is None else 60 * timeout)
    try:
        if info.world_size != nproc:
            raise ValueError(f"trainer.nproc={nproc} but {info.world_size} process(es) were started; start data-"
                             f"parallel runs with `reverie train ... trainer.nproc={nproc}` (it runs torchrun)")
        if info.distributed and "device" in cfg.agent.module:  # cuda -> cuda:<local rank>
            cfg.agent.module.device = str(info.device)
        return _train(cfg, Path(run_dir), info)
    finally:
        distributed.destroy_process_group()


def _train(cfg: DictConfig, run_dir: Path, info: distributed.DistInfo) -> dict[str, Any]:
    tc, ac = cfg.train, cfg.agent
    keep = int(tc.get("checkpoint_keep", 2))
    saved = distributed.load_rank_checkpoint(run_dir, info)  # rank r > 0: its own state + rank 0's agent
    if saved is not None:
        check_resumable(saved, saved["checkpoint_path"])
        changes = check_resume_config(saved["config"], OmegaConf.to_container(cfg, resolve=True))
        done = read_summary(run_dir)
        if done is not None and int(tc.steps) <= int(saved["config"]["train"]["steps"]):
            print(f"[reverie] {run_dir} already finished ({done['env_steps']} env steps, summary.json); raise "
                  f"train.steps above {saved['config']['train']['steps']} to continue it")
            return done
        if info.is_main:
            (run_dir / "summary.json").unlink(missing_ok=True)
        for key, (old, new) in changes.items():
            print(f"[reverie] resume: {key} {old!r} -> {new!r}")
    check_async_collect(cfg)
    seed = distributed.rank_seed(cfg.seed, info.rank)  # the run seed itself on rank 0
    seed_everything(seed)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    rng = np.random.default_rng(seed)

    # --- envs, agent, replay ---
    def make_envs(restart: int = 0):  # restarts after env failures get fresh seeds
        return make_vector_env(cfg.env, seed + 7919 * restart)

    stepper = VectorStepper(make_envs(), make=make_envs, max_restarts=int(tc.get("env_retries", 3)))
    overlap = bool(tc.get("async_collect", False))
    if overlap and not stepper.overlaps:
        kind = type(stepper.env).__name__
        stepper.close()
        raise ValueError(f"train.async_collect=true needs envs that step in the background (step_async/step_wait), "
                         f"but this env config built a {kind}, which has none (envpool's backend is not supported "
                         f"yet); use env.vector_mode=async with the Gymnasium backend, or train.async_collect=false")
    n, spec = stepper.num_envs, stepper.action_spec
    obs_space = stepper.env.single_observation_space
    obs_shapes = {k: tuple(s.shape) for k, s in obs_space.spaces.items()}
    agent = build_agent(ac, obs_shapes, spec)
    distributed.broadcast_module(agent)  # replicas start equal: rank 0's initial weights
    replay_dir = str(distributed.rank_path(cfg.replay.directory or run_dir / "replay", info))  # this rank's shard
    replay_spec = Replay.spec_for(obs_space, spec.dim)
    if cfg.replay.get("preflight", True):
        preflight(replay_spec, int(cfg.replay.capacity), agent, cfg.replay.storage, replay_dir,
                  run_dir / "checkpoints", keep)
    replay = Replay(int(cfg.replay.capacity), n, replay_spec, storage=cfg.replay.storage, directory=replay_dir,
                    seed=seed)
    ratio = make_schedule(ac)  # train_ratio clock (DreamerV3) or episode cycle (agent.schedule: episodes, PlaNet)
    repeat = int(cfg.env.get("action_repeat", 1) or 1)
    wandb_kwargs = {k: v for k, v in cfg.logger.items() if k != "backends"}
    # rows written after the checkpoint (all rows, when a run stopped before its first one) are collected again
    resume_step = 0 if saved is None else saved["counters"]["env_steps"]
    log_dir = run_dir if info.is_main else run_dir / f"rank{info.rank}"  # ranks > 0: their own jsonl files only
    for name in ("metrics.jsonl", "scores.jsonl"):
        truncate_jsonl(log_dir / name, resume_step)
    if saved is not None and saved.get("wandb_id") and "id" not in wandb_kwargs:
        wandb_kwargs["id"] = saved["wandb_id"]
    logger = Logger(log_dir, backends=list(cfg.logger.backends) if info.is_main else [],
                    config=OmegaConf.to_container(cfg, resolve=True),
                    wandb_kwargs=wandb_kwargs, purge_step=None if saved is None else resume_step + 1)
    if info.is_main:
        write_env_metadata(cfg.env, run_dir)  # env_metadata.json: protocol settings and simulator versions
    print(f"[reverie] {n} env(s) x {spec}; obs {obs_shapes}; {ratio} with batch {ac.batch_size}x{ac.batch_length} "
          f"({tc.steps} env steps, prefill {tc.prefill}); run dir {run_dir}")

    env_steps = updates = episodes = skipped = bad_in_row = 0
    evals: list[tuple[int, float, float]] = []
    last_return = float("nan")
    log_clock, eval_clock, ckpt_clock = Clock(tc.log_every), Clock(tc.eval_every), Clock(tc.checkpoint_every)
    report_clock = Clock(tc.get("report_every", 0))  # open-loop report every K updates (reverie.viz; 0: off)
    clocks = {"log": log_clock, "eval": eval_clock, "checkpoint": ckpt_clock, "report": report_clock}
    row, state = None, None
    wall_before = 0.0  # wall time of the run before its last resume
    if saved is not None:  # --- resume: restore everything the checkpoint holds ---
        agent.load_state_dict(saved["agent"])
        distributed.check_digest(agent, saved.get("agent_digest"), info)  # ranks > 0 saved their replica's digest
        replay.load(saved["replay_dir"])
        ratio.load_state_dict(saved["ratio"])
        c = saved["counters"]
        env_steps, updates, episodes, skipped = c["env_steps"], c["updates"], c["episodes"], c["skipped_updates"]
        wall_before = c["wall_s"]
        for name, clock in clocks.items():
            clock.last = saved["clocks"][name]
        evals, last_return = [tuple(e) for e in saved["evals"]], saved["last_return"]
        if stepper.load_state_dict(saved["stepper"]):  # envs restored exactly: continue the episodes in flight
            row, state = saved["row"], saved["act_state"]
        set_rng_state(saved["rng"], rng)
        print(f"[reverie] resumed {run_dir} from {Path(saved['checkpoint_path']).name}: env step {env_steps}, "
              f"{updates} updates, replay {len(replay)} steps"
              f"{'' if row is not None else '; episodes in flight restart'}")
    start = time.time() - wall_before

    def checkpoint() -> None:  # rank 0: the agent and its own state; ranks > 0: their state and the agent's digest
        save_checkpoint(distributed.checkpoint_dir(run_dir, info), env_steps, {
            "agent": agent.state_dict() if info.is_main else None,
            "agent_digest": None if info.is_main else distributed.param_digest(agent),
            "obs_shapes": obs_shapes, "action_spec": spec,
            "config": OmegaConf.to_container(cfg, resolve=True),
            "counters": {"env_steps": env_steps, "updates": updates, "frames": env_steps * repeat,
                         "episodes": episodes, "skipped_updates": skipped, "wall_s": time.time() - start},
            "ratio": ratio.state_dict(), "clocks": {name: clock.last for name, clock in clocks.items()},
            "evals": evals, "last_return": last_return, "rng": rng_state(rng), "stepper": stepper.state_dict(),
            "row": row, "act_state": state, "wandb_id": logger.wandb_run_id}, keep=keep, replay=replay)

    written = {"step": -1}  # env step of the last metrics row

    def write_metrics() -> None:
        written["step"] = env_steps
        elapsed = max(time.time() - start, 1e-9)
        logger.write(env_steps, {"updates": updates, "frames": env_steps * repeat, "wall_s": elapsed,
                                 "fps/env_steps": env_steps / elapsed, "fps/updates": updates / elapsed,
                                 "guard/skipped_updates": skipped, "env/restarts": stepper.restarts})

    def run_eval() -> float:
        with preserved_rng():  # evaluation never moves the training random streams
            result = evaluate(agent, cfg.env, int(tc.eval_episodes), cfg.seed, mode=tc.eval_mode)
        for ret, length in zip(result["returns"], result["lengths"]):
            logger.episode(env_steps, env_steps * repeat, ret, length, mode="eval")
        evals.append((env_steps, time.time() - start, result["mean"]))
        logger.scalars({"eval/return_mean": result["mean"], "eval/return_std": result["std"]})
        return result["mean"]

    if row is None:
        row, state = stepper.reset(), None

    def collected(new_row: dict[str, np.ndarray], finished: list[dict]) -> None:  # a step's row and episodes
        nonlocal row, last_return, episodes
        row = new_row
        for ep in finished:
            last_return = ep["return"]
            episodes += 1
            logger.episode(env_steps, env_steps * repeat, ep["return"], ep["length"], mode="train")
    interrupted = diverged = False
    max_bad = int(tc.get("max_nonfinite_updates", 20))
    # several ranks: a signal sets a flag that all ranks agree on once per env step (they stop after the same step)
    signals = distributed.SignalFlag().install() if info.distributed else None
    previous_sigterm = None if info.distributed else _sigterm_as_interrupt()
    try:
        with Progress(int(tc.steps), enabled=bool(tc.progress) and info.is_main) as progress:
            while env_steps < tc.steps:
                # --- act: random policy during prefill, then the agent's exploration policy ---
                if env_steps < tc.prefill:
                    action = random_actions(rng, spec, n)
                else:
                    action, state = agent.act(row, state, "explore")
                # --- add row t = (obs_t, reward_t, flags_t, action_t) and step the envs ---
                replay.add({**row, "action": action})
                if overlap:  # train.async_collect: the envs step in their processes during the updates below
                    stepper.step_async(action)
                else:
                    step = stepper.step(action)
                try:
                    env_steps += n
                    if not overlap:
                        collected(*step)
                    # --- train: updates owed by the train_ratio clock once prefill is done (with async_collect
                    # they run while the envs step: they only read rows up to t, already in replay) ---
                    if env_steps >= tc.prefill and replay.num_rows > ac.batch_length:
                        owed = ratio(n, 0 if overlap else len(step[1]))  # episodes: PlaNet only (no overlap)
                        for _ in range(distributed.broadcast_int(owed, info)):  # rank 0's count on every rank
                            metrics = agent.update(replay.sample(int(ac.batch_size), int(ac.batch_length)))
                            logger.scalars(metrics)
                            updates += 1
                            # --- guard: an update with a non-finite loss or gradient changed nothing ---
                            if metrics.get("guard/nonfinite", 0.0) > 0:
                                skipped, bad_in_row = skipped + 1, bad_in_row + 1
                                warnings.warn(f"update {updates}: non-finite loss or gradient, optimiser step(s) "
                                              f"skipped ({bad_in_row} in a row, {skipped} in total)", RuntimeWarning)
                                if 0 < max_bad <= bad_in_row:
                                    diverged = True
                                    break
                            else:
                                bad_in_row = 0
                        if (report_clock(updates) or (env_steps >= tc.steps and report_clock.every > 0)) \
                                and info.is_main:  # + at the end; rank 0 alone
                            report(agent, replay, logger, env_steps, length=int(ac.batch_length))
                finally:  # no clock, checkpoint or interrupt ever sees a step in flight
                    if stepper.in_flight:
                        collected(*stepper.step_wait())
                if diverged:
                    print(f"[reverie] stopping: {bad_in_row} updates in a row had non-finite losses or gradients "
                          f"(train.max_nonfinite_updates={max_bad}); the checkpoint holds the last finite model")
                    break
                # --- log / eval / checkpoint clocks ---
                stop = False
                if eval_clock(env_steps) and info.is_main:  # rank 0 evaluates; the others wait at `agree`
                    mean_return = run_eval()
                    stop = tc.stop_return is not None and mean_return >= tc.stop_return
                if log_clock(env_steps) or stop:
                    write_metrics()
                if ckpt_clock(env_steps):
                    checkpoint()
                progress.update(env_steps, {"updates": updates, "last_return": last_return})
                if signals is not None:  # every rank stops after the same env step
                    flags = distributed.agree({"stop": stop, "interrupt": signals.raised}, info)
                    stop, interrupted = flags["stop"], flags["interrupt"]
                    if interrupted:
                        print(f"\n[reverie] interrupted at env step {env_steps}: writing metrics and a checkpoint")
                if stop or interrupted:
                    break
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see _sigterm_as_interrupt)
        interrupted = True
        if stepper.in_flight:  # the interrupt came between step_async and the try above
            collected(*stepper.step_wait())
        print(f"\n[reverie] interrupted at env step {env_steps}: writing metrics and a checkpoint", flush=True)
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        if signals is not None:
            signals.restore()

    # --- final evaluation (unless the last step just had one), checkpoint, video and completion marker ---
    stopped = interrupted or diverged
    if not stopped and not (evals and evals[-1][0] == env_steps) and info.is_main:
        run_eval()
    final = evals[-1][2] if evals else float("nan")
    if logger.pending or written["step"] != env_steps:  # no second, empty row when the loop just wrote one
        write_metrics()
    checkpoint()
    if tc.video and not stopped and info.is_main:
        with preserved_rng():
            frames, _ = record_episode(agent, cfg.env, cfg.seed, mode=tc.eval_mode)
        if frames is not None:
            logger.video("eval/episode", frames, env_steps)
    stepper.close()
    logger.close()
    wall = time.time() - start
    summary = {"env_steps": env_steps, "updates": updates, "eval_return": final, "evals": evals, "wall_s": wall,
               "interrupted": interrupted, "diverged": diverged,
               "resumed_from": None if saved is None else saved["counters"]["env_steps"]}
    if not stopped and info.is_main:
        write_summary(run_dir, summary)  # the completion marker: this run (or sweep trial) is finished
    print(f"[reverie] {'interrupted' if interrupted else 'diverged' if diverged else 'done'}: {env_steps} env "
          f"steps, {updates} updates, last eval return {final:.1f}, {wall / 60:.2f} min; run dir {run_dir}")
    return summary


def _sigterm_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt (main thread only) so a killed run still saves; returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
