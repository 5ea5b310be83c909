"""Aggregates of normalised scores with uncertainty (rliable), and a two-set comparison (``docs/compare.md``).

Score matrices are ``(R, K)``: ``R`` runs (seeds) by ``K`` tasks (:func:`reverie.scores.protocols.run_scores`).
Metrics and stratified bootstrap CIs follow Agarwal et al. 2021 ("Deep RL at the edge of the statistical
precipice"), computed by ``rliable``; rliable draws from NumPy's global generator, so each call here seeds it and
restores the previous state afterwards.
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
    """Percentile bootstrap CI ``(lo, hi)`` of the mean over runs (``scipy.stats.bootstrap``).

    ``values`` is ``(R,)`` or ``(R, M)`` (one CI per column, e.g. per frame bin); ``lo``/``hi`` are ``()`` or
    ``(M,)``. NaN entries are ignored; a column with fewer than 2 finite values gets NaN, equal values a zero-width
    interval. The same ``seed`` gives the same interval.
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
    """``(matrix (R, K), tasks kept)`` of ``method``'s per-run ``column`` (``score`` or ``return``) over ``tasks``.

    ``scores`` is the per-run table of ``run_scores``; ``tasks`` defaults to the method's tasks, sorted. A task with
    fewer runs than the best-covered one gets its missing entries filled with its mean (keeps the task mean; the
    bootstrap needs a full matrix); a task with no score is dropped with a warning. Raises ValueError when
    ``method`` has no rows or no task has a score.
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
    """Mean, median, IQM and optimality gap with stratified bootstrap CIs for each ``{method: (R, K) matrix}``.

    Returns columns ``method, metric, value, lo, hi, runs, tasks``, one row per method and metric.
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
    """Compare two sets of runs on the same ``K`` tasks, ``a (Ra, K)`` against ``b (Rb, K)``.

    Returns ``iqm_a, iqm_b, diff, lo, hi`` (bootstrap CI of ``diff = iqm_a - iqm_b``), ``p_permutation``,
    ``permutations``, ``exact`` (1.0 when enumerated), ``p_welch``, ``t_welch`` (Welch's t-test on per-run means
    over tasks), ``mean_a, mean_b, runs_a, runs_b``. Raises ValueError for different task counts or an empty set.
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
    """Two-sided permutation test of ``IQM(a) - IQM(b)``, labels shuffled within each task: ``(p, used, exact)``.

    At most ``permutations`` distinct relabellings are all enumerated (``p = #{|d| >= |d_obs|} / total``), else
    that many random ones give ``p = (1 + #{|d| >= |d_obs|}) / (1 + permutations)``.
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
