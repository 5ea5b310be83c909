"""Score files -> one tidy pandas table (:data:`COLUMNS`), one row per episode, evaluation point or bin.

Sources: official score files (danijar/dreamerv3 ``scores/``: current ``<suite>-<method>.json.gz`` and 2023
``<suite>_<method>.json.gz``), a JSON list of runs ``{"task", "method", "seed", "xs", "ys"}`` with ``xs`` in
environment frames; and reverie runs (``<run_dir>/scores.jsonl`` with ``config.yaml``). A file's ``(x, y)`` pairs
are read as episodes, bins or points (:func:`choose_reading`; the table in ``docs/compare.md``). Frames and agent
steps convert into each other only through the run's (or suite's) action repeat.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ["suite", "task", "method", "seed", "run", "frames", "agent_steps", "return", "bin_width", "mode"]
"""Tidy score table: ``suite`` (e.g. ``atari100k``), ``task`` (``atari_pong``, ``CartPole-v1``), ``method``,
``seed`` (int), ``run`` (one id per training run), ``frames`` (env frames at the episode end, the evaluation point
or the bin label), ``agent_steps`` (frames / action repeat), ``return`` (undiscounted episode return, or a bin
mean), ``bin_width`` (frames; 0 = one episode or evaluation point), ``mode`` (``train``/``eval``)."""

READINGS = ("auto", "bins", "points")
"""``--reading`` choices for score files on a regular grid (:func:`choose_reading`)."""

SUITE_ACTION_REPEAT = {"atari100k": 4, "atari57": 4, "dmc_proprio": 2, "dmc_vision": 2}
"""Action repeat of the official runs per suite (DreamerV3 configs: Atari repeat 4, DMC repeat 2); used only to
fill ``agent_steps`` of official files, whose ``xs`` are frames."""

SUITE_ALIASES = {"dmcproprio": "dmc_proprio", "dmcvision": "dmc_vision"}
"""2023 file names spell some suites without the underscore."""

TASK_ALIASES = {"dmc_cup_catch": "dmc_ball_in_cup_catch"}
"""The 2023 DMC files call ball_in_cup_catch ``cup_catch``."""


class ScoreFormatError(ValueError):
    """A score file that is not in any supported format; the message names the file and the expected format."""


@dataclasses.dataclass(frozen=True)
class Reading:
    """How a score file's ``(x, y)`` pairs were read: ``kind`` (``episodes``, ``bins`` or ``points``), the grid
    ``step`` in frames (0 off a grid) and ``why`` (``auto``'s reason, or ``--reading``)."""

    kind: str
    step: float
    why: str

    def describe(self) -> str:
        """One line for the report, e.g. ``bins of 10000 frames, [x, x + 10000) (auto: ...)``."""
        what = {"episodes": "episodes (one return per finished episode at x frames)",
                "bins": f"bins of {self.step:.10g} frames: y = mean return of the episodes ending in "
                        f"[x, x + {self.step:.10g})",
                "points": f"points on a {self.step:.10g}-frame grid: y = an evaluation at x frames"}[self.kind]
        return f"{what} ({self.why})"


# --- official score files ---

def read_official(path: str | Path, suite: str | None = None, method: str | None = None,
                  reading: str = "auto") -> pd.DataFrame:
    """:func:`read_score_file` without the :class:`Reading`: the tidy table alone."""
    return read_score_file(path, suite=suite, method=method, reading=reading)[0]


def read_score_file(path: str | Path, suite: str | None = None, method: str | None = None,
                    reading: str = "auto") -> tuple[pd.DataFrame, Reading]:
    """Read an official score file (either release, ``.json`` or ``.json.gz``) into ``(table, reading)``.

    ``suite`` defaults to the file name's, ``method`` to each run's own; rows have ``mode="train"`` and
    ``NaN``/``null`` returns are dropped. Raises FileNotFoundError (no file), ValueError (unknown ``reading``) and
    ScoreFormatError (not a JSON list of runs with ``task``/``method``/``seed`` and equal-length ``xs``/``ys``, or
    ``reading="bins"`` for ``xs`` off a regular grid).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"score file {path} does not exist")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            runs = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ScoreFormatError(f"{path} is not a (gzipped) JSON score file: {err}") from err
    _check_runs(runs, path)
    suite = suite or suite_from_filename(path)
    chosen = choose_reading(runs, reading, path)
    repeat = SUITE_ACTION_REPEAT.get(suite)
    parts = []
    for run in runs:
        xs = np.asarray(run["xs"], dtype=np.float64)
        ys = np.asarray([np.nan if y is None else y for y in run["ys"]], dtype=np.float64)
        keep = np.isfinite(ys)  # empty bins are NaN (2023) or null (current binned files)
        label, seed = method or str(run["method"]), int(run["seed"])
        parts.append(pd.DataFrame({"task": canonical_task(str(run["task"]), suite), "method": label, "seed": seed,
                                   "run": f"{label}/seed{seed}", "frames": xs[keep], "return": ys[keep]}))
    table = pd.concat(parts, ignore_index=True)
    table["seed"] = table["seed"].astype(np.int64)
    table["suite"] = suite
    table["agent_steps"] = table["frames"] / repeat if repeat else np.nan
    table["bin_width"] = float(chosen.step) if chosen.kind == "bins" else 0.0
    table["mode"] = "train"
    return table[COLUMNS], chosen


def choose_reading(runs: list[dict], reading: str = "auto", path: str | Path = "score file") -> Reading:
    """How to read ``runs`` (the file's JSON list): ``episodes`` off a regular grid; on one, ``reading``, or for
    ``auto`` ``points`` when some run has a score at x = 0 (an evaluation before training) and ``bins`` otherwise.
    Raises ValueError (``reading`` not in :data:`READINGS`) and ScoreFormatError (``bins`` off a grid)."""
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}; choose one of {', '.join(READINGS)}")
    step = grid_step(runs)
    if step == 0:
        if reading == "bins":
            raise ScoreFormatError(f"{path}: --reading bins needs xs on one regular grid, but these xs are irregular "
                                   f"(one entry per episode); use --reading auto or points")
        return Reading("episodes", 0.0, "auto: xs are not on one regular grid" if reading == "auto" else
                       "--reading points; off a grid, points are episodes")
    if reading != "auto":
        return Reading(reading, step, f"--reading {reading}")
    at_zero = any(np.isfinite(_float(y)) for run in runs for x, y in zip(run["xs"], run["ys"]) if float(x) == 0.0)
    if at_zero:
        return Reading("points", step, "auto: a regular grid with a score at x = 0, an evaluation before training; "
                                       "--reading bins to read them as bins")
    return Reading("bins", step, "auto: a regular grid without a score at x = 0; --reading points to read each x as "
                                 "an evaluation point")


def grid_step(runs: list[dict]) -> float:
    """Grid step of ``xs`` when every run's ``xs`` lie on one regular grid, else 0."""
    steps = set()
    for run in runs:
        xs = np.asarray(run["xs"], dtype=np.float64)
        if len(xs) < 3:
            continue
        diffs = np.diff(xs)
        if not np.allclose(diffs, diffs[0]) or diffs[0] <= 0:
            return 0.0
        steps.add(float(diffs[0]))
    if len(steps) != 1:
        return 0.0
    step = steps.pop()
    on_grid = all(np.allclose(np.asarray(r["xs"], np.float64) / step, np.round(np.asarray(r["xs"], np.float64) / step))
                  for r in runs)
    return step if on_grid else 0.0


def _float(y: object) -> float:
    return np.nan if y is None else float(y)  # type: ignore[arg-type]


def suite_from_filename(path: str | Path) -> str:
    """``atari100k-dreamerv3.json.gz`` -> ``atari100k``; ``dmcproprio_dreamerv3.json.gz`` -> ``dmc_proprio``."""
    name = Path(path).name.split(".json")[0]
    suite = name.split("-")[0] if "-" in name else name.rsplit("_", 1)[0]
    return SUITE_ALIASES.get(suite, suite)


def _check_runs(runs: object, path: Path) -> None:
    expected = "a JSON list of runs {task, method, seed, xs, ys} (danijar/dreamerv3 scores/ format)"
    if not isinstance(runs, list) or not runs:
        raise ScoreFormatError(f"{path}: expected {expected}, got {type(runs).__name__}")
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not {"task", "method", "seed", "xs", "ys"} <= set(run):
            raise ScoreFormatError(f"{path}: run {i} lacks keys; expected {expected}")
        if len(run["xs"]) != len(run["ys"]):
            raise ScoreFormatError(f"{path}: run {i} ({run['task']}, seed {run['seed']}) has "
                                   f"{len(run['xs'])} xs but {len(run['ys'])} ys")
        try:
            int(run["seed"])
        except (TypeError, ValueError) as err:
            raise ScoreFormatError(f"{path}: run {i} has seed {run['seed']!r}, not an integer") from err


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def canonical_task(name: str, suite: str) -> str:
    """One spelling per task, the official files': ``ALE/MsPacman-v5`` or ``MsPacman`` -> ``atari_ms_pacman``
    under an Atari suite (``dmc_`` under DMC); other suites keep the name."""
    prefix = "atari_" if suite.startswith("atari") else "dmc_" if suite.startswith("dmc") else None
    if prefix is None:
        return name
    base = name.split("/")[-1]
    base = re.sub(r"(NoFrameskip)?-v\d+$", "", base)
    if not base.startswith(prefix):
        base = prefix + _CAMEL.sub("_", base).lower().replace("-", "_")
    return TASK_ALIASES.get(base, base)


# --- reverie runs ---

def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories (folders holding ``scores.jsonl``) in ``paths``, each a run or a folder of runs at any depth.
    Raises FileNotFoundError when a path does not exist or holds no ``scores.jsonl``."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist (expected a run directory or a folder of runs)")
        if (p / "scores.jsonl").is_file():
            found = [p]
        else:
            found = sorted(f.parent for f in p.rglob("scores.jsonl"))
        if not found:
            raise FileNotFoundError(f"{p} holds no scores.jsonl: not a reverie run directory nor a folder of runs "
                                    f"(runs write <run_dir>/scores.jsonl during `reverie train`)")
        runs += [r for r in found if r not in runs]
    return runs


def read_run(run_dir: str | Path, suite: str = "generic", method: str = "reverie",
             mode: str | None = "train") -> pd.DataFrame:
    """Read one reverie run (``scores.jsonl`` + ``config.yaml``) into the tidy table, ``suite``/``method`` as labels.

    ``frames`` come from each record's ``frames`` (else ``step x env.action_repeat``), ``agent_steps`` from its
    ``step``; the task is ``env.task`` or ``env.id`` in the suite's spelling. ``mode`` keeps ``train`` or ``eval``
    episodes (None: both). Raises FileNotFoundError (no ``scores.jsonl``/``config.yaml``) and ScoreFormatError (a
    line is not a JSON object with ``step`` and ``return``).
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    env = config.get("env") or {}
    repeat = int(env.get("action_repeat") or 1)
    task = canonical_task(str(env.get("task") or env.get("id") or "unknown"), suite)
    rows = []
    with open(run_dir / "scores.jsonl", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step = int(rec["step"])
                ret = float(rec["return"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ScoreFormatError(
                    f"{run_dir / 'scores.jsonl'} line {number} is not a reverie episode record "
                    f'{{"step", "frames", "return", "length", "mode"}}: {line.strip()[:80]!r}') from err
            frames = int(rec["frames"]) if rec.get("frames") is not None else step * repeat
            rows.append((step, frames, ret, rec.get("mode", "train")))
    table = pd.DataFrame(rows, columns=["agent_steps", "frames", "return", "mode"])
    if len(table) and not (table["frames"] == table["agent_steps"] * repeat).all():
        warnings.warn(f"{run_dir}: recorded frames differ from step x env.action_repeat ({repeat}); using the "
                      f"recorded frames", stacklevel=2)
    if mode is not None:
        table = table[table["mode"] == mode]
    table = table.assign(suite=suite, task=task, method=method, seed=int(config.get("seed", 0)),
                         run=str(run_dir), bin_width=0.0)
    table["frames"] = table["frames"].astype(np.float64)
    table["agent_steps"] = table["agent_steps"].astype(np.float64)
    return table[COLUMNS].reset_index(drop=True)


def read_run_config(run_dir: Path) -> dict:
    """The run's ``config.yaml`` as a plain dict; FileNotFoundError without ``scores.jsonl`` or ``config.yaml``."""
    for name in ("scores.jsonl", "config.yaml"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir} has no {name}; a reverie run directory holds config.yaml and "
                                    f"scores.jsonl (written by `reverie train`)")
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=False)  # type: ignore[return-value]


def read_runs(paths: list[str | Path], suite: str = "generic", method: str = "reverie",
              mode: str | None = "train") -> pd.DataFrame:
    """:func:`find_runs` then :func:`read_run` on each; one table."""
    tables = [read_run(r, suite=suite, method=method, mode=mode) for r in find_runs(paths)]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=COLUMNS)

