"""One trial = one ordinary ``reverie train`` run directory, run as a subprocess inside a Ray Tune trial.

``<sweep>/trials/<config-id>_seed<k>/`` holds what ``reverie train run_dir=<dir>`` writes plus ``train.log``,
``sweep_trial.json`` and, once finished, ``summary.json``: the only sign of a finished trial, never run again
(docs/sweep.md). A subprocess because ``train`` turns SIGTERM into a checkpointed stop only in a main thread, and
Hydra state, torch threads and crashes stay per trial. Stopping: Tune's stop sends SIGTERM; the child runs in its
own session (Ray kills the worker's process group) and gets SIGTERM when its worker dies (``PR_SET_PDEATHSIG``).
A retry continues from the trial's checkpoint, or moves a checkpoint-less attempt's files to ``attempts/<n>/``.
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


def command_args(command: str, data: str | None) -> list[str]:
    """The command word and its positional argument: ``["train"]`` or ``["pretrain", data]``."""
    return [command, *([data] if command == "pretrain" else [])]


def train_command(run_dir: Path, params: dict[str, Any], seed: int, base: list[str], threads: int,
                  command: str = "train", data: str | None = None) -> list[str]:
    """The ``python -m reverie train`` (or ``pretrain DATA``) command: base overrides, swept values, seed, run_dir,
    ``threads``."""
    cmd = [sys.executable, "-m", "reverie", *command_args(command, data), *base, *overrides(params), f"seed={seed}",
           f"run_dir={_quoted(run_dir)}"]
    if not any(o.split("=", 1)[0] == "threads" for o in base):
        cmd.append(f"threads={threads}")
    return cmd


def run_trial(config: dict[str, Any], setup: dict[str, Any]) -> None:
    """Ray Tune function trainable: run one configuration over its seeds, one subprocess per seed, in turn.

    ``config``: ``{"trial": {"params", "seed"}}`` (grid/random: one seed) or ``{"params"}`` (Optuna: every seed
    of ``setup["seeds"]``); ``setup``: :func:`reverie.sweep.runner.trial_setup`. Reports ``{metric, "env_steps",
    "done", "seeds_done"}`` per evaluation and per finished seed (at the end: the mean over seeds).
    Raises TrialError when a subprocess exits without ``summary.json`` (Tune then retries).
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
    """Run ``reverie train`` in ``run_dir`` (calling ``report(env_steps, mean_eval_return)`` per evaluation) and
    return its summary; a finished (or ASHA-stopped) directory returns its file unrun, a Tune stop
    ``{"stopped": True}``. Raises TrialError when the subprocess exits without ``summary.json``."""
    for name in (SUMMARY, STOPPED):
        if (run_dir / name).is_file():
            return json.loads((run_dir / name).read_text(encoding="utf-8"))
    _set_aside_failed_attempt(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = train_command(run_dir, params, seed, list(setup["base"]), int(setup["threads"]),
                        setup.get("command", "train"), setup.get("data"))
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
        raise TrialError(f"trial {run_dir.name} failed: `reverie {setup.get('command', 'train')}` exited with status "
                         f"{proc.returncode} without writing {SUMMARY}. Last lines of {run_dir / LOG}:\n"
                         + "\n".join(tail))
    return json.loads((run_dir / SUMMARY).read_text(encoding="utf-8"))


class EvalWatcher:
    """Follows a growing ``scores.jsonl``; ``new_evals`` returns completed evaluations as ``(env_step, mean_return)``:
    ``mode == "eval"`` records sharing a ``step``, complete once a later record follows them."""

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
    """True once Ray Tune asked this trial to stop; reads Tune's private session flag (no public API)."""
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
