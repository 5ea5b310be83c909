"""Sweep results: one row per configuration, the best one, pairwise comparisons and plots.

Reads each trial's ``summary.json`` (the final evaluation's mean return, env steps, wall time) and reuses
:mod:`reverie.scores` for the statistics: per-configuration mean and IQM of the final eval return over seeds with
95% stratified bootstrap CIs (``aggregate.aggregates``, rliable), and best-vs-other comparisons (``compare_sets``:
IQM difference with a bootstrap CI, permutation and Welch p-values). The best configuration against the runner-up
also goes through ``reverie compare`` (eval episodes, learning curves, difference plot) into ``<sweep>/compare/``.

Files written into the sweep directory:

* ``summary.md``: the configuration table, the best configuration and how to rerun it;
* ``summary.csv`` (one row per configuration), ``trials.csv`` (one row per trial), ``best.json``;
* ``params.png/.svg``: final eval return against each swept parameter (dots: seeds; bars: mean and 95% CI);
* ``compare/``: ``reverie compare`` of the best configuration against the runner-up.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reverie.sweep.space import baseline, config_id, configurations, overrides
from reverie.sweep.spec import SweepSpec, maximised
from reverie.sweep.trial import STOPPED, SUMMARY, TRIAL_META, command_args

MAX_COMPARISONS = 12
"""Best-vs-other comparisons computed (the closest configurations by mean first)."""


def trial_table(spec: SweepSpec, sweep_dir: str | Path) -> pd.DataFrame:
    """One row per trial directory of this sweep: ``config_id, seed, status, value`` (the sweep's metric from the
    trial's ``summary.json``), ``eval_return, env_steps, wall_s, run_dir`` and one column per swept parameter.
    ``status`` is ``finished`` (``summary.json``), ``stopped`` (early, by ASHA) or ``incomplete`` (failed,
    interrupted or not started).

    Grid/random sweeps list every planned trial (also those never started); Optuna sweeps list the directories.
    """
    sweep_dir = Path(sweep_dir)
    keys = [p.key for p in spec.params]
    planned: list[tuple[dict, int]] = []
    if spec.algorithm != "optuna":
        planned = [(params, seed) for params in configurations(spec) for seed in spec.seeds]
    else:
        for meta in sorted((sweep_dir / "trials").glob(f"*/{TRIAL_META}")):
            info = json.loads(meta.read_text(encoding="utf-8"))
            if set(info["params"]) == set(keys):
                planned.append((info["params"], int(info["seed"])))
    rows = []
    for params, seed in planned:
        cid = config_id(params)
        run_dir = sweep_dir / "trials" / f"{cid}_seed{seed}"
        status, record = "incomplete", {}
        if (run_dir / SUMMARY).is_file():
            status, record = "finished", json.loads((run_dir / SUMMARY).read_text(encoding="utf-8"))
        elif (run_dir / STOPPED).is_file():
            status, record = "stopped", json.loads((run_dir / STOPPED).read_text(encoding="utf-8"))
        rows.append({"config_id": cid, "seed": seed, "status": status,
                     "value": float(record.get(spec.metric, np.nan)),
                     "eval_return": float(record.get("eval_return", np.nan)),
                     "env_steps": record.get("env_steps", np.nan), "wall_s": record.get("wall_s", np.nan),
                     "run_dir": str(run_dir), **{k: params[k] for k in keys}})
    columns = ["config_id", "seed", "status", "value", "eval_return", "env_steps", "wall_s", "run_dir", *keys]
    return pd.DataFrame(rows, columns=columns)


def config_table(trials: pd.DataFrame, keys: list[str], reps: int = 2000, seed: int = 0,
                 maximise: bool = True) -> pd.DataFrame:
    """Per configuration: ``mean, mean_lo, mean_hi, iqm, iqm_lo, iqm_hi`` of the trial metric (``value``) over its
    finished seeds (95% bootstrap CIs from ``reverie.scores.aggregate.aggregates``), ``seeds`` finished / ``runs``
    planned, ``wall_s`` summed over its trials; sorted by mean, best first (the largest, or with ``maximise=False``
    the smallest). Configurations with no finished seed keep NaNs."""
    from reverie.scores.aggregate import aggregates

    finished = trials[trials["status"] == "finished"]
    matrices = {cid: part["value"].to_numpy(np.float64)[:, None]  # (R,) -> (R, 1): seeds x one task
                for cid, part in finished.groupby("config_id", sort=False) if np.isfinite(part["value"]).all()}
    agg = aggregates(matrices, reps=reps, seed=seed) if matrices else pd.DataFrame(
        columns=["method", "metric", "value", "lo", "hi"])
    rows = []
    for cid, part in trials.groupby("config_id", sort=False):
        row = {"config_id": cid, **{k: part[k].iloc[0] for k in keys}}
        for metric in ("mean", "iqm"):
            hit = agg[(agg["method"] == cid) & (agg["metric"] == metric)]
            value, lo, hi = (hit.iloc[0][["value", "lo", "hi"]].astype(float) if len(hit) else (np.nan,) * 3)
            row.update({metric: value, f"{metric}_lo": lo, f"{metric}_hi": hi})
        row.update(seeds=int((part["status"] == "finished").sum()), runs=len(part),
                   stopped=int((part["status"] == "stopped").sum()), wall_s=float(part["wall_s"].sum(min_count=1)))
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.sort_values("mean", ascending=not maximise, na_position="last", kind="stable").reset_index(drop=True)


def comparisons(trials: pd.DataFrame, configs: pd.DataFrame, reps: int = 2000, seed: int = 0,
                baseline: str | None = None) -> pd.DataFrame:
    """The best configuration against each other one (``reverie.scores.aggregate.compare_sets`` on the trials'
    metric): ``config_id, diff`` (IQM best - IQM other), ``lo, hi`` (95% bootstrap CI), ``p_permutation, p_welch``.
    With ``baseline`` (an ablation's reference configuration id) each other configuration against it instead:
    ``diff`` = IQM this - IQM baseline."""
    from reverie.scores.aggregate import compare_sets

    scored = configs[configs["seeds"] > 0]
    empty = pd.DataFrame(columns=["config_id", "diff", "lo", "hi", "p_permutation", "p_welch"])
    if len(scored) < 2 or (baseline is not None and baseline not in set(scored["config_id"])):
        return empty
    finished = trials[trials["status"] == "finished"]
    returns = {cid: part["value"].to_numpy(np.float64)[:, None] for cid, part in finished.groupby("config_id")}
    if baseline is not None:  # (first, second, row): diff = IQM first - IQM second, reported in row's line
        pairs = [(cid, baseline, cid) for cid in scored["config_id"] if cid != baseline]
    else:
        best = scored["config_id"].iloc[0]
        pairs = [(best, cid, cid) for cid in scored["config_id"].iloc[1:1 + MAX_COMPARISONS]]
    rows = []
    for first, second, cid in pairs:
        result = compare_sets(returns[first], returns[second], reps=reps, seed=seed)
        rows.append({"config_id": cid, **{k: result[k] for k in empty.columns[1:]}})
    return pd.DataFrame(rows) if rows else empty


def write_summary(spec: SweepSpec, sweep_dir: str | Path, plots: bool = True) -> dict[str, Any]:
    """Write ``summary.md``, ``summary.csv``, ``trials.csv``, ``best.json``, ``params.png/.svg`` and ``compare/``.

    Returns:
        ``{"trials": n, "finished": n, "stopped": n, "incomplete": n, "best": best.json's dict or None,
        "summary_md": path}``.
    """
    sweep_dir = Path(sweep_dir)
    keys = [p.key for p in spec.params]
    trials = trial_table(spec, sweep_dir)
    configs = config_table(trials, keys, maximise=maximised(spec.metric))
    reference = config_id(baseline(spec)) if spec.algorithm == "ablation" else None
    pairs = comparisons(trials, configs, baseline=reference)
    trials.to_csv(sweep_dir / "trials.csv", index=False)
    prefix = "vs_baseline_" if reference else "vs_best_"
    configs.merge(pairs.add_prefix(prefix).rename(columns={f"{prefix}config_id": "config_id"}), on="config_id",
                  how="left").to_csv(sweep_dir / "summary.csv", index=False)
    best = None
    if len(configs) and configs["seeds"].iloc[0] > 0:
        top = configs.iloc[0]
        params = {k: _plain(top[k]) for k in keys}
        best = {"config_id": top["config_id"], "params": params, "metric": spec.metric,
                "mean": float(top["mean"]), "ci": [float(top["mean_lo"]), float(top["mean_hi"])],
                "seeds": int(top["seeds"]), "overrides": [*spec.base, *overrides(params)],
                "command": " ".join(["reverie", *command_args(spec.command, spec.data), *spec.base,
                                     *overrides(params)])}
        (sweep_dir / "best.json").write_text(json.dumps(best, indent=2), encoding="utf-8")
    compared = None
    if plots and len(pairs) and spec.command == "train" and reference is None:  # compare reads env episodes
        plot_params(spec, trials, configs, sweep_dir / "params")
        compared = run_compare(trials, configs["config_id"].iloc[0], pairs["config_id"].iloc[0], sweep_dir / "compare")
    elif plots and best is not None:
        plot_params(spec, trials, configs, sweep_dir / "params")
    text = summary_markdown(spec, trials, configs, pairs, best, compared, reference)
    (sweep_dir / "summary.md").write_text(text, encoding="utf-8")
    counts = trials["status"].value_counts()
    return {"trials": len(trials), "finished": int(counts.get("finished", 0)), "stopped": int(counts.get("stopped", 0)),
            "incomplete": int(counts.get("incomplete", 0)), "best": best, "summary_md": str(sweep_dir / "summary.md"),
            "scored": best is not None and bool(np.isfinite(best["mean"]))}  # some finished trial wrote the metric


def summary_markdown(spec: SweepSpec, trials: pd.DataFrame, configs: pd.DataFrame, pairs: pd.DataFrame,
                     best: dict | None, compared: str | None, reference: str | None = None) -> str:
    """The text of ``summary.md``; ``reference``: an ablation's baseline id (the comparisons are against it)."""
    from reverie.scores.plots import markdown_table

    counts = trials["status"].value_counts()
    what = ("final evaluation's mean return" if spec.metric == "eval_return" else
            "prediction quality of the last open-loop report" + (" on the held-out data" if
                                                                  spec.metric.startswith("heldout/") else ""))
    better = "higher" if maximised(spec.metric) else "lower"
    lines = [f"# Sweep {spec.name}: {spec.metric} ({what}; {better} is better)", "",
             f"{len(trials)} trials: {int(counts.get('finished', 0))} finished, {int(counts.get('stopped', 0))} "
             f"stopped early, {int(counts.get('incomplete', 0))} incomplete. Base: `{' '.join(spec.base) or '(none)'}`"
             f"; seeds {list(spec.seeds)}; search {spec.algorithm}.", ""]
    vs = pairs.set_index("config_id") if len(pairs) else None
    header = ["configuration", *[k.split(".")[-1] for k in configs.columns[1:1 + len(spec.params)]],
              "mean [95% CI]", "IQM", "seeds/runs", "wall min",
              ("this - baseline" if reference else "best - this") + " (IQM) [95% CI], p perm / Welch"]
    rows = []
    for _, r in configs.iterrows():
        cmp = ""
        if vs is not None and r["config_id"] in vs.index:
            c = vs.loc[r["config_id"]]
            cmp = f"{c['diff']:.3g} [{c['lo']:.3g}, {c['hi']:.3g}], p {c['p_permutation']:.2g} / {c['p_welch']:.2g}"
        rows.append([r["config_id"], *[_fmt(r[p.key]) for p in spec.params],
                     f"{r['mean']:.4g} [{r['mean_lo']:.4g}, {r['mean_hi']:.4g}]" if r["seeds"] else "n/a",
                     f"{r['iqm']:.4g}" if r["seeds"] else "n/a", f"{r['seeds']}/{r['runs']}",
                     f"{r['wall_s'] / 60:.1f}" if np.isfinite(r["wall_s"]) else "n/a", cmp])
    lines += [markdown_table(header, rows), ""]
    if reference:
        lines += [f"Ablation: each configuration changes one key from the baseline `{reference}` (every key at its "
                  f"first listed value); the last column is its difference from the baseline.", ""]
    if best:
        lines += [f"**Best configuration**: `{best['config_id']}`: {spec.metric} {best['mean']:.4g} "
                  f"(95% CI [{best['ci'][0]:.4g}, {best['ci'][1]:.4g}], {best['seeds']} seeds). Rerun it with:", "",
                  f"    {best['command']} seed=<k>", ""]
        if len(configs) > 1 and best["seeds"] < 5:
            lines += [f"With {best['seeds']} seeds per configuration the CIs are wide and the permutation test cannot "
                      f"reach small p-values (exact test: at best 2/C(n, k)); treat the ranking as a hint.", ""]
    if compared:
        lines += ["## Best against the runner-up (`reverie compare`, eval episodes; files in compare/)", "", compared]
    return "\n".join(lines) + "\n"


def run_compare(trials: pd.DataFrame, best: str, other: str, out: Path) -> str | None:
    """``reverie compare`` of the best configuration's finished trials against ``other``'s, eval episodes, written to
    ``out``; returns its report (None, with a warning, if compare cannot score them)."""
    from reverie.scores.cli import build_parser, run_compare as compare

    finished = trials[trials["status"] == "finished"]
    runs = {cid: finished.loc[finished["config_id"] == cid, "run_dir"].tolist() for cid in (best, other)}
    args = build_parser().parse_args([*runs[best], "--baseline", *runs[other], "--name", "best", "--baseline-name",
                                      "runner-up", "--mode", "eval", "--reference", "none", "--suite", "generic",
                                      "--out", str(out), "--overwrite"])  # the sweep's own folder, redone each time
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            report = compare(args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        warnings.warn(f"reverie compare of {best} vs {other} failed: {err}", stacklevel=2)
        return None
    return f"best = `{best}`, runner-up = `{other}`\n\n" + report.replace("# reverie compare", "### reverie compare")


def plot_params(spec: SweepSpec, trials: pd.DataFrame, configs: pd.DataFrame, stem: Path) -> list[Path]:
    """Final eval return against each swept parameter: one panel per parameter; dots are trials (seeds), black bars
    the configuration means with their 95% bootstrap CIs. Log axis for log-uniform (or > 1 decade) parameters whose
    values span more than a decade; non-numeric values on evenly spaced positions."""
    import matplotlib.ticker

    from reverie.scores.plots import COLORS, plt, save

    finished = trials[trials["status"] == "finished"]
    fig, axes = plt.subplots(1, len(spec.params), figsize=(3.4 * len(spec.params), 2.8), squeeze=False)
    for ax, param in zip(axes[0], spec.params):
        values = list(dict.fromkeys(trials[param.key]))
        numeric = all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values)
        position = (lambda v: float(v)) if numeric else (lambda v: float(values.index(v)))
        x = np.array([position(v) for v in finished[param.key]])
        ax.scatter(x, finished["value"], s=14, color=COLORS[0], alpha=0.6, label="trial (seed)")
        scored = configs[configs["seeds"] > 0]
        cx = np.array([position(v) for v in scored[param.key]])
        err = np.abs(np.stack([scored["mean"] - scored["mean_lo"], scored["mean_hi"] - scored["mean"]]))
        ax.errorbar(cx, scored["mean"], yerr=err, fmt="o", color="black", ms=4, capsize=3, lw=1,
                    label="configuration mean, 95% CI")
        drawn = [float(v) for v in values] if numeric else []
        if numeric and min(drawn) > 0 and max(drawn) / min(drawn) > 10 and param.log_scale:
            ax.set_xscale("log")  # log-uniform or a wide grid, and the values drawn span more than a decade
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        elif numeric and len(drawn) <= 4:
            ax.set_xticks(drawn)  # a grid: one tick per value
        elif numeric:
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        if not numeric:
            ax.set_xticks(range(len(values)))
            ax.set_xticklabels([str(v) for v in values], fontsize=7)
        ax.set_xlabel(param.key, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(color="#eeeeee")
        ax.set_axisbelow(True)
    axes[0, 0].set_ylabel(f"final {spec.metric}", fontsize=8)
    axes[0, 0].legend(fontsize=7, frameon=False)
    fig.suptitle(f"sweep {spec.name}", fontsize=9)
    fig.tight_layout()
    return save(fig, stem)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (float, np.floating)) and math.isfinite(value) else str(value)
