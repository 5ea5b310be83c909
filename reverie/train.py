"""The training loop of DreamerV3 (Hafner et al. 2023, algorithm 1) and PlaNet (Hafner et al. 2019, algorithm 1):
act (random during the prefill), add the row to replay and step the envs, run the updates the schedule owes, then
log, evaluate and checkpoint on their clocks. It knows agents only through the :class:`reverie.agents.base.Agent`
protocol; the bookkeeping is :class:`reverie.loop.session.Session`'s."""

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
    """Train the configured agent on the configured env in ``run_dir``, resuming its checkpoint if it has one
    (docs/resume.md; ``cfg`` may change only :data:`reverie.state.resume.SAFE_KEYS`; a finished run gives its summary).
    ``dataset``: ``init_from``'s replay when already read (docs/offline.md). ``trainer.nproc``, ``train.async_collect``
    and ``train.control_hz``: docs/speed.md. Returns ``{"env_steps", "updates", "eval_return", "evals",
    "best_eval_step", "best_eval_return", "wall_s", "interrupted", "diverged", "resumed_from"}`` (``summary.json``).

    Raises:
        ValueError: a config value out of range, a bad ``trainer`` block or process count, ``train.async_collect``
            where the envs cannot step in the background; ResumeError, PreflightError, InitError, DatasetError."""
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
