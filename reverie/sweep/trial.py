"""One trial = one ordinary ``reverie train`` run directory, run as a subprocess inside a Ray Tune trial.

Layout: ``<sweep>/trials/<config-id>_seed<k>/`` holds everything ``reverie train run_dir=<that dir>`` writes
(``config.yaml``, ``scores.jsonl``, ``checkpoints/``, ...) plus ``train.log`` (its stdout and stderr),
``sweep_trial.json`` (configuration id, parameters, seed, command) and, once training finished,
``summary.json`` (the summary that :func:`reverie.train.train` returned). ``summary.json`` is the only sign of a
finished trial: a trial whose directory has it is never run again, which is how a rerun of an interrupted sweep
skips finished work.

Why a subprocess rather than calling ``train`` in the Ray worker: the trial runs exactly the command a user would
type (``python -m reverie train ...``); Hydra's global state and torch's thread settings stay per trial; a crash
(segfault, out of memory) fails one trial, not the Ray worker; and ``train`` turns SIGTERM into a clean stop with
a checkpoint only in a main thread, which a Ray function trainable is not. On Linux the child gets SIGTERM when
the Ray worker thread that started it dies (``PR_SET_PDEATHSIG``), so killing the sweep driver never leaves
orphaned training runs writing into the sweep.

Stopping: when Tune stops a trial (Ctrl-C of the driver, ASHA) the subprocess gets SIGTERM and ``reverie train``
writes a checkpoint before it exits. The local Ray is started with ``kill_child_processes_on_worker_exit`` off so that
Ray does not SIGKILL it first, and the subprocess runs in its own session, out of the worker's process group (which
Ray also kills); the parent-death signal above still ends it when its worker dies.

Retries: when a trial fails, Ray Tune runs it again (``retries``) with the same command on the same directory.
With a checkpoint there, ``reverie train run_dir=<dir>`` continues from it (the checkpoint/resume contract);
a directory without a checkpoint had nothing worth keeping for training, so its files are first moved to
``attempts/<n>/`` (kept for inspection) and the trial starts clean.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reverie.sweep.space import config_id, overrides, trial_name

SUMMARY = "summary.json"
TRIAL_META = "sweep_trial.json"
STOPPED = "sweep_stopped.json"
"""Written by the ASHA scheduler wrapper when it stops a trial early; a rerun then skips the trial too."""
LOG = "train.log"
POLL_S = 2.0


class TrialError(RuntimeError):
    """A training subprocess exited without writing ``summary.json``; the message holds the end of its log."""


def trial_dir(sweep_dir: str | Path, params: dict[str, Any], seed: int) -> Path:
    """``<sweep>/trials/<config-id>_seed<k>``."""
    return Path(sweep_dir) / "trials" / trial_name(config_id(params), seed)


def train_command(run_dir: Path, params: dict[str, Any], seed: int, base: list[str], threads: int) -> list[str]:
    """The ``python -m reverie train`` command of one trial: base overrides, then the swept values, then seed,
    run_dir and (unless base sets it) ``threads``."""
    cmd = [sys.executable, "-m", "reverie", "train", *base, *overrides(params), f"seed={seed}",
           f"run_dir={_quoted(run_dir)}"]
    if not any(o.split("=", 1)[0] == "threads" for o in base):
        cmd.append(f"threads={threads}")
    return cmd


def run_trial(config: dict[str, Any], setup: dict[str, Any]) -> None:
    """Ray Tune function trainable: run one configuration over its seeds, one subprocess per seed, in turn.

    Args:
        config: from Tune's param space: ``{"trial": {"params": {...}, "seed": k}}`` for grid/random searches
            (one seed per Tune trial), or ``{"params": {...}}`` for Optuna (every seed of ``setup["seeds"]``).
        setup: shared settings (:func:`reverie.sweep.runner.trial_setup`): ``sweep_dir``, ``base`` overrides,
            ``seeds``, ``threads``, ``cwd``, ``python_path``, ``metric``.

    Reports (``ray.tune.report``): ``{metric: return, "env_steps": k, "done": bool, "seeds_done": n}`` after each
    evaluation of the running seed and once per finished seed; the metric is the running seed's last evaluation
    until every seed is done, then the mean over seeds of the final evaluation.

    Raises:
        TrialError: a training subprocess exited without ``summary.json`` (Tune then retries the trial).
    """
    from ray import tune

    if "trial" in config:
        params, seeds = dict(config["trial"]["params"]), [int(config["trial"]["seed"])]
    else:  # optuna: round like space.sample so ids and overrides agree
        params = {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in config["params"].items()}
        seeds = [int(s) for s in setup["seeds"]]
    metric = setup["metric"]
    finals: list[float] = []
    for seed in seeds:

        def report(step: int, value: float) -> None:  # an evaluation of the running seed (eval_return only)
            if metric == "eval_return":
                tune.report({metric: value, "env_steps": step, "done": False, "seeds_done": len(finals)})

        summary = run_seed(trial_dir(setup["sweep_dir"], params, seed), params, seed, setup, report)
        if summary.get("stopped"):
            return
        finals.append(float(summary.get(metric, float("nan"))))
        done = len(finals) == len(seeds)
        tune.report({metric: sum(finals) / len(finals) if done else finals[-1], "done": done,
                     "env_steps": int(summary.get("env_steps", 0)), "seeds_done": len(finals)})


def run_seed(run_dir: Path, params: dict[str, Any], seed: int, setup: dict[str, Any],
             report: Callable[[int, float], None]) -> dict[str, Any]:
    """Run (or skip) one trial directory; return its summary.

    A directory with ``summary.json`` is finished: its summary is returned without running anything. One with
    ``sweep_stopped.json`` (stopped early by ASHA) returns that file's summary. Otherwise ``reverie train`` runs
    there, ``report(env_steps, mean_eval_return)`` is called for each evaluation it completes, and the summary it
    writes is returned; ``{"stopped": True}`` when Tune stopped the trial meanwhile.

    Raises:
        TrialError: the subprocess exited without writing ``summary.json``.
    """
    for name in (SUMMARY, STOPPED):
        if (run_dir / name).is_file():
            return json.loads((run_dir / name).read_text(encoding="utf-8"))
    _set_aside_failed_attempt(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = train_command(run_dir, params, seed, list(setup["base"]), int(setup["threads"]))
    meta = {"config_id": config_id(params), "params": params, "seed": seed, "command": cmd}
    (run_dir / TRIAL_META).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS=str(setup["threads"]), MKL_NUM_THREADS=str(setup["threads"]))
    if setup.get("python_path"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [setup["python_path"], env.get("PYTHONPATH")]))
    watcher = EvalWatcher(run_dir / "scores.jsonl")
    with open(run_dir / LOG, "a", encoding="utf-8") as log:
        log.write(f"\n[sweep] {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=setup.get("cwd") or None, env=env,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                                start_new_session=True)  # out of the worker's process group, which Ray kills
        try:
            while proc.poll() is None and not _stop_requested():
                time.sleep(POLL_S)
                for step, value in watcher.new_evals():
                    report(step, value)
        finally:
            if proc.poll() is None:  # the trial was stopped or the worker is shutting down: stop training cleanly
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    if not (run_dir / SUMMARY).is_file() and _stop_requested():
        return {"stopped": True}  # Tune stopped the trial: nothing to report, nothing failed
    if not (run_dir / SUMMARY).is_file():
        tail = (run_dir / LOG).read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise TrialError(f"trial {run_dir.name} failed: `reverie train` exited with status {proc.returncode} without "
                         f"writing {SUMMARY}. Last lines of {run_dir / LOG}:\n" + "\n".join(tail))
    return json.loads((run_dir / SUMMARY).read_text(encoding="utf-8"))


class EvalWatcher:
    """Follows a growing ``scores.jsonl`` and yields each completed evaluation as ``(env_step, mean_return)``.

    An evaluation is the group of ``mode == "eval"`` records sharing a ``step``; it counts as complete once a later
    record (of any mode) follows it, so a half-written evaluation is never reported.
    """

    def __init__(self, path: Path):
        self.path, self.offset, self.pending_step, self.pending = path, 0, None, []

    def new_evals(self) -> list[tuple[int, float]]:
        if not self.path.is_file():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]  # never parse a half-written line
        self.offset += len(complete.encode("utf-8"))
        done = []
        for line in complete.splitlines():
            try:
                rec = json.loads(line)
                step = int(rec["step"])
            except (ValueError, KeyError, TypeError):
                continue
            if self.pending and step != self.pending_step or self.pending and rec.get("mode") != "eval":
                done.append((self.pending_step, sum(self.pending) / len(self.pending)))
                self.pending = []
            if rec.get("mode") == "eval":
                self.pending_step = step
                self.pending.append(float(rec["return"]))
        return done


def _set_aside_failed_attempt(run_dir: Path) -> None:
    """Move the files of an earlier attempt that left no checkpoint to ``attempts/<n>/`` (nothing is deleted)."""
    if not run_dir.is_dir():
        return
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        return  # `reverie train run_dir=<dir>` continues from the checkpoint
    entries = [p for p in run_dir.iterdir() if p.name != "attempts"]
    if not entries:
        return
    attempts = run_dir / "attempts"
    target = attempts / str(len(list(attempts.glob("*"))) + 1 if attempts.is_dir() else 1)
    target.mkdir(parents=True)
    for p in entries:
        shutil.move(str(p), str(target / p.name))


def _stop_requested() -> bool:
    """True once Ray Tune asked this trial to stop (Ctrl-C of the driver, ASHA): then the training subprocess gets
    SIGTERM, so it writes a checkpoint before the Ray worker goes away. Reads Tune's session flag (no public API)."""
    try:
        from ray.train._internal.session import get_session

        session = get_session()
        return bool(session is not None and session.stop_event.is_set())
    except (ImportError, AttributeError):
        return False


def _quoted(path: Path) -> str:
    """A path as a Hydra override value: quoted when it holds characters the override grammar treats specially."""
    text = str(path)
    return text if re.fullmatch(r"[A-Za-z0-9_./+-]+", text) else "'" + text.replace("'", "\\'") + "'"


def _die_with_parent() -> None:
    """In the child before exec (Linux): ask the kernel for SIGTERM when the parent thread dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass
