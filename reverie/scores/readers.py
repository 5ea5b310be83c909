"""Score files -> one tidy pandas table.

Three sources, one table (:data:`COLUMNS`), one row per episode, evaluation point or bin of episodes:

* **Official score files, current format** (``<suite>-<method>.json.gz``, danijar/dreamerv3 ``scores/``, for
  DreamerV3 and the other methods shipped there: ``ppo_fixhp``, ``drqv2``, ...): a JSON list of runs
  ``{"task", "method", "seed": int, "xs": [...], "ys": [...]}``. ``xs`` are environment frames (agent steps x
  action repeat) and ``ys`` returns.
* **Official score files, 2023 format** (``<suite>_<method>.json.gz``, the 2023 ``scores/data/``): the same keys
  with string seeds (``"0"``); ``NaN`` where a bin is empty.
* **reverie runs**: ``<run_dir>/scores.jsonl`` (``{"step", "frames", "return", "length", "mode"}`` per
  episode) with ``<run_dir>/config.yaml`` (``env.id``/``env.task``, ``env.action_repeat``, ``seed``).

A score file's ``(x, y)`` pairs are read one of three ways (:data:`READINGS`, :func:`choose_reading`):

* ``episodes``: ``xs`` not on one regular grid: each pair is one finished episode (return ``y`` at ``x`` frames);
* ``bins``: ``xs`` on a regular grid of step ``w`` (DreamerV3's ``atari100k`` 2023, ``dmc_proprio``, ``atari57``):
  ``y`` is the mean return of the episodes that ended in ``[x, x + w)``; the row keeps ``bin_width = w``. With
  that reading the 2023 atari100k file reproduces the 2023 paper's per-game table exactly (``docs/compare.md``);
* ``points``: ``xs`` on a grid, each pair an evaluation at ``x`` frames (e.g. DrQ-v2, CURL and SAC on DMC vision:
  x = 0, 20k, 40k, ...); the row is a point (``bin_width = 0``) like an episode.

``auto`` (the default) picks ``episodes`` off a grid, ``points`` on a grid that has a score at x = 0 (an
evaluation of the untrained agent: no episode has ended by frame 0, and DreamerV3's binned files have no score
there), else ``bins``. Frames and agent steps are separate columns and are never converted into each other
except through the run's (or suite's) action repeat.
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
    """How a score file's ``(x, y)`` pairs were read.

    Attributes:
        kind: ``episodes``, ``bins`` or ``points``.
        step: the grid step in frames (0 off a grid).
        why: ``auto``'s reason, or ``--reading`` when the user chose.
    """

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


# ---------------------------------------------------------------------------------------------------------
# official score files
# ---------------------------------------------------------------------------------------------------------

def read_official(path: str | Path, suite: str | None = None, method: str | None = None,
                  reading: str = "auto") -> pd.DataFrame:
    """:func:`read_score_file` without the :class:`Reading`: the tidy table alone."""
    return read_score_file(path, suite=suite, method=method, reading=reading)[0]


def read_score_file(path: str | Path, suite: str | None = None, method: str | None = None,
                    reading: str = "auto") -> tuple[pd.DataFrame, Reading]:
    """Read a score file in the official format (either release) into the tidy table (:data:`COLUMNS`).

    Args:
        path: ``<suite>-<method>.json.gz`` (current) or ``<suite>_<method>.json.gz`` (2023); plain ``.json`` too.
        suite: suite name; by default taken from the file name (``dmcproprio`` -> ``dmc_proprio``).
        method: label for the table's ``method`` (e.g. ``dreamerv3-2023``); default each run's own ``method``.
        reading: ``auto``, ``bins`` or ``points`` (:func:`choose_reading`).

    Returns:
        ``(table, reading)``: the table has ``mode="train"`` and ``bin_width`` > 0 when read as bins; empty bins
        and missing points (``NaN``/``null`` returns) are dropped.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ScoreFormatError: not a JSON list of runs with ``task``/``method``/``seed``/``xs``/``ys`` of equal length,
            or ``reading="bins"`` for a file whose ``xs`` are not on a regular grid.
        ValueError: an unknown ``reading``.
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
    """How to read ``runs`` (the file's JSON list): see the module docstring for the three readings.

    Raises:
        ValueError: ``reading`` is not one of :data:`READINGS`.
        ScoreFormatError: ``reading="bins"`` and the ``xs`` are not on one regular grid.
    """
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
    """One spelling per task, the official files' one: ``ALE/MsPacman-v5`` or ``MsPacman`` -> ``atari_ms_pacman``.

    Atari suites get the ``atari_`` prefix and snake case, DMC suites ``dmc_``; any other suite keeps the name
    (``CartPole-v1``).
    """
    prefix = "atari_" if suite.startswith("atari") else "dmc_" if suite.startswith("dmc") else None
    if prefix is None:
        return name
    base = name.split("/")[-1]
    base = re.sub(r"(NoFrameskip)?-v\d+$", "", base)
    if not base.startswith(prefix):
        base = prefix + _CAMEL.sub("_", base).lower().replace("-", "_")
    return TASK_ALIASES.get(base, base)


# ---------------------------------------------------------------------------------------------------------
# reverie runs
# ---------------------------------------------------------------------------------------------------------

def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories (folders holding ``scores.jsonl``) in ``paths``: each a run or a folder of runs, any depth.

    Raises:
        FileNotFoundError: a path does not exist, or holds no ``scores.jsonl`` at all.
    """
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
    """Read one reverie run (``scores.jsonl`` + ``config.yaml``) into the tidy table.

    ``frames`` come from each record's ``frames`` (env steps x action repeat, written by the logger) and
    ``agent_steps`` from its ``step``; a record without ``frames`` gets ``step x env.action_repeat``. The task is
    ``env.task`` if the config has one, else ``env.id``, in the suite's spelling (:func:`canonical_task`).

    Args:
        run_dir: the run directory.
        suite: suite the run belongs to (names the task spelling and the table's ``suite``).
        method: label of this set of runs in the table (e.g. ``reverie``, ``baseline``).
        mode: keep only ``train`` or ``eval`` episodes; None keeps both.

    Raises:
        FileNotFoundError: no ``scores.jsonl``/``config.yaml``.
        ScoreFormatError: a line is not a JSON object with ``step`` and ``return``.
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
    """The run's ``config.yaml`` as a plain dict.

    Raises:
        FileNotFoundError: the run directory lacks ``scores.jsonl`` or ``config.yaml``.
    """
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

