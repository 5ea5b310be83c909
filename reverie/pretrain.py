"""Offline pretraining (docs/offline.md): fill the replay with a dataset's rows, then run ``agent.update_model`` (or
``update`` with ``pretrain.behavior``) on its samples, with the same :class:`reverie.loop.session.Session` as
``reverie train`` (no envs stepped, the step is the update count), so the run directory is an ordinary one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from reverie.configs.ranges import check_ranges
from reverie.loop.session import Session
from reverie.runtime.process_group import DistInfo, trainer_settings
from reverie.state.resume import resume_point


def pretrain(cfg: DictConfig, run_dir: str | Path, dataset: Any = None) -> dict[str, Any]:
    """Pretrain the configured agent on ``cfg.pretrain.data`` in ``run_dir``, resuming its checkpoint if it has one;
    returns :func:`reverie.train.train`'s summary (``env_steps`` 0). Raises ValueError for ``trainer.nproc`` > 1 or an
    agent without ``update_model`` (unless ``pretrain.behavior``); DatasetError and ResumeError as ``reverie train``."""
    check_ranges(cfg)
    nproc, _ = trainer_settings(cfg.get("trainer"), cfg.device)
    if nproc != 1:
        raise ValueError(f"reverie pretrain runs in one process; got trainer.nproc={nproc}")
    info = DistInfo(device=torch.device(cfg.device))  # one process: no process group
    saved, done = resume_point(cfg, Path(run_dir), info, length=("pretrain", "updates"))
    if done is not None:
        return done
    run = Session(cfg, Path(run_dir), info, saved, offline=True, dataset=dataset)
    with run.running():  # progress bar; Ctrl-C / SIGTERM stop after the update in flight
        _loop(run)
    return run.finish()  # final evaluation (pretrain.eval_episodes), metrics, checkpoint, summary.json


def _loop(run: Session) -> None:
    """One pass per update, until ``pretrain.updates`` or a stop (see :meth:`Session.tick`)."""
    while run.step < run.steps:
        if run.update():  # update_model (or update) on a replay batch; True once it diverged
            break
        run.report()  # the open-loop report (and the held-out error), on its clock of updates
        if run.tick():  # log / eval / checkpoint on their clocks of updates; True: a signal or divergence
            break
