"""The training loop, as the algorithm box of DreamerV3 (Hafner et al. 2023, algorithm 1) and PlaNet (Hafner et
al. 2019, algorithm 1) writes it::

    while env steps < train.steps:
        collect   a_t ~ pi(a_t | s_t)  (uniform random during the prefill)
        add       row t = (o_t, r_t, flags_t, a_t) to replay, step the envs
        ratio     the updates the schedule owes for these env steps (train_ratio, or PlaNet's episode cycle)
        update    agent.update(replay.sample(B, T)) that many times
        log / eval / checkpoint on their clocks

It knows agents only through the :class:`reverie.agents.base.Agent` protocol, so every agent shares it unchanged.
The bookkeeping of each step (counters, clocks, data-parallel agreement, signals) is in
:class:`reverie.loop.session.Session`; its state (:class:`reverie.loop.state.LoopState`) saves and loads itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from reverie.configs.ranges import check_ranges
from reverie.loop.collector import check_async_collect, run_with_collector
from reverie.loop.session import Session
from reverie.runtime.process_group import destroy_process_group, init_process_group, trainer_settings
from reverie.state.resume import resume_point


def train(cfg: DictConfig, run_dir: str | Path, dataset: Any = None) -> dict[str, Any]:
    """Train the configured agent on the configured env, resuming ``run_dir``'s checkpoint if it has one.

    Args:
        cfg: the resolved root config (``reverie/configs/config.yaml`` plus overrides).
        run_dir: where ``config.yaml``, ``metrics.jsonl``, ``scores.jsonl``, ``tb/``, ``checkpoints/``,
            ``replay/``, ``videos/`` and, once finished, ``summary.json`` go.
        dataset: with ``cfg.init_from`` and ``init.keep_data``, the validated replay of that run
            (:func:`reverie.data.load_dataset`) when the caller has read it already; None reads it.

    ``cfg.init_from`` (docs/offline.md): a fresh run starts from that run's agent (:mod:`reverie.state.init_from`)
    and, with ``init.keep_data``, a replay filled with that run's replay; its agent acts after ``init.prefill``
    random steps. A resumed run continues from its own checkpoint.

    Resume (docs/resume.md): when ``run_dir/checkpoints`` holds a readable checkpoint, everything in it is
    restored (agent, replay exactly as saved, train_ratio clock, counters, clocks, RNG states, the envs where
    they pickle, else their episodes restart) and the run continues to ``cfg.train.steps``; metric and score
    rows written after the checkpoint are dropped (they are collected again). ``cfg`` may differ from the
    saved config only in :data:`reverie.state.resume.SAFE_KEYS`. A finished run (``summary.json``) whose
    ``train.steps`` is not raised is not trained again: its summary is returned.

    Returns:
        ``{"env_steps", "updates", "eval_return" (the last evaluation's mean), "evals": [(env_step, wall_s,
        mean_return), ...], "best_eval_step", "best_eval_return" (the best evaluation, whose weights are in
        ``checkpoints/best.pt``), "wall_s", "interrupted", "diverged", "resumed_from" (env step or None)}``.
        Each evaluation whose mean return beats every earlier one writes ``checkpoints/best.pt`` (weights only,
        atomic; :func:`reverie.state.checkpoint.save_best`), so the run ends with its best policy as well as its last.
        Ctrl-C or SIGTERM stops collection, writes the metrics and a checkpoint, and returns with
        ``interrupted`` True; ``train.max_nonfinite_updates`` skipped updates in a row do the same with
        ``diverged`` True. Only an uninterrupted finish writes ``summary.json`` (this dict as JSON).

    Data parallel (``trainer.nproc > 1``, docs/speed.md): when started by torchrun (``reverie train ...
    trainer.nproc=2`` does that), each rank runs this loop with its own envs and replay shard
    (``replay/rank<r>``), seeded by :func:`reverie.runtime.process_group.rank_seed`, and the agent averages its
    gradients over ranks; rank 0 alone evaluates, reports, records videos and writes TensorBoard/wandb and
    summary.json; ranks > 0 keep their own ``metrics.jsonl``/``scores.jsonl`` and checkpoints under
    ``run_dir/rank<r>/``.

    ``train.async_collect`` (docs/speed.md, "Collection in parallel"): the envs step in their worker processes
    while the updates the train_ratio owes run, then the loop waits for the new row. Row ``t`` is added to
    replay before the envs step and the updates never read the row being collected, so a run gives exactly the
    same updates, replay, scores and metrics (wall time aside) with the switch on or off.

    ``train.control_hz`` (docs/speed.md, "A fixed control rate"): a :class:`reverie.loop.collector.Collector`
    thread acts every ``1 / control_hz`` seconds with a policy copy while this thread runs the updates the
    train_ratio owes for the rows collected so far (:func:`reverie.loop.collector.run_with_collector`).

    Raises:
        ValueError: a numeric key outside its range (``config error: ...``, :mod:`reverie.configs.ranges`), before
            anything is written.
        reverie.state.resume.ResumeError: ``cfg`` changes a key that is not safe to change on resume.
        reverie.state.preflight.PreflightError: the replay and model do not fit in RAM or on disk.
        reverie.state.init_from.InitError, reverie.data.DatasetError: an ``init_from`` run that does not fit.
        ValueError: a bad ``trainer`` block, or ``trainer.nproc`` other than the number of processes started;
            ``train.async_collect`` is true but the envs cannot step in the background (set
            ``env.vector_mode=async``) or the agent's schedule waits for finished episodes
            (:func:`reverie.loop.collector.check_async_collect`).
    """
    check_ranges(cfg)
    nproc, backend = trainer_settings(cfg.get("trainer"), cfg.device)
    timeout = (cfg.get("trainer") or {}).get("timeout_min")
    info = init_process_group(cfg.device, backend, timeout_s=None if timeout is None else 60 * timeout)
    try:
        if info.world_size != nproc:
            raise ValueError(f"trainer.nproc={nproc} but {info.world_size} process(es) were started; start data-"
                             f"parallel runs with `reverie train ... trainer.nproc={nproc}` (it runs torchrun)")
        if info.distributed and "device" in cfg.agent.module:  # cuda -> cuda:<local rank>
            cfg.agent.module.device = str(info.device)
        saved, done = resume_point(cfg, Path(run_dir), info)
        if done is not None:
            return done
        check_async_collect(cfg)
        run = Session(cfg, Path(run_dir), info, saved, dataset=dataset)
        with run.running():  # progress bar; Ctrl-C / SIGTERM stop the loop after the step in flight
            if cfg.train.get("control_hz"):
                run_with_collector(run)  # a collector thread acts at a fixed rate while this one learns
            else:
                _loop(run)
        return run.finish()  # final evaluation, metrics, checkpoint, video, summary.json
    finally:
        destroy_process_group()


def _loop(run: Session) -> None:
    """One pass per env step of the ``N`` envs, until ``train.steps`` or a stop (see :meth:`Session.tick`)."""
    while run.loop.env_steps < run.steps:
        action = run.act()  # collect: random during the prefill, then the agent's exploration policy
        run.add_and_step(action)  # add row t = (obs_t, reward_t, flags_t, action_t); step the envs
        try:
            if run.learning():  # the prefill is done and replay holds a sequence
                for _ in range(run.owed()):  # ratio: the updates the schedule owes for these env steps
                    if run.update():  # update: agent.update(replay.sample(B, T)); True once it diverged
                        break
                run.report()  # the open-loop report, on its clock of updates
        finally:
            run.collected()  # train.async_collect: wait for the env step (no clock ever sees one in flight)
        if run.tick():  # log / eval / checkpoint on their clocks; True: stop_return, a signal or divergence
            break
