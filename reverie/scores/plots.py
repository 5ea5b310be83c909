"""Figures (PNG + SVG, matplotlib Agg backend) and Markdown tables of score comparisons: learning curves per task
(:func:`plot_curves`), aggregate metrics with CIs (:func:`plot_intervals`), a two-set IQM difference
(:func:`plot_difference`) and :func:`markdown_table`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never opens a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

COLORS = ("#377eb8", "#e41a1c", "#4daf4a", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#888888")
METRIC_TITLES = {"mean": "Mean", "median": "Median", "iqm": "IQM", "optimality_gap": "Optimality gap"}


def save(fig: plt.Figure, stem: Path) -> list[Path]:
    """Write ``stem.png`` (150 dpi) and ``stem.svg``; close the figure; return both paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def binned_means(frames: np.ndarray, returns: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``(M,)`` mean of ``returns`` ``(E,)`` whose ``frames`` ``(E,)`` fall in each bin ``(edges[i], edges[i+1]]``
    of ``edges`` ``(M + 1,)``; NaN for empty bins."""
    index = np.searchsorted(edges, frames, side="left") - 1  # bin i holds edges[i] < x <= edges[i+1]
    index[frames <= edges[0]] = 0
    valid = (index >= 0) & (index < len(edges) - 1)
    sums = np.bincount(index[valid], weights=returns[valid], minlength=len(edges) - 1)
    counts = np.bincount(index[valid], minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def plot_curves(table: pd.DataFrame, stem: Path, window: tuple[float, float] | None = None,
                tasks: list[str] | None = None, bins: int = 40, cols: int = 4, ylabel: str = "episode return",
                fill: str = "last", band: str = "ci", xmax: float | None = None, reps: int = 2000,
                seed: int = 0) -> list[Path]:
    """Learning curves per task on the frame axis: each method's mean over runs and a band; returns both paths.

    ``table`` holds every method to draw (``readers.COLUMNS``); ``window`` (frames) is shaded; ``bins`` frame bins
    from 0 to ``xmax`` (default: the task's largest frame count) are never narrower than the data's coarsest grid
    (:func:`curve_edges`). ``fill="last"`` carries a run's last value over its empty bins, ``"nan"`` leaves gaps;
    ``band="ci"`` is the percentile bootstrap 95% CI of the mean per bin (``reps``, ``seed``; none with one run,
    :func:`reverie.scores.aggregate.mean_interval`), ``"range"`` min to max over runs.
    """
    from reverie.scores.aggregate import mean_interval

    tasks = sorted(table["task"].unique()) if tasks is None else list(tasks)
    methods = list(dict.fromkeys(table["method"]))
    cols = max(1, min(cols, len(tasks)))
    rows = int(np.ceil(len(tasks) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    handles: dict[str, object] = {}  # method -> its first line, for the one legend over every panel
    most_runs = 0
    for ax, task in zip(axes.flat, tasks):
        part = table[table["task"] == task]
        if part.empty:
            ax.set_title(f"{task} (no data)", fontsize=9)
            continue
        edges = curve_edges(part, bins, xmax)
        centers = edges[1:]
        for j, method in enumerate(methods):
            runs = part[part["method"] == method]
            if runs.empty:
                continue
            curves = np.stack([_filled(binned_means(_centres(r), r["return"].to_numpy(float), edges), fill)
                               for _, r in runs.groupby("run")])  # (runs, bins)
            color = COLORS[j % len(COLORS)]
            finite = np.isfinite(curves).any(axis=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN bins
                mean = np.nanmean(curves, 0)
                if band == "ci":
                    low, high = mean_interval(curves, reps, 0.95, seed)  # (bins,) each
                else:
                    low, high = np.nanmin(curves, 0), np.nanmax(curves, 0)
            (line,) = ax.plot(centers[finite], mean[finite], color=color, lw=1.5)
            handles.setdefault(method, line)
            most_runs = max(most_runs, len(curves))
            ax.fill_between(centers[finite], low[finite], high[finite], color=color, alpha=0.2, lw=0)
        if window is not None:
            ax.axvspan(*window, color="#999999", alpha=0.25, lw=0)
        ax.set_title(task, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
        ax.grid(color="#eeeeee")
        ax.set_axisbelow(True)
    for ax in axes.flat[len(tasks):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("environment frames", fontsize=8)
    note = {"ci": "mean over runs, band: 95% bootstrap CI", "range": "mean over runs, band: min-max"}[band]
    if most_runs == 1:
        note = "one run per method: no band"
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1.0), title=note, title_fontsize=7)
    fig.tight_layout()
    return save(fig, stem)


def curve_edges(table: pd.DataFrame, bins: int = 40, xmax: float | None = None) -> np.ndarray:
    """Bin edges ``(M + 1,)`` from 0 to ``xmax`` (default: the largest ``frames + bin_width``) for one task's rows:
    width ``xmax / bins``, widened to the largest ``bin_width`` or median gap of one run's frames, so a run on a
    coarse grid does not leave every other bin empty."""
    if xmax is None:
        xmax = float((table["frames"] + table["bin_width"]).max())
    gaps = [float(np.median(np.diff(np.unique(r["frames"].to_numpy(np.float64)))))
            for _, r in table.groupby("run") if r["frames"].nunique() > 1]
    width = max([xmax / bins, float(table["bin_width"].max())] + gaps)
    count = max(1, int(np.ceil(xmax / width - 1e-9)))
    return np.linspace(0.0, count * width, count + 1)


def plot_intervals(aggregates: pd.DataFrame, stem: Path, xlabel: str = "normalised score") -> list[Path]:
    """Point estimates and CIs of each aggregate metric (``aggregate.aggregates`` table), one panel per metric."""
    methods = list(dict.fromkeys(aggregates["method"]))
    metrics = list(dict.fromkeys(aggregates["metric"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.8 * len(metrics), 1.0 + 0.45 * len(methods)), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, method in enumerate(methods):
            row = aggregates[(aggregates["metric"] == metric) & (aggregates["method"] == method)].iloc[0]
            color = COLORS[i % len(COLORS)]
            if row["hi"] > row["lo"]:
                ax.barh(i, row["hi"] - row["lo"], left=row["lo"], height=0.6, color=color, alpha=0.5)
                ax.plot([row["value"]] * 2, [i - 0.3, i + 0.3], color="black", lw=1.5)
            else:  # no interval (one run, or every run equal): the point alone, visibly
                ax.plot([row["value"]], [i], marker="o", color=color, markeredgecolor="black", ms=6)
        ax.set_yticks(range(len(methods)))
        ax.set_yticklabels(methods if ax is axes[0, 0] else [""] * len(methods), fontsize=8)
        ax.set_title(METRIC_TITLES.get(metric, metric), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="x", color="#eeeeee")
        ax.set_axisbelow(True)
        ax.invert_yaxis()
    fig.tight_layout()
    return save(fig, stem)


def plot_difference(result: dict[str, float], stem: Path, label_a: str, label_b: str,
                    xlabel: str = "normalised score") -> list[Path]:
    """The IQM difference ``a - b`` of ``aggregate.compare_sets`` with its CI and the zero line."""
    fig, ax = plt.subplots(figsize=(5.0, 1.4))
    if result["hi"] > result["lo"]:
        ax.barh(0, result["hi"] - result["lo"], left=result["lo"], height=0.5, color=COLORS[0], alpha=0.5)
        ax.plot([result["diff"]] * 2, [-0.25, 0.25], color="black", lw=1.5)
    else:  # no interval: the point alone
        ax.plot([result["diff"]], [0], marker="o", color=COLORS[0], markeredgecolor="black", ms=6)
    ax.axvline(0.0, color="#555555", lw=1, ls="--")
    ax.set_yticks([0])
    ax.set_yticklabels([f"IQM({label_a}) - IQM({label_b})"], fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    single = min(result.get("runs_a", 2), result.get("runs_b", 2)) < 2
    ax.set_title("one run on a side: no interval, no test" if single else
                 f"permutation p = {result['p_permutation']:.3g}, Welch p = {result['p_welch']:.3g}", fontsize=9)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return save(fig, stem)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: ``header`` then ``rows`` (lists of cell strings); the first column left-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if i else (":" + "-" * (w + 1)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def _filled(curve: np.ndarray, fill: str) -> np.ndarray:
    """``fill="last"``: carry the last finite value over NaN gaps *inside* the run (episodes longer than a bin);
    leading and trailing NaNs (before the first / after the last episode) stay NaN."""
    if fill != "last":
        return curve
    out = curve.copy()
    finite = np.flatnonzero(np.isfinite(out))
    if finite.size:
        for i in range(finite[0] + 1, finite[-1]):
            if np.isnan(out[i]):
                out[i] = out[i - 1]
    return out


def _centres(rows: pd.DataFrame) -> np.ndarray:
    """Episode-end frames, or the centre ``x + w / 2`` of a bin ``[x, x + w)``: ``(E,)``."""
    return (rows["frames"] + rows["bin_width"] / 2).to_numpy(np.float64)
