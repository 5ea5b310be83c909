"""The training loop: collect -> add -> ratio -> update -> log / eval / checkpoint.

It owns time (env steps, the train_ratio clock, log/eval/save clocks) and knows agents only through the
:class:`reverie.agents.base.Agent` protocol, so every agent shares it unchanged (DESIGN.md section 1).
"""

from __future__ import annotations

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
from reverie.checkpoint import BEST_FILE, save_best, save_checkpoint
from reverie.collector import Collector, check_async_collect, make_policy_copy, sync_policy
from reverie.config_ranges import check_ranges
from reverie.cpu_memory import keep_freed_memory
from reverie.envs import make_vector_env, write_env_metadata
from reverie.envs.stepper import VectorStepper
from reverie.evaluate import evaluate, record_episode
from reverie.logging import Logger
from reverie.preflight import GIB, describe, preflight
from reverie.progress import Progress
from reverie.replay import Replay
from reverie.replay.cycle import make_schedule
from reverie.resume import (check_resumable, check_resume_config, read_summary, resume_command, truncate_jsonl,
                            write_summary)
from reverie.rng import preserved_rng, rng_state, seed_everything, set_rng_state
from reverie.types import ActionSpec
from reverie.viz import report


def build_agent(agent_cfg: DictConfig, obs_shapes: dict[str, tuple[int, ...]], spec: ActionSpec) -> Any:
    """Instantiate ``agent_cfg.module`` (a ``_target_`` block) with the env's observation shapes and actions."""
    factory = hydra.utils.instantiate(agent_cfg.module, _partial_=True, _convert_="all")
    return factory(obs_shapes=obs_shapes, action_spec=spec)


def random_actions(rng: np.random.Generator, spec: ActionSpec, n: int) -> np.ndarray:
    """Uniform random policy: one-hot ``(N, A)`` for discrete, ``U[-1, 1]^A`` for continuous. float32."""
    if spec.discrete:
        return np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=n)]
    return rng.uniform(-1.0, 1.0, size=(n, spec.dim)).astype(np.float32)


def best_eval(evals: list[tuple[int, float, float]]) -> tuple[int, float] | None:
    """``(env_step, mean_return)`` of the best evaluation in ``evals`` (``(env_step, wall_s, mean_return)`` rows):
    the first one with the highest finite mean, as a run that keeps an evaluation only when it beats every
    earlier one; None without a finite mean."""
    best = None
    for step, _, mean in evals:
        if np.isfinite(mean) and (best is None or mean > best[1]):
            best = (int(step), float(mean))
    return best


class Clock:
    """Fires when ``step`` crosses a multiple of ``every`` (never when ``every <= 0``)."""

    def __init__(self, every: int):
        self.every, self.last = int(every or 0), 0  # ``last``: the step it last fired at (checkpointed)

    def __call__(self, step: int) -> bool:
        if self.every <= 0 or step // self.every == self.last // self.every:
            return False
        self.last = step
        return True


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
        mean_return), ...], "best_eval_step", "best_eval_return" (the best evaluation, whose weights are in
        ``checkpoints/best.pt``), "wall_s", "interrupted", "diverged", "resumed_from" (env step or None)}``.
        Each evaluation whose mean return beats every earlier one writes ``checkpoints/best.pt`` (weights only,
        atomic; :func:`reverie.checkpoint.save_best`), so the run ends with its best policy as well as its last.
        Ctrl-C or SIGTERM stops collection, writes the metrics and a checkpoint, and returns with
        ``interrupted`` True; ``train.max_nonfinite_updates`` skipped updates in a row do the same with
        ``diverged`` True. Only an uninterrupted finish writes ``summary.json`` (this dict as JSON).

    Data parallel (``trainer.nproc > 1``, docs/speed.md): when started by torchrun (``reverie train ...
    trainer.nproc=2`` does that), each rank runs this loop with its own envs and replay shard
    (``replay/rank<r>``), seeded by :func:`reverie.distributed.rank_seed`, and the agent averages its gradients
    over ranks; rank 0 alone evaluates, reports, records videos and writes TensorBoard/wandb and summary.json;
    ranks > 0 keep their own ``metrics.jsonl``/``scores.jsonl`` and checkpoints under ``run_dir/rank<r>/``.

    Raises:
        ValueError: a numeric key outside its range (``config error: ...``, :mod:`reverie.config_ranges`), before
            anything is written.
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

    ``train.control_hz`` (docs/speed.md, "A fixed control rate"): a :class:`reverie.collector.Collector` thread
    acts every ``1 / control_hz`` seconds with a policy copy while this thread runs the updates the train_ratio
    owes for the rows collected so far (exactly that many in total; they may lag, never lead); checkpoints and
    evaluations pause the collector at a step boundary. Not bit-reproducible (the copy's freshness is timing).
    """
    check_ranges(cfg)
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
    if str(cfg.device).startswith("cpu") and cfg.get("cpu_keep_freed_memory", True):
        keep_freed_memory()  # no page faults on every big tensor (reverie/cpu_memory.py)
    rng = np.random.default_rng(seed)

    # --- envs, agent, replay ---
    def make_envs(restart: int = 0):  # restarts after env failures get fresh seeds
        return make_vector_env(cfg.env, seed + 7919 * restart)

    stepper = VectorStepper(make_envs(), make=make_envs, max_restarts=int(tc.get("env_retries", 3)))
    overlap = bool(tc.get("async_collect", False))
    control_hz = tc.get("control_hz")  # a collector thread at this rate (reverie.collector; None: this loop acts)
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
        fits = preflight(replay_spec, int(cfg.replay.capacity), agent, cfg.replay.storage, replay_dir,
                         run_dir / "checkpoints", keep, steps=int(tc.steps), num_envs=n)
        if info.is_main:
            print(f"[reverie] disk: {describe(fits)} under {run_dir / 'checkpoints'}; "
                  f"{fits['disk_free'] / GIB:.1f} GiB free")
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
        if best_eval(evals) == (env_steps, result["mean"]):  # it beats every earlier evaluation: keep its weights
            save_best(run_dir / "checkpoints", {
                "agent": torch.nn.Module.state_dict(agent) if isinstance(agent, torch.nn.Module) else agent.state_dict(),
                "obs_shapes": obs_shapes, "action_spec": spec, "config": OmegaConf.to_container(cfg, resolve=True),
                "counters": {"env_steps": env_steps, "updates": updates, "frames": env_steps * repeat},
                "eval_return": result["mean"], "eval_episodes": int(tc.eval_episodes)})
        return result["mean"]

    if row is None:
        row, state = stepper.reset(), None

    def learned(metrics: dict[str, float]) -> bool:  # log one update; True once train.max_nonfinite_updates is hit
        nonlocal updates, skipped, bad_in_row
        logger.scalars(metrics)
        updates += 1
        if metrics.get("guard/nonfinite", 0.0) <= 0:  # the guard: a non-finite loss or gradient changed nothing
            bad_in_row = 0
            return False
        skipped, bad_in_row = skipped + 1, bad_in_row + 1
        warnings.warn(f"update {updates}: non-finite loss or gradient, optimiser step(s) skipped ({bad_in_row} in a "
                      f"row, {skipped} in total)", RuntimeWarning)
        return 0 < max_bad <= bad_in_row

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
        with Progress(int(tc.steps), enabled=bool(tc.progress) and info.is_main, prefill=int(tc.prefill),
                      start_steps=env_steps) as progress:
            first_update = [True]  # this process's first update compiles and allocates: say so while it runs

            def update(batch: dict[str, np.ndarray]) -> dict[str, float]:
                if first_update[0]:
                    progress.status("first update (compiling/allocating)...")
                metrics = agent.update(batch)
                if first_update[0]:
                    progress.status(None)  # the estimate counts from here
                    first_update[0] = False
                return metrics

            if control_hz:  # --- train.control_hz: a collector thread acts at a fixed rate; this thread learns ---
                collector = Collector(stepper, replay, make_policy_copy(agent), control_hz, row=row, state=state,
                                      env_steps=env_steps, ratio_steps=ratio.env_steps, steps=int(tc.steps),
                                      prefill=int(tc.prefill), batch_length=int(ac.batch_length),
                                      random_action=lambda: random_actions(rng, spec, n))
                owed, since_sync, sync_every = 0, 0, max(1, int(tc.get("policy_sync_every", 1)))

                def catch_up() -> int:  # read the collector's counters and episodes; returns late steps
                    nonlocal env_steps, owed, last_return, episodes
                    env_steps, ratio_steps, late = collector.counts()
                    owed += ratio(ratio_steps - ratio.env_steps)  # the updates the train_ratio owes (may lag)
                    while not collector.episodes.empty():
                        ep = collector.episodes.get()
                        last_return, episodes = ep["return"], episodes + 1
                        logger.episode(ep["step"], ep["step"] * repeat, ep["return"], ep["length"], mode="train")
                    return late
                collector.start()
                try:
                    while True:
                        done = collector.done  # read before the counters, so a finished collector's are final
                        collector.check()
                        late = catch_up()
                        if owed:  # one update, then the clocks again (the collector keeps stepping meanwhile)
                            with collector.replay_lock:
                                batch = replay.sample(int(ac.batch_size), int(ac.batch_length))
                            diverged = learned(update(batch))
                            owed, since_sync = owed - 1, since_sync + 1
                            if since_sync >= sync_every:  # train.policy_sync_every
                                with collector.policy_lock:
                                    sync_policy(collector.policy, agent)
                                since_sync = 0
                            if report_clock(updates):
                                with collector.replay_lock:
                                    report(agent, replay, logger, env_steps, length=int(ac.batch_length))
                        elif not done:
                            collector.wait(0.05)
                        if diverged:
                            print(f"[reverie] stopping: {bad_in_row} updates in a row had non-finite losses or "
                                  f"gradients (train.max_nonfinite_updates={max_bad}); the checkpoint holds the last "
                                  f"finite model")
                            break
                        logger.scalar("collect/update_lag", owed)
                        stop = False
                        if any(c.every > 0 and env_steps // c.every != c.last // c.every for c in (eval_clock,
                                                                                                   ckpt_clock)):
                            with collector.paused():  # at a step boundary: no checkpoint holds a half-step
                                late = catch_up()
                                row, state = collector.row, collector.state
                                if eval_clock(env_steps):
                                    mean_return = run_eval()
                                    stop = tc.stop_return is not None and mean_return >= tc.stop_return
                                if ckpt_clock(env_steps):
                                    ratio.updates -= owed  # the owed updates are owed again after a resume
                                    checkpoint()
                                    ratio.updates += owed
                        if log_clock(env_steps) or stop:
                            logger.scalar("collect/late_steps", late)
                            write_metrics()
                        progress.update(env_steps, {"updates": updates, "last_return": last_return})
                        if done and not owed and report_clock.every > 0 and report_clock.last != updates:
                            report(agent, replay, logger, env_steps, length=int(ac.batch_length))  # the end one
                        if stop or (done and not owed):
                            break
                finally:  # Ctrl-C, SIGTERM, divergence, stop_return or the end: stop at a step boundary
                    collector.stop()
                    catch_up()
                    row, state = collector.row, collector.state
                    ratio.updates -= owed  # the final checkpoint owes what this run did not do
            while not control_hz and env_steps < tc.steps:
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
                            if learned(update(replay.sample(int(ac.batch_size), int(ac.batch_length)))):
                                diverged = True
                                break
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
    best = best_eval(evals)
    summary = {"env_steps": env_steps, "updates": updates, "eval_return": final, "evals": evals, "wall_s": wall,
               "best_eval_step": None if best is None else best[0],
               "best_eval_return": float("nan") if best is None else best[1],
               "interrupted": interrupted, "diverged": diverged,
               "resumed_from": None if saved is None else saved["counters"]["env_steps"]}
    if not stopped and info.is_main:
        write_summary(run_dir, summary)  # the completion marker: this run (or sweep trial) is finished
    kept = f" (best {best[1]:.1f} at env step {best[0]:,}: checkpoints/{BEST_FILE})" if best is not None else ""
    print(f"[reverie] {'interrupted' if interrupted else 'diverged' if diverged else 'done'}: {env_steps} env "
          f"steps, {updates} updates, last eval return {final:.1f}{kept}, {wall / 60:.2f} min; run dir {run_dir}")
    if interrupted and info.is_main:
        print(f"[reverie] resume this run with: {resume_command(run_dir)}", flush=True)
    return summary


def _sigterm_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt (main thread only) so a killed run still saves; returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
