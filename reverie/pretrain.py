"""Offline pretraining (docs/offline.md): learn from logged episodes without stepping an env::

    fill      the replay with the dataset's rows (validated against the env config; nothing is loaded half)
    while updates < pretrain.updates:
        update    agent.update_model(replay.sample(B, T)) (world model only), or agent.update with pretrain.behavior
        report / log / eval / checkpoint on their clocks, counted in updates

The same :class:`reverie.loop.session.Session` as ``reverie train`` runs it (offline: no envs are stepped, the
run's step is the update count), so logging, open-loop reports, evaluations in the env, checkpoints, Ctrl-C and
exact resume work as for training, and the run directory is an ordinary one: ``reverie eval``, ``load_run`` and
``reverie train init_from=RUN`` read it.
"""

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
    """Pretrain the configured agent on ``cfg.pretrain.data``, resuming ``run_dir``'s checkpoint if it has one.

    Args:
        cfg: the resolved root config; ``pretrain.data`` names the dataset, ``pretrain.*`` the length and clocks.
        run_dir: the run directory (the files of :func:`reverie.train.train`'s, ``replay/`` holding the dataset).
        dataset: the validated dataset when the caller has read it already (:func:`reverie.data.load_dataset`);
            None reads ``pretrain.data``. Unused on resume: the checkpoint holds the replay.

    Returns:
        The summary of :func:`reverie.train.train` (``env_steps`` 0; ``evals`` at update counts); a finished run
        whose ``pretrain.updates`` is not raised returns its summary without training.

    Raises:
        ValueError: ``trainer.nproc`` > 1 (pretraining runs in one process); an agent without ``update_model``
            unless ``pretrain.behavior``.
        reverie.data.DatasetError: the dataset does not load or fit (see :func:`reverie.data.load_dataset`).
        reverie.state.resume.ResumeError: a resume with unsafe config changes.
    """
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
