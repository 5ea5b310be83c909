"""Curve bins: never narrower than the coarsest grid in the data, up to the requested right end."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reverie.scores.plots import binned_means, curve_edges


def _rows(run: str, frames: list[float], width: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame({"run": run, "frames": frames, "bin_width": width, "return": 1.0})


def test_edges_follow_the_coarsest_grid():
    evals = _rows("ours", [10_000.0 * i for i in range(1, 12)])  # evaluations every 10k frames up to 110k
    episodes = _rows("ref", list(np.arange(1_000.0, 500_000.0, 1_000.0)))
    edges = curve_edges(pd.concat([evals, episodes]), bins=40, xmax=110_000)
    assert np.allclose(edges, np.arange(0.0, 110_001.0, 10_000.0))  # 11 bins of 10k, not 40 of 2750
    assert np.allclose(curve_edges(episodes, bins=40, xmax=110_000), np.linspace(0.0, 110_000.0, 41))
    binned = _rows("ref2023", [10_000.0, 20_000.0, 30_000.0], width=30_000.0)
    assert np.allclose(curve_edges(binned, bins=40), [0.0, 30_000.0, 60_000.0])  # default right end: 30k + 30k


def test_binned_means_cut_at_the_right_end():
    edges = np.array([0.0, 10.0, 20.0])
    means = binned_means(np.array([5.0, 10.0, 15.0, 30.0]), np.array([1.0, 3.0, 5.0, 100.0]), edges)
    assert means.tolist() == [2.0, 5.0]  # (0, 10] holds 5 and 10; 30 lies beyond the last edge


def _curve_table(runs_per_method: dict[str, int]) -> pd.DataFrame:
    rows = [{"task": "atari_boxing", "method": method, "run": f"{method}/{i}", "frames": frames, "bin_width": 0.0,
             "return": float(i)} for method, count in runs_per_method.items() for i in range(count)
            for frames in (100_000.0, 200_000.0, 300_000.0)]
    return pd.DataFrame(rows)


def test_curve_legend_keeps_a_methods_own_parentheses_and_says_when_no_band_is_drawn(tmp_path, monkeypatch):
    """The legend names each method whole, a name like "ours (xs, 6,247 updates)" with its parentheses; with one run
    per method there is no band, and the legend's title says so instead of naming a CI."""
    import reverie.scores.plots as plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, stem: figures.append(fig) or [])
    name = "ours (xs, 6,247 updates)"
    plots.plot_curves(_curve_table({name: 1, "dreamerv3": 1}), tmp_path / "one")
    plots.plot_curves(_curve_table({name: 1, "dreamerv3": 5}), tmp_path / "five")
    (one,), (five,) = (fig.legends for fig in figures)
    assert [t.get_text() for t in one.get_texts()] == [name, "dreamerv3"]
    assert one.get_title().get_text() == "one run per method: no band"
    assert [t.get_text() for t in five.get_texts()] == [name, "dreamerv3"]
    assert five.get_title().get_text() == "mean over runs, band: 95% bootstrap CI"
