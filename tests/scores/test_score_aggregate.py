"""Aggregates (rliable) and the two-set comparison, with numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from reverie.scores import aggregate
from reverie.scores.aggregate import aggregates, compare_sets, permutation_test, point_metrics, score_matrix


def test_point_metrics_exact():
    matrix = np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0], [3.0, 10.0]])  # (R=4 runs, K=2 tasks)
    mean, median, iqm, gap = point_metrics(matrix)
    assert mean == 2.75  # task means 1.5 and 4.0
    assert median == 2.75
    assert iqm == 2.0  # sorted 0 1 1 2 2 3 3 10, drop 2 each side: (1 + 2 + 2 + 3) / 4
    assert gap == 0.125  # 1 - mean(min(x, 1)) = 1 - 7/8


def test_aggregates_table_ci_and_seed():
    rng = np.random.default_rng(1)
    matrix = rng.normal(1.0, 0.3, size=(5, 6))
    state = np.random.get_state()[1].copy()
    first = aggregates({"m": matrix}, reps=300, seed=4)
    assert np.array_equal(np.random.get_state()[1], state)  # the global generator is restored
    assert first["metric"].tolist() == ["mean", "median", "iqm", "optimality_gap"]
    assert first["value"].tolist() == pytest.approx(point_metrics(matrix).tolist(), rel=1e-12)
    assert ((first["lo"] <= first["value"]) & (first["value"] <= first["hi"])).all()
    assert (first["hi"] > first["lo"]).all()
    assert first.equals(aggregates({"m": matrix}, reps=300, seed=4))
    assert not first.equals(aggregates({"m": matrix}, reps=300, seed=5))
    assert set(first["runs"]) == {5} and set(first["tasks"]) == {6}


def test_constant_scores_have_zero_width_intervals():
    table = aggregates({"c": np.full((3, 2), 0.5)}, reps=100)
    assert (table["lo"] == table["value"]).all() and (table["hi"] == table["value"]).all()
    assert table.set_index("metric").loc["optimality_gap", "value"] == 0.5


def test_score_matrix_fills_missing_seeds_and_drops_empty_tasks():
    scores = pd.DataFrame({"method": "m", "task": ["a", "a", "a", "b", "b", "b", "c"],
                           "score": [1.0, 2.0, 3.0, 4.0, 6.0, np.nan, np.nan]})
    with pytest.warns(UserWarning, match="m: no score on c"):
        matrix, tasks = score_matrix(scores, "m")
    assert tasks == ["a", "b"]
    assert matrix.tolist() == [[1.0, 4.0], [2.0, 6.0], [3.0, 5.0]]  # b's missing seed = mean(4, 6)
    with pytest.raises(ValueError, match="no runs of method 'x'"):
        score_matrix(scores, "x")


def test_exact_permutation_and_welch():
    a = np.array([[1.0], [2.0], [3.0]])  # (3 runs, 1 task)
    b = np.array([[4.0], [5.0], [6.0]])
    result = compare_sets(a, b, reps=500)
    assert result["iqm_a"] == 2.0 and result["iqm_b"] == 5.0 and result["diff"] == -3.0
    # 20 ways to split {1..6} into 3 + 3; only {1,2,3} and {4,5,6} give |mean difference| >= 3
    assert result["p_permutation"] == 0.1 and result["exact"] == 1.0 and result["permutations"] == 20
    # Welch: t = (2 - 5) / sqrt(1/3 + 1/3), 4 degrees of freedom
    t = -3.0 / math.sqrt(2.0 / 3.0)
    assert result["t_welch"] == pytest.approx(t, rel=1e-12)
    assert result["p_welch"] == pytest.approx(0.021311641128756, rel=1e-9)
    assert result["lo"] <= -3.0 <= result["hi"] and result["hi"] < 0


def test_identical_sets_are_not_different():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    result = compare_sets(a, a.copy(), reps=200)
    assert result["diff"] == 0.0
    assert result["p_permutation"] == 1.0  # every relabelling is at least as extreme as 0
    assert result["exact"] == 1.0 and result["permutations"] == math.comb(4, 2) ** 2


def test_monte_carlo_permutation_when_too_many_relabellings():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, (5, 4)), rng.normal(3, 1, (5, 4))  # C(10, 5)^4 relabellings
    p, used, exact = permutation_test(a, b, permutations=999, seed=0)
    assert not exact and used == 999
    assert p == 1 / 1000  # nothing random comes near a 3-sigma shift: (1 + 0) / (1 + 999)
    assert permutation_test(a, b, permutations=999, seed=0) == (p, used, exact)


def test_compare_sets_shape_errors():
    with pytest.raises(ValueError, match="same K tasks"):
        compare_sets(np.zeros((2, 3)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="at least one run"):
        compare_sets(np.zeros((0, 2)), np.zeros((2, 2)))


def test_complete_orders_put_chosen_rows_first():
    chosen = np.array([[[2, 0], [0, 1]]])  # (P=1, Ra=2, K=2): task 0 picks rows 2, 0; task 1 picks 0, 1
    order = aggregate._complete(chosen, 4)
    assert order[0, :, 0].tolist() == [2, 0, 1, 3] and order[0, :, 1].tolist() == [0, 1, 2, 3]


def test_mean_interval_exact_cases():
    # two seeds: the resampled means are a, (a + b) / 2 and b, so the 95% percentile interval is [min, max]
    assert aggregate.mean_interval(np.array([17.0, 12.0]), reps=2000) == (12.0, 17.0)
    assert np.isnan(aggregate.mean_interval(np.array([5.0]))).all()  # no interval from one seed
    assert np.isnan(aggregate.mean_interval(np.array([5.0, np.nan]))).all()
    assert aggregate.mean_interval(np.array([3.0, 3.0, 3.0])) == (3.0, 3.0)
    values = np.arange(1.0, 11.0)
    lo, hi = aggregate.mean_interval(values, reps=2000, seed=1)
    assert 1.0 < lo < 5.5 < hi < 10.0
    assert aggregate.mean_interval(values, reps=2000, seed=1) == (lo, hi)
    assert aggregate.mean_interval(values, reps=2000, seed=2) != (lo, hi)


def test_mean_interval_per_column_matches_one_column_at_a_time():
    """(R, M): full columns share one vectorised bootstrap with the same draws as a single column; a column with
    missing runs is bootstrapped over its finite runs; one with fewer than 2 gets NaN."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(6, 4))  # (R=6 runs, M=4 bins)
    table[:4, 2] = np.nan  # 2 finite runs
    table[1:, 3] = np.nan  # 1 finite run
    lo, hi = aggregate.mean_interval(table, reps=500, seed=7)
    for j in (0, 1):
        assert (lo[j], hi[j]) == pytest.approx(aggregate.mean_interval(table[:, j], reps=500, seed=7), rel=1e-12)
    assert (lo[2], hi[2]) == (min(table[4:, 2]), max(table[4:, 2]))
    assert np.isnan(lo[3]) and np.isnan(hi[3])


def test_one_run_a_side_says_there_is_no_interval_and_draws_points(tmp_path):
    """Issue 47: one run per set gives a zero-width interval, p = 1 and an undefined t; the report says so instead
    of printing nan, and the plots draw the points (a bar of width zero would look empty)."""
    from reverie.scores import plots
    from reverie.scores.report import comparison_text

    result = compare_sets(np.array([[0.5, 0.7]]), np.array([[0.2, 0.3]]), reps=200)
    assert (result["runs_a"], result["runs_b"]) == (1.0, 1.0)
    assert result["lo"] == result["hi"] == pytest.approx(result["diff"])
    text = comparison_text(result, "a", "b", "dmc")
    assert "no interval and no test: a has 1 run(s) and b 1" in text
    assert "nan" not in text and "Welch t-test" not in text
    several = compare_sets(np.array([[0.5, 0.7], [0.6, 0.8]]), np.array([[0.2, 0.3], [0.1, 0.2]]), reps=200)
    assert "Welch t-test on per-run means" in comparison_text(several, "a", "b", "dmc")  # counter-check
    paths = plots.plot_difference(result, tmp_path / "diff", "a", "b")
    assert all(p.stat().st_size > 0 for p in paths)
    fig_axes = []
    original = plots.save
    plots.save = lambda fig, stem: fig_axes.append(fig.axes[0]) or []
    try:
        plots.plot_difference(result, tmp_path / "d2", "a", "b")
    finally:
        plots.save = original
    ax = fig_axes[0]
    assert not ax.patches  # no zero-width bar
    assert [tuple(line.get_xdata()) for line in ax.lines if line.get_marker() == "o"] == [(result["diff"],)]
    assert ax.get_title() == "one run on a side: no interval, no test"


def test_the_aggregates_table_says_one_run_has_no_interval():
    from reverie.scores.report import aggregate_table

    one = aggregate_table(aggregates({"a": np.array([[0.5, 0.7]])}, reps=50), "dmc", ["t1", "t2"])
    assert "(one run: no CI)" in one and "[" not in one.split("\n")[-1]
    two = aggregate_table(aggregates({"a": np.array([[0.5, 0.7], [0.4, 0.9]])}, reps=50), "dmc", ["t1", "t2"])
    assert "one run" not in two and "[" in two.split("\n")[-1]  # counter-check: two runs get their interval
