"""Aggregates of normalised scores with uncertainty (rliable), and a two-set comparison.

Score matrices are ``(R, K)``: ``R`` runs (seeds) by ``K`` tasks, one normalised score per run and task
(:func:`reverie.scores.protocols.run_scores`). Metrics follow Agarwal et al. 2021 ("Deep RL at the edge of the
statistical precipice"), computed by ``rliable.metrics``:

* ``mean`` / ``median``: of the per-task means over runs;
* ``iqm``: interquartile mean, the 25%-trimmed mean of all ``R x K`` scores;
* ``optimality_gap``: ``1 - mean(min(score, 1))`` (lower is better).

Confidence intervals are percentile intervals of the stratified bootstrap (runs resampled within each task),
``rliable.library.get_interval_estimates``. rliable draws its indices from NumPy's global generator, so each
call here seeds it and restores the previous state afterwards.

A two-set comparison (e.g. two hyperparameter settings, several seeds each, same tasks) reports
``IQM(a) - IQM(b)`` with a bootstrap CI (each set resampled independently within tasks), a permutation test
p-value (labels shuffled within each task; exact enumeration when the number of relabellings is small), and
Welch's t-test p-value on the per-run mean score over tasks.

One task's mean over seeds (the per-task table, the learning curves) gets a percentile bootstrap CI over its seeds
(:func:`mean_interval`, ``scipy.stats.bootstrap``): the stratified bootstrap above with a single task.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from collections.abc import Iterator

import numpy as np
import pandas as pd
import scipy.stats
from rliable import library as rly
from rliable import metrics as rlm

METRICS = ("mean", "median", "iqm", "optimality_gap")


def mean_interval(values: np.ndarray, reps: int = 2000, confidence: float = 0.95,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of the mean over runs (``scipy.stats.bootstrap``, runs resampled with replacement).

    Args:
        values: ``(R,)`` one value per run, or ``(R, M)``: one CI per column (e.g. per frame bin of a curve).
        reps: bootstrap replications.
        confidence: CI coverage.
        seed: the same seed gives the same interval.

    Returns:
        ``(lo, hi)``, each ``()`` or ``(M,)``. NaN entries are ignored; a column with fewer than 2 finite values
        gets NaN (no interval from one run); equal values give a zero-width interval.
    """
    values = np.asarray(values, dtype=np.float64)
    flat = values.ndim == 1
    table = values[:, None] if flat else values  # (R,) -> (R, 1)
    lo, hi = np.full(table.shape[1], np.nan), np.full(table.shape[1], np.nan)  # (M,)
    finite = np.isfinite(table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        low, high = np.nanmin(table, axis=0), np.nanmax(table, axis=0)
    enough = finite.sum(axis=0) >= 2
    constant = enough & (low == high)
    lo[constant], hi[constant] = low[constant], high[constant]
    full = enough & ~constant & finite.all(axis=0)  # one vectorised bootstrap for these columns
    groups = [(np.flatnonzero(full), table[:, full])] if full.any() else []
    groups += [(np.array([j]), table[finite[:, j], j][:, None]) for j in np.flatnonzero(enough & ~constant & ~full)]
    for columns, data in groups:
        result = scipy.stats.bootstrap((data,), np.mean, n_resamples=reps, confidence_level=confidence, axis=0,
                                       method="percentile", random_state=np.random.default_rng(seed))
        lo[columns], hi[columns] = result.confidence_interval.low, result.confidence_interval.high
    return (lo[0], hi[0]) if flat else (lo, hi)


def score_matrix(scores: pd.DataFrame, method: str, tasks: list[str] | None = None,
                 column: str = "score") -> tuple[np.ndarray, list[str]]:
    """``(R, K)`` matrix of ``method``'s per-run scores over ``tasks`` (default: all its tasks, sorted).

    Tasks where fewer runs have a score than the most-covered task get their missing entries filled with the
    mean of that task's runs (keeps the task mean; the bootstrap needs a full matrix). Tasks with no score at
    all are dropped with a warning.

    Args:
        scores: per-run table from ``run_scores`` (``method, task, <column>``).
        method: which method's rows.
        tasks: task order; default sorted tasks of ``method``.
        column: ``score`` (normalised) or ``return`` (raw).

    Returns:
        ``(matrix (R, K), tasks kept)``.

    Raises:
        ValueError: no rows for ``method``, or no task with a score.
    """
    rows = scores[scores["method"] == method]
    if rows.empty:
        raise ValueError(f"no runs of method {method!r} (methods: {', '.join(sorted(scores['method'].unique()))})")
    tasks = sorted(rows["task"].unique()) if tasks is None else list(tasks)
    columns, kept, dropped = [], [], []
    for task in tasks:
        values = rows.loc[rows["task"] == task, column].to_numpy(dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            dropped.append(task)
            continue
        columns.append(values)
        kept.append(task)
    if dropped:
        warnings.warn(f"{method}: no score on {', '.join(dropped)}; left out of the aggregates", stacklevel=2)
    if not columns:
        raise ValueError(f"{method}: no task has a score in the protocol window")
    runs = max(len(c) for c in columns)
    matrix = np.stack([np.concatenate([c, np.full(runs - len(c), c.mean())]) for c in columns], axis=1)
    return matrix, kept  # (R, K)


def point_metrics(matrix: np.ndarray) -> np.ndarray:
    """``[mean, median, iqm, optimality_gap]`` of a ``(R, K)`` score matrix, shape ``(4,)``."""
    return np.array([rlm.aggregate_mean(matrix), rlm.aggregate_median(matrix), rlm.aggregate_iqm(matrix),
                     rlm.aggregate_optimality_gap(matrix)])


@contextlib.contextmanager
def seeded_numpy(seed: int) -> Iterator[None]:
    """Seed NumPy's global generator (which rliable's bootstrap uses) inside the block; restore it after."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def aggregates(matrices: dict[str, np.ndarray], reps: int = 2000, confidence: float = 0.95,
               seed: int = 0) -> pd.DataFrame:
    """Mean, median, IQM and optimality gap with stratified bootstrap CIs for each method.

    Args:
        matrices: ``{method: (R, K) normalised scores}``.
        reps: bootstrap replications.
        confidence: CI coverage.
        seed: bootstrap seed (the same seed gives the same intervals).

    Returns:
        Columns ``method, metric, value, lo, hi, runs, tasks``; one row per method and metric.
    """
    rows = []
    for method, matrix in matrices.items():
        with seeded_numpy(seed), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # degenerate bootstrap samples (e.g. a single run)
            points, intervals = rly.get_interval_estimates({method: matrix}, point_metrics, reps=reps,
                                                           confidence_interval_size=confidence)
        for i, metric in enumerate(METRICS):
            rows.append(dict(method=method, metric=metric, value=float(points[method][i]),
                             lo=float(intervals[method][0, i]), hi=float(intervals[method][1, i]),
                             runs=matrix.shape[0], tasks=matrix.shape[1]))
    return pd.DataFrame(rows)


def compare_sets(a: np.ndarray, b: np.ndarray, reps: int = 2000, permutations: int = 10000,
                 confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Compare two sets of runs on the same ``K`` tasks: ``a (Ra, K)`` against ``b (Rb, K)``.

    Returns:
        ``iqm_a, iqm_b, diff (= iqm_a - iqm_b), lo, hi`` (bootstrap CI of ``diff``), ``p_permutation``
        (two-sided, ``|diff|``), ``permutations`` (count used), ``exact`` (1.0 when all relabellings were
        enumerated), ``p_welch`` and ``t_welch`` (Welch's t-test on per-run means over tasks), ``mean_a, mean_b``,
        ``runs_a, runs_b`` (runs per set: with one run on a side there is no interval and no test).

    Raises:
        ValueError: different numbers of tasks, or a set with no runs.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"compare_sets needs (R, K) matrices over the same K tasks, got {a.shape} and {b.shape}")
    if not (len(a) and len(b)):
        raise ValueError("compare_sets: each set needs at least one run")

    def diff(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.array([rlm.aggregate_iqm(x) - rlm.aggregate_iqm(y)])

    with seeded_numpy(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        points, intervals = rly.get_interval_estimates({"diff": [a, b]}, diff, reps=reps,
                                                       confidence_interval_size=confidence)
    observed = float(points["diff"][0])
    p_perm, used, exact = permutation_test(a, b, permutations=permutations, seed=seed)
    ra, rb = a.mean(axis=1), b.mean(axis=1)  # (Ra,), (Rb,): per-run mean over tasks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # zero variance in both sets -> NaN
        welch = scipy.stats.ttest_ind(ra, rb, equal_var=False)
    return dict(iqm_a=float(rlm.aggregate_iqm(a)), iqm_b=float(rlm.aggregate_iqm(b)), diff=observed,
                lo=float(intervals["diff"][0, 0]), hi=float(intervals["diff"][1, 0]), p_permutation=p_perm,
                permutations=float(used), exact=float(exact), p_welch=float(welch.pvalue),
                t_welch=float(welch.statistic), mean_a=float(ra.mean()), mean_b=float(rb.mean()),
                runs_a=float(len(a)), runs_b=float(len(b)))


def permutation_test(a: np.ndarray, b: np.ndarray, permutations: int = 10000,
                     seed: int = 0) -> tuple[float, int, bool]:
    """Two-sided permutation test of ``IQM(a) - IQM(b)`` with labels shuffled within each task (column).

    When the number of distinct relabellings ``prod_k C(Ra + Rb, Ra)`` is at most ``permutations`` all are
    enumerated and ``p = #{|d| >= |d_obs|} / total`` (the observed labelling is one of them); otherwise
    ``permutations`` random relabellings give ``p = (1 + #{|d| >= |d_obs|}) / (1 + permutations)``.

    Returns:
        ``(p, relabellings used, exact)``.
    """
    ra, k = a.shape
    pooled = np.concatenate([a, b], axis=0)  # (Ra + Rb, K)
    n = pooled.shape[0]
    observed = abs(rlm.aggregate_iqm(a) - rlm.aggregate_iqm(b))
    total = math.comb(n, ra) ** k
    if total <= permutations:
        per_task = list(itertools.combinations(range(n), ra))
        choices = np.array(list(itertools.product(per_task, repeat=k)), dtype=np.int64)  # (P, K, Ra)
        choices = choices.transpose(0, 2, 1)  # (P, K, Ra) -> (P, Ra, K)
        order = _complete(choices, n)  # (P, n, K): the a-rows first, then the rest
    else:
        rng = np.random.default_rng(seed)
        order = np.argsort(rng.random((permutations, n, k)), axis=1)  # (P, n, K) random order per task
    shuffled = np.take_along_axis(pooled[None], order, axis=1)  # (P, n, K)
    count = shuffled.shape[0]
    iqm_a = scipy.stats.trim_mean(shuffled[:, :ra].reshape(count, -1), 0.25, axis=1)  # (P, Ra, K) -> (P, Ra*K)
    iqm_b = scipy.stats.trim_mean(shuffled[:, ra:].reshape(count, -1), 0.25, axis=1)
    extreme = int((np.abs(iqm_a - iqm_b) >= observed - 1e-12 * max(1.0, observed)).sum())
    if total <= permutations:
        return extreme / count, count, True
    return (1 + extreme) / (1 + count), count, False


def _complete(chosen: np.ndarray, n: int) -> np.ndarray:
    """``(P, Ra, K)`` row indices picked for set a -> ``(P, n, K)`` full orders (picked rows first)."""
    p, ra, k = chosen.shape
    mask = np.ones((p, n, k), dtype=bool)
    np.put_along_axis(mask, chosen, False, axis=1)
    rest = np.argsort(~mask, axis=1, kind="stable")[:, : n - ra]  # (P, n - Ra, K): unpicked rows in order
    return np.concatenate([chosen, rest], axis=1)
