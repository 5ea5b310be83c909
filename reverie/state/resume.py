"""Resuming a run: where to resume from, which config changes are safe, and the run directory's bookkeeping.

``reverie train --resume D [overrides]`` (or ``run_dir=D``) resumes from the saved resolved config; a changed key
is applied when it is in :data:`SAFE_KEYS` and rejected with :class:`ResumeError` otherwise, never ignored.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Keys (or prefixes) that may change on resume; the rest (agent, size, env, replay, seed, device) shapes the state.
SAFE_KEYS = (
    "train.steps", "train.log_every", "train.eval_every", "train.eval_episodes", "train.eval_mode",
    "train.checkpoint_every", "train.checkpoint_keep", "train.video", "train.progress", "train.stop_return",
    "train.stop_evals", "train.stop_confirm", "train.max_minutes",
    "train.max_nonfinite_updates", "train.env_retries", "train.report_every", "threads", "cpu_keep_freed_memory",
    "logger", "exp_name",
    "run_dir",
    "train.async_collect",  # wall time only: the run is the same with it on or off (tests/loop/test_async_collect.py)
    "replay.preflight", "trainer.timeout_min",
    "train.policy_sync_every",  # with train.control_hz: how fresh the acting copy is; no state depends on it
    "pretrain.updates", "pretrain.log_every", "pretrain.eval_every", "pretrain.eval_episodes",
    "pretrain.checkpoint_every", "pretrain.report_every",
    "pretrain.heldout", "pretrain.heldout_sequences",  # reports only: their own RNG, training is unchanged
)  # not trainer.nproc: each rank's replay shard, env and RNG state belong to one process count
SUMMARY_FILE = "summary.json"  # written when training finishes uninterrupted: "this run (or trial) is done"
OVERRIDES_FILE = "overrides.json"  # the command-line overrides the run was started with


class ResumeError(ValueError):
    """A resume that cannot continue the saved run as asked; the message names the keys and the fix."""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, name + ".")
        else:
            out[name] = value
    return out


def is_safe(key: str) -> bool:
    """True when ``key`` is one of :data:`SAFE_KEYS` or lies under one of them."""
    return any(key == safe or key.startswith(safe + ".") for safe in SAFE_KEYS)


def config_changes(saved: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, new)}`` for keys whose value differs between two resolved configs; keys on one side only
    (settings added or removed since the run started) are not changes."""
    a, b = flatten(saved), flatten(new)
    return {key: (a[key], b[key]) for key in sorted(a.keys() & b.keys()) if a[key] != b[key]}


def check_resume_config(saved: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Accept the safe changes between ``saved`` and ``new`` and return them (``run_dir`` excluded); raise
    ResumeError listing any change to a key outside :data:`SAFE_KEYS`, the safe keys and how to start anew."""
    changes = {k: v for k, v in config_changes(saved, new).items() if k != "run_dir"}
    unsafe = {k: v for k, v in changes.items() if not is_safe(k)}
    if unsafe:
        listed = "\n".join(f"  {k}: {old!r} (saved) -> {value!r} (now)" for k, (old, value) in unsafe.items())
        raise ResumeError(
            f"cannot resume with these config changes (they change the run being continued):\n{listed}\n"
            f"Keys that may change on resume: {', '.join(SAFE_KEYS)}. Drop those overrides to resume, or start a "
            f"new run in another run_dir (optionally from this run's config.yaml). If you gave none of them, a preset "
            f"changed since the run started: add the run's own values to the resume command: "
            f"{' '.join(override_text(k, old) for k, (old, _) in unsafe.items())}")
    return changes


def override_text(key: str, value: Any) -> str:
    """``key=value`` as a command-line override (``null``, ``true``/``false``, lists in brackets)."""
    def text(v: Any) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(text(x) for x in v) + "]"
        return str(v)
    return f"{key}={text(value)}"


RESUME_KEYS = ("agent", "replay_meta", "ratio", "counters", "clocks", "rng", "stepper", "row", "act_state", "config")


def check_resumable(payload: Mapping[str, Any], path: str | Path) -> None:
    """Raise ResumeError when a checkpoint lacks what an exact resume needs (it still loads for ``load_run``)."""
    missing = [key for key in RESUME_KEYS if key not in payload]
    if missing:
        raise ResumeError(f"checkpoint {path} cannot be resumed: it lacks {missing} (written before reverie saved "
                          f"full run state). It still loads for acting and evaluation (`reverie eval`); start a "
                          f"new run in another run_dir to train.")


def resume_point(cfg: Any, run_dir: str | Path, info: Any,
                 length: tuple[str, str] = ("train", "steps")) -> tuple[dict | None, dict | None]:
    """What ``reverie train`` (or ``pretrain``) continues in ``run_dir``: ``(saved, done)``.

    ``saved`` is this rank's newest readable checkpoint payload, checked for full run state and safe config changes
    (printed), or None for a fresh run; ``done`` is the summary of a finished run whose ``length`` key
    (``train.steps``, ``pretrain.updates``) is not raised, else None (a raised length removes the completion
    marker). Raises ResumeError from :func:`check_resumable` and :func:`check_resume_config`.
    """
    from omegaconf import OmegaConf

    from reverie.state.ranks import load_rank_checkpoint

    run_dir = Path(run_dir)
    saved = load_rank_checkpoint(run_dir, info)  # rank r > 0: its own state + rank 0's agent
    if saved is None:
        return None, None
    check_resumable(saved, saved["checkpoint_path"])
    changes = check_resume_config(saved["config"], OmegaConf.to_container(cfg, resolve=True))
    done = finished(run_dir, cfg, saved["config"], length)
    if done is not None:
        return saved, done
    if info.is_main:
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)
    for key, (old, new) in changes.items():
        print(f"[reverie] resume: {key} {old!r} -> {new!r}")
    return saved, None


def finished(run_dir: str | Path, cfg: Any, saved_config: Mapping[str, Any],
             length: tuple[str, str] = ("train", "steps")) -> dict[str, Any] | None:
    """The summary of a finished run that ``cfg`` does not lengthen (the key ``length``, e.g. ``train.steps``, not
    raised above the saved config's), with a message saying how to continue it; else None."""
    group, key = length
    done = read_summary(run_dir)
    if done is None:
        return None
    lengthened = int(cfg[group][key]) > int(saved_config[group][key])
    if length == ("train", "steps") and done["env_steps"] < int(saved_config["train"]["steps"]):
        why = early_stop(done, cfg["train"], saved_config["train"], lengthened)  # stopped before train.steps
        if why is None:
            return None  # the new limits let it go on
        print(f"[reverie] {run_dir} stopped at {done['env_steps']} of {saved_config['train']['steps']} env steps "
              f"(summary.json): {why}")
        return done
    if not lengthened:
        print(f"[reverie] {run_dir} already finished ({done['updates']} updates, {done['env_steps']} env steps, "
              f"summary.json); raise {group}.{key} above {saved_config[group][key]} to continue it")
        return done
    return None


def early_stop(done: Mapping[str, Any], train: Mapping[str, Any], saved_train: Mapping[str, Any],
               lengthened: bool = False) -> str | None:
    """Why a run that stopped before ``train.steps`` (``done``, its summary) still stops under the new ``train``
    settings, with how to continue it; None when a larger ``max_minutes``, a higher ``stop_return`` (or null), a
    larger ``stop_evals``/``stop_confirm`` or, for another cause, ``lengthened`` lets it go on. The cause is the
    summary's ``stopped_by`` (older summaries: judged by their numbers)."""
    budget, saved_budget = train.get("max_minutes"), saved_train.get("max_minutes")
    target, saved_target = train.get("stop_return"), saved_train.get("stop_return")
    cause = done.get("stopped_by")
    if cause is None and "stopped_by" not in done:  # an older summary
        if saved_budget is not None and done["wall_s"] >= 60.0 * saved_budget:
            cause = "max_minutes"
        elif isinstance(saved_target, (int, float)) and done["eval_return"] >= saved_target:
            cause = "stop_return"
    if cause == "max_minutes":
        if budget is None or done["wall_s"] < 60.0 * budget:
            return None
        return (f"its train.max_minutes={saved_budget:g} is spent ({done['wall_s'] / 60:.1f} min); give a larger "
                f"train.max_minutes (or train.max_minutes=null) to continue it")
    if cause == "stop_return":
        if target is None or (target != saved_target if isinstance(target, str)
                              else not done["eval_return"] >= target):
            return None  # no target, another named one (solved), or a number above the return it stopped at
        if int(train.get("stop_evals", 1)) > int(saved_train.get("stop_evals", 1)) or \
                int(train.get("stop_confirm", 0) or 0) > int(saved_train.get("stop_confirm", 0) or 0):
            return None  # more evaluations in a row, or a longer confirmation, than the run stopped at
        shown = saved_target if isinstance(saved_target, str) else f"{saved_target:g}"
        return (f"its eval return {done['eval_return']:.1f} reached train.stop_return={shown}; give a higher "
                f"train.stop_return (or train.stop_return=null, or a larger train.stop_evals) to continue it")
    if lengthened:
        return None
    return f"it stopped early; raise train.steps above {saved_train['steps']} to continue it"


def save_overrides(run_dir: str | Path, overrides: list[str]) -> None:
    """Record the command-line overrides of a new run (``overrides.json``) so a resume can recompose them."""
    (Path(run_dir) / OVERRIDES_FILE).write_text(json.dumps(list(overrides)))


def saved_overrides(run_dir: str | Path) -> list[str] | None:
    """The overrides a run was started with, or None when the run directory has no ``overrides.json``."""
    path = Path(run_dir) / OVERRIDES_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def merge_overrides(old: list[str], new: list[str]) -> list[str]:
    """``old`` then ``new`` Hydra overrides, the new one winning for the same key (one override per key)."""
    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    replaced = {key(o) for o in new}
    return [o for o in old if key(o) not in replaced] + list(new)


def truncate_jsonl(path: str | Path, step: int) -> int:
    """Drop the rows of a ``metrics.jsonl``/``scores.jsonl`` after env step ``step`` and an unreadable last line
    (a write cut by a kill); returns how many were removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if row.get("step", 0) > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
    return dropped


def write_summary(run_dir: str | Path, summary: Mapping[str, Any]) -> Path:
    """Write ``run_dir/summary.json`` (atomically): the completion marker sweeps rely on."""
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(path)
    return path


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The summary of a finished run, or None when the run has not finished."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def resume_command(run_dir: str | Path, environ: Mapping[str, str] | None = None,
                   argv0: str | None = None, command: str = "train") -> str:
    """The shell command that resumes ``run_dir`` as ``reverie <command> --resume <run_dir>``, runnable from here.

    Under ``make train`` (``REVERIE_MAKE_TRAIN=1``) it is ``make train ARGS="--resume <run_dir>"``; otherwise the
    launcher is ``reverie``, its path when another one is on ``PATH``, or ``python -m reverie``.
    """
    environ = os.environ if environ is None else environ
    argv0 = sys.argv[0] if argv0 is None else argv0
    target = shlex.quote(str(run_dir))
    if environ.get("REVERIE_MAKE_TRAIN") and command == "train":
        return f'make train ARGS="--resume {target}"'
    if os.path.basename(argv0) == "__main__.py":  # python -m reverie
        python = "python" if _same_file(shutil.which("python"), sys.executable) else shlex.quote(sys.executable)
        launcher = f"{python} -m reverie"
    elif os.path.basename(argv0) == "reverie" and not _same_file(shutil.which("reverie"), argv0):
        launcher = shlex.quote(argv0)
    else:
        launcher = "reverie"
    return f"{launcher} {command} --resume {target}"


def _same_file(a: str | None, b: str | None) -> bool:
    try:
        return a is not None and b is not None and os.path.samefile(a, b)
    except OSError:
        return False
