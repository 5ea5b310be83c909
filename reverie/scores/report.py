"""The Markdown that ``reverie compare`` prints and writes to ``table.md``.

* :func:`task_table`: per task and set, the mean return over seeds with its 95% bootstrap CI and the seed count,
  and the normalised score; mean/median rows, each saying how many tasks it averages.
* :func:`aggregate_table`: mean, median, IQM and optimality gap with 95% stratified bootstrap CIs.
* :func:`coverage` and :func:`means_note`: which tasks each mean covers and why a task is left out (no runs, no
  episode in the window, no random/human baseline), printed next to the numbers whenever the table's means and
  the aggregates do not average the same tasks.
* :func:`comparison_text`: the two-set comparison.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from reverie.scores import baselines, plots, protocols

REASONS = {"runs": "no runs", "window": "no episode in the window", "baseline": "no random/human baseline"}


def task_table(scores: pd.DataFrame, suite: str, methods: list[str],
               table_baselines: dict[str, tuple[float, float]] | None, reps: int = 2000, seed: int = 0) -> str:
    """Markdown table: per task, each method's mean return over seeds ``[95% CI] (seeds with a score / runs)`` and,
    for normalised suites, its normalised score; Atari adds the random and human columns; then a mean and a
    median row of the normalised scores, each cell saying over how many tasks."""
    per_task = protocols.task_scores(scores, reps=reps, seed=seed)
    tasks = sorted(scores["task"].unique())
    kind = baselines.normaliser(suite)
    header = ["task"] + (["random", "human"] if kind == "human" else [])
    for m in methods:
        header += [f"{m} return"] + ([f"{m} {'HNS' if kind == 'human' else 'score'}"] if kind != "none" else [])
    rows = []
    for task in tasks:
        row = [task]
        if kind == "human":
            pair = (table_baselines or baselines.ATARI100K_RANDOM_HUMAN).get(task, (np.nan, np.nan))
            row += [fmt(pair[0]), fmt(pair[1])]
        for m in methods:
            hit = per_task[(per_task["task"] == task) & (per_task["method"] == m)]
            if hit.empty:
                row += ["-"] + (["-"] if kind != "none" else [])
                continue
            r = hit.iloc[0]
            ci = f" [{fmt(r['return_lo'])}, {fmt(r['return_hi'])}]" if np.isfinite(r["return_lo"]) else ""
            row.append(f"{fmt(r['return'])}{ci} ({r['seeds']}/{r['runs']})")
            if kind != "none":
                row.append(f"{r['score']:.3f}" if np.isfinite(r["score"]) else "nan")
        rows.append(row)
    if kind != "none":
        for name, func in (("mean", np.nanmean), ("median", np.nanmedian)):
            row = [f"**{name}**"] + (["", ""] if kind == "human" else [])
            for m in methods:
                values = per_task.loc[per_task["method"] == m, "score"].to_numpy(np.float64)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    row += ["", f"{func(values):.3f} ({_tasks(int(np.isfinite(values).sum()))})"]
            rows.append(row)
    return ("## Per task (mean over seeds [95% bootstrap CI over seeds]; seeds with an episode in the window / runs)"
            "\n\n" + plots.markdown_table(header, rows))


def aggregate_table(agg: pd.DataFrame, suite: str, tasks: list[str]) -> str:
    """Markdown table of the aggregates, ``value [lo, hi]`` (95% stratified bootstrap CI) per metric."""
    metrics = list(dict.fromkeys(agg["metric"]))
    header = ["method", "runs"] + [plots.METRIC_TITLES.get(m, m) for m in metrics]
    rows = []
    for method, part in agg.groupby("method", sort=False):
        cells = [method, str(int(part["runs"].iloc[0]))]
        for metric in metrics:
            r = part[part["metric"] == metric].iloc[0]
            single = int(r["runs"]) < 2  # one run: a bootstrap over one sample has no width
            cells.append(f"{r['value']:.3f} (one run: no CI)" if single else
                         f"{r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        rows.append(cells)
    return (f"## Aggregates of the {baselines.score_label(suite)} over {len(tasks)} tasks (95% stratified bootstrap "
            f"CIs)\n\n" + plots.markdown_table(header, rows))


def coverage(scores: pd.DataFrame, methods: list[str], tasks: list[str]) -> dict[str, dict[str, str | None]]:
    """``{method: {task: None if it has a normalised score, else the reason key of REASONS}}``.

    Args:
        scores: per-run table of :func:`reverie.scores.protocols.run_scores`.
        methods: the sets, in table order.
        tasks: every task of the comparison.
    """
    out: dict[str, dict[str, str | None]] = {}
    for m in methods:
        out[m] = {}
        for task in tasks:
            rows = scores[(scores["method"] == m) & (scores["task"] == task)]
            if rows.empty:
                out[m][task] = "runs"
            elif not np.isfinite(rows["return"].to_numpy(np.float64)).any():
                out[m][task] = "window"
            elif not np.isfinite(rows["score"].to_numpy(np.float64)).any():
                out[m][task] = "baseline"
            else:
                out[m][task] = None
    return out


def means_note(cover: dict[str, dict[str, str | None]], common: list[str], in_table: bool) -> str:
    """Which tasks the per-task table's mean/median rows and the aggregates average, and why a task is missing.

    Empty when every set has a score on every task (then all means cover the same tasks).

    Args:
        cover: :func:`coverage`.
        common: the tasks of the aggregates (scored for every set).
        in_table: whether the per-task table has mean/median rows (normalised suites).
    """
    tasks = sorted(next(iter(cover.values())))
    missing = {m: {t: r for t, r in per.items() if r is not None} for m, per in cover.items()}
    if not any(missing.values()):
        return ""
    left_out = [t for t in tasks if t not in common]
    why = "; ".join(f"{t} ({', '.join(f'{m}: {REASONS[per[t]]}' for m, per in missing.items() if t in per)})"
                    for t in left_out)
    lines = [f"**Which tasks each mean covers.** The aggregates average the {_tasks(len(common))} every set has a "
             f"score on; left out: {why or 'none'}."]
    if in_table:
        for m, per in missing.items():
            extra = [t for t in tasks if t not in per and t not in common]
            if extra:
                lines.append(f"The per-task table's mean and median of {m} average its {_tasks(len(tasks) - len(per))} "
                             f"with a score, {', '.join(extra)} included, so they differ from {m}'s aggregate mean "
                             f"and median.")
        if len(lines) == 1:
            lines.append(f"The per-task table's mean and median rows average the same {_tasks(len(common))}.")
    return "\n".join(lines)


def _tasks(count: int) -> str:
    return f"{count} task" if count == 1 else f"{count} tasks"


def comparison_text(result: dict[str, float], name_a: str, name_b: str, suite: str) -> str:
    """The two-set comparison as Markdown lines."""
    kind = "exact" if result["exact"] else "Monte Carlo"
    if min(result.get("runs_a", 2), result.get("runs_b", 2)) < 2:
        return "\n".join([
            f"## {name_a} vs {name_b} ({baselines.score_label(suite)})", "",
            f"- IQM {name_a} = {result['iqm_a']:.4g}, IQM {name_b} = {result['iqm_b']:.4g}",
            f"- IQM difference = {result['diff']:.4g}",
            f"- no interval and no test: {name_a} has {int(result['runs_a'])} run(s) and {name_b} "
            f"{int(result['runs_b'])}; with one run on a side the bootstrap interval is the point itself, every "
            f"relabelling gives the same difference (p = 1) and Welch's t is undefined. Run 3 or more seeds a side "
            f"to tell the sets apart.",
        ])
    return "\n".join([
        f"## {name_a} vs {name_b} ({baselines.score_label(suite)})", "",
        f"- IQM {name_a} = {result['iqm_a']:.4g}, IQM {name_b} = {result['iqm_b']:.4g}",
        f"- IQM difference = {result['diff']:.4g}, 95% CI [{result['lo']:.4g}, {result['hi']:.4g}]",
        f"- permutation test p = {result['p_permutation']:.4g} ({kind}, {int(result['permutations'])} relabellings "
        f"within tasks)",
        f"- Welch t-test on per-run means: t = {result['t_welch']:.4g}, p = {result['p_welch']:.4g} "
        f"(means {result['mean_a']:.4g} vs {result['mean_b']:.4g})",
    ])


def fmt(value: float) -> str:
    """Returns to a readable precision: 1327, 18.4, 0.153."""
    if value is None or not np.isfinite(value):
        return "nan"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
