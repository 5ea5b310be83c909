"""Scoring protocols: which episodes of a run make its score, on the frame axis (the table in ``docs/compare.md``).

A protocol picks a window ``[lo, hi]`` of environment **frames** (never agent steps) and scores a run as the mean
return of its rows in it; a task's score is the mean over seeds. Points (episodes and evaluations,
``bin_width == 0``) count when ``lo <= x <= hi``; bins ``[x, x + w)`` when they overlap the window by a positive
length, a run's score then being the mean of its bin means (the files keep no episode counts).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd

from reverie.scores.baselines import normalise

RUN_KEYS = ["suite", "task", "method", "run", "seed"]


@dataclasses.dataclass(frozen=True)
class Protocol:
    """Where on the frame axis a run is scored: ``window`` ``(lo, hi)`` frames, inclusive, or (None) the final
    ``final_fraction`` of ``budget`` frames (None: the largest frame count every run reached)."""

    name: str
    window: tuple[float, float] | None = None
    budget: float | None = None
    final_fraction: float = 0.1

    def resolve(self, table: pd.DataFrame) -> tuple[float, float]:
        """The ``(lo, hi)`` frame window for ``table`` (the tidy table of the runs to score); ValueError for an
        empty table without a fixed window or a window with ``lo > hi``."""
        if self.window is not None:
            lo, hi = map(float, self.window)
        else:
            if self.budget is not None:
                budget = float(self.budget)
            elif len(table):
                last = table.groupby(["method", "run", "task"])["frames"].max()
                budget = float(last.min())
            else:
                raise ValueError(f"protocol {self.name}: no episodes to place a final window on; pass a budget")
            lo, hi = budget * (1.0 - self.final_fraction), budget
        if lo > hi:
            raise ValueError(f"protocol {self.name}: window start {lo:g} is after its end {hi:g} (frames)")
        return lo, hi


PROTOCOLS = {
    "atari100k": Protocol("atari100k", window=(390_000, 400_000)),
    "atari57": Protocol("atari57", window=(196_000_000, 200_000_000)),
    "dmc_proprio": Protocol("dmc_proprio", window=(90_000, 110_000)),
    "dmc_vision": Protocol("dmc_vision", window=(990_000, 1_000_000)),
    "generic": Protocol("generic"),
}


def get_protocol(suite: str, window: tuple[float, float] | None = None, budget: float | None = None,
                 final_fraction: float | None = None) -> Protocol:
    """The protocol of ``suite`` with an optional window, budget (frames) or final fraction override; ValueError
    for an unknown suite."""
    if suite not in PROTOCOLS:
        raise ValueError(f"unknown suite {suite!r}; known suites: {', '.join(PROTOCOLS)} (use `generic` for "
                         f"any other environment)")
    base = PROTOCOLS[suite]
    changes: dict = {}
    if window is not None:
        changes["window"] = (float(window[0]), float(window[1]))
    if budget is not None:
        changes["budget"] = float(budget)
        if window is None:  # a budget alone means the final window before it
            changes["window"] = None
    if final_fraction is not None:
        changes["final_fraction"] = float(final_fraction)
    return dataclasses.replace(base, **changes)


def in_window(table: pd.DataFrame, lo: float, hi: float) -> pd.Series:
    """Rows of ``table`` inside ``[lo, hi]`` frames: episodes ending there, or bins overlapping it (positive length)."""
    frames, width = table["frames"], table["bin_width"]
    episode = (width <= 0) & (frames >= lo) & (frames <= hi)
    binned = (width > 0) & (frames < hi) & (frames + width > lo)
    return episode | binned


def run_scores(table: pd.DataFrame, protocol: Protocol,
               baselines: dict[str, tuple[float, float]] | None = None) -> pd.DataFrame:
    """One score per run: the mean return of its rows in the protocol window, and its normalised score.

    ``baselines`` is ``{task: (random, human)}`` (default: the built-in Atari100k table). Returns columns ``suite,
    task, method, run, seed, return, score, episodes, lo, hi``; a run with nothing in the window keeps a row with NaN
    ``return``/``score`` and ``episodes`` 0; a task without a baseline gets ``score`` NaN, with a warning.
    """
    lo, hi = protocol.resolve(table)
    inside = table[in_window(table, lo, hi)]
    runs = table[RUN_KEYS].drop_duplicates()
    means = inside.groupby(RUN_KEYS, as_index=False).agg(**{"return": ("return", "mean"),
                                                           "episodes": ("return", "size")})
    out = runs.merge(means, on=RUN_KEYS, how="left")
    out["episodes"] = out["episodes"].fillna(0).astype(int)
    out["score"] = [_normalised(r, t, s, baselines) for r, t, s in zip(out["return"], out["task"], out["suite"])]
    unscored = sorted(set(out.loc[out["score"].isna() & out["return"].notna(), "task"]))
    if unscored:
        warnings.warn(f"no random/human baseline for {', '.join(unscored)}: raw returns only, no normalised score, "
                      f"left out of the means and aggregates (pass --baselines-yaml with danijar/dreamerv3's "
                      f"scores/baselines.yaml)", stacklevel=2)
    out["lo"], out["hi"] = lo, hi
    missing = out[out["episodes"] == 0]
    if len(missing):
        names = ", ".join(f"{m}/{t}/seed {s}"
                          for m, t, s in missing[["method", "task", "seed"]].itertuples(index=False))
        warnings.warn(f"no episode ended in frames [{lo:.10g}, {hi:.10g}] for: {names}; those runs are left out of the "
                      f"task means", stacklevel=2)
    return out.sort_values(["method", "task", "seed", "run"]).reset_index(drop=True)


def _normalised(value: float, task: str, suite: str, baselines: dict[str, tuple[float, float]] | None) -> float:
    try:
        return float(normalise(value, task, suite, baselines))
    except KeyError:  # no random/human pair for this task
        return float("nan")


def task_scores(scores: pd.DataFrame, reps: int = 2000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per task and method: mean over the seeds with a score (``return``, ``score``), the percentile bootstrap CI
    of that mean return over seeds (``return_lo``, ``return_hi``; :func:`reverie.scores.aggregate.mean_interval`,
    NaN with fewer than 2 seeds), ``seeds`` with a score and ``runs`` in total. NaN where no seed has a score."""
    from reverie.scores.aggregate import mean_interval

    grouped = scores.groupby(["suite", "task", "method"], as_index=False)
    out = grouped.agg(**{"return": ("return", "mean"), "score": ("score", "mean"),
                         "seeds": ("return", lambda r: int(np.isfinite(r).sum())), "runs": ("return", "size")})
    intervals = {key: mean_interval(part["return"].to_numpy(np.float64), reps, confidence, seed)
                 for key, part in scores.groupby(["suite", "task", "method"])}
    keys = zip(out["suite"], out["task"], out["method"])
    out["return_lo"], out["return_hi"] = zip(*(intervals[k] for k in keys)) if len(out) else ((), ())
    return out.sort_values(["task", "method"]).reset_index(drop=True)
