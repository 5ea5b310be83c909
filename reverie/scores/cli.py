"""``reverie compare``: our runs next to the official scores, normalised aggregates with CIs, two-set tests.

Examples::

    reverie compare runs/pong_* --suite atari100k --reference dreamerv3
    reverie compare --reference-only --suite atari100k --reference dreamerv3 dreamerv3-2023
    reverie compare /tmp/cmp/lr3e-4_* --baseline /tmp/cmp/lr1e-4_* --name lr3e-4 --baseline-name lr1e-4

Prints the per-task table and the aggregate table (Markdown) and writes to ``--out``: ``table.md``,
``run_scores.csv``, ``aggregates.csv``, ``curves.png/.svg``, ``aggregates.png/.svg`` and, with
``--baseline``, ``difference.png/.svg``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from reverie.scores import aggregate, baselines, plots, protocols, readers

DEFAULT_OUT = "compare"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reverie compare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Score reverie runs under a suite's protocol, next to the official DreamerV3 scores and/or a "
                    "baseline set of runs; normalised aggregates (mean, median, IQM, optimality gap) with "
                    "stratified bootstrap CIs.", epilog=__doc__.split("Examples::")[1])
    parser.add_argument("runs", nargs="*", metavar="RUN_OR_DIR", help="run directories or folders of runs")
    parser.add_argument("--suite", default=None, choices=list(protocols.PROTOCOLS),
                        help="scoring protocol and normaliser (default: generic, or atari100k with --reference-only)")
    parser.add_argument("--reference", nargs="+", default=None, metavar="NAME",
                        help=f"official score sets: {', '.join(readers.REFERENCES)} or none (default: dreamerv3 "
                             f"where the suite has an official file)")
    parser.add_argument("--reference-dir", default=None, metavar="PATH",
                        help=f"folder holding dreamerv3/ and dreamerv3-2023/ (default: ${readers.REFERENCE_DIR_ENV} "
                             f"or ../shared/reference_scores)")
    parser.add_argument("--reference-only", action="store_true", help="tabulate the official scores alone")
    parser.add_argument("--baseline", nargs="+", default=None, metavar="RUN_OR_DIR",
                        help="a second set of runs; reports IQM(runs) - IQM(baseline) with a CI and p-values")
    parser.add_argument("--name", default="reverie", help="label of RUN_OR_DIR runs")
    parser.add_argument("--baseline-name", default="baseline", help="label of the --baseline runs")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: ./{DEFAULT_OUT})")
    parser.add_argument("--window", nargs=2, type=float, default=None, metavar=("LO", "HI"),
                        help="score window in environment frames, overriding the suite's")
    parser.add_argument("--budget", type=float, default=None,
                        help="frame budget; the window becomes its final --final-fraction")
    parser.add_argument("--final-fraction", type=float, default=None, help="final window fraction (generic: 0.1)")
    parser.add_argument("--mode", choices=["train", "eval"], default="train", help="which episodes of our runs")
    parser.add_argument("--baselines-yaml", default=None, metavar="YAML",
                        help="random/human baselines.yaml (default: the reference folder's, else built-in Atari100k)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap replications")
    parser.add_argument("--permutations", type=int, default=10000, help="permutation test relabellings")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap and permutation seed")
    parser.add_argument("--no-plots", action="store_true", help="write tables only")
    return parser


def cmd_compare(argv: list[str]) -> int:
    """Entry of ``reverie compare``; returns the exit status (2 with a message on stderr for bad input)."""
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always", UserWarning)
            report = run_compare(args)
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"compare error: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note.message}", file=sys.stderr)
    print(report)
    return 0


def run_compare(args: argparse.Namespace) -> str:
    """Do the comparison described by parsed ``args``; write the files; return the printed report.

    Raises:
        ValueError: nothing to compare, unknown suite/reference, or runs whose tasks the reference lacks.
        FileNotFoundError: missing run or reference files.
    """
    if not args.runs and not args.reference_only:
        raise ValueError("give run directories (RUN_OR_DIR ...) or --reference-only")
    if args.reference_only and (args.runs or args.baseline):
        raise ValueError("--reference-only takes no runs and no --baseline")
    if args.baseline and args.name == args.baseline_name:
        raise ValueError(f"--name and --baseline-name are both {args.name!r}; give the two sets different labels")
    suite = args.suite or ("atari100k" if args.reference_only else "generic")
    protocol = protocols.get_protocol(suite, window=args.window, budget=args.budget, final_fraction=args.final_fraction)
    references = _reference_names(args, suite)
    if args.reference_only and not references:
        raise ValueError(f"--reference-only needs a reference; suite {suite!r} has none")

    ours = [readers.read_runs(args.runs, suite=suite, method=args.name, mode=args.mode)] if args.runs else []
    if args.baseline:
        ours.append(readers.read_runs(args.baseline, suite=suite, method=args.baseline_name, mode=args.mode))
    refs = [readers.read_official(readers.reference_path(suite, name, args.reference_dir), suite=suite, method=name)
            for name in references]
    if ours:
        tasks = sorted(set().union(*(set(t["task"]) for t in ours)))
        refs = [_restrict(ref, tasks, suite) for ref in refs]
    table = pd.concat(ours + refs, ignore_index=True)
    if table.empty:
        raise ValueError(f"no {args.mode} episodes in the given runs (try --mode eval or --mode train)")

    lo, hi = protocol.resolve(pd.concat(ours) if ours else table)  # one window for every set, from our runs
    protocol = dataclasses.replace(protocol, window=(lo, hi))
    table_baselines = _baselines(args, suite)
    scores = protocols.run_scores(table, protocol, table_baselines)
    methods = list(dict.fromkeys(table["method"]))
    normalised = baselines.normaliser(suite) != "none"

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# reverie compare: suite {suite}, window [{lo:.10g}, {hi:.10g}] environment frames, "
             f"{args.mode if ours else 'official'} episodes\n", task_table(scores, suite, methods, table_baselines)]
    matrices, tasks = _matrices(scores, methods)
    agg = aggregate.aggregates(matrices, reps=args.reps, seed=args.seed)
    if not normalised:
        agg = agg[agg["metric"] != "optimality_gap"]  # needs scores where 1 means 'solved'
    parts.append(aggregate_table(agg, suite, tasks))
    result = None
    if args.baseline:
        result = aggregate.compare_sets(matrices[args.name], matrices[args.baseline_name], reps=args.reps,
                                        permutations=args.permutations, seed=args.seed)
        parts.append(comparison_text(result, args.name, args.baseline_name, suite))
    report = "\n\n".join(parts) + "\n"
    (out / "table.md").write_text(report, encoding="utf-8")
    scores.to_csv(out / "run_scores.csv", index=False)
    agg.to_csv(out / "aggregates.csv", index=False)
    if not args.no_plots:
        label = baselines.score_label(suite)
        plots.plot_curves(table, out / "curves", window=(lo, hi))
        plots.plot_intervals(agg, out / "aggregates", xlabel=label)
        if result is not None:
            plots.plot_difference(result, out / "difference", args.name, args.baseline_name, xlabel=label)
    return report + f"\nwrote {out}/: table.md, run_scores.csv, aggregates.csv" + ("" if args.no_plots else
                                                                                   ", curves/aggregates .png+.svg")


def task_table(scores: pd.DataFrame, suite: str, methods: list[str],
               table_baselines: dict[str, tuple[float, float]] | None) -> str:
    """Markdown table: per task, each method's mean return over seeds ``(seeds with a score / runs)`` and, for
    normalised suites, its normalised score; Atari adds the random and human columns; a last row of means."""
    per_task = protocols.task_scores(scores)
    tasks = sorted(per_task["task"].unique())
    kind = baselines.normaliser(suite)
    header = ["task"] + (["random", "human"] if kind == "human" else [])
    for m in methods:
        header += [f"{m} return"] + ([f"{m} {'HNS' if kind == 'human' else 'score'}"] if kind != "none" else [])
    rows = []
    for task in tasks:
        row = [task]
        if kind == "human":
            pair = (table_baselines or baselines.ATARI100K_RANDOM_HUMAN).get(task, (np.nan, np.nan))
            row += [_fmt(pair[0]), _fmt(pair[1])]
        for m in methods:
            hit = per_task[(per_task["task"] == task) & (per_task["method"] == m)]
            if hit.empty:
                row += ["-"] + (["-"] if kind != "none" else [])
                continue
            r = hit.iloc[0]
            row.append(f"{_fmt(r['return'])} ({r['seeds']}/{r['runs']})")
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
                    row += ["", f"{func(values):.3f}"]
            rows.append(row)
    return "## Per task (mean over seeds; seeds with an episode in the window / runs)\n\n" + \
        plots.markdown_table(header, rows)


def aggregate_table(agg: pd.DataFrame, suite: str, tasks: list[str]) -> str:
    """Markdown table of the aggregates, ``value [lo, hi]`` (95% stratified bootstrap CI) per metric."""
    metrics = list(dict.fromkeys(agg["metric"]))
    header = ["method", "runs"] + [plots.METRIC_TITLES.get(m, m) for m in metrics]
    rows = []
    for method, part in agg.groupby("method", sort=False):
        cells = [method, str(int(part["runs"].iloc[0]))]
        for metric in metrics:
            r = part[part["metric"] == metric].iloc[0]
            cells.append(f"{r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        rows.append(cells)
    return (f"## Aggregates of the {baselines.score_label(suite)} over {len(tasks)} tasks (95% stratified bootstrap "
            f"CIs)\n\n" + plots.markdown_table(header, rows))


def comparison_text(result: dict[str, float], name_a: str, name_b: str, suite: str) -> str:
    """The two-set comparison as Markdown lines."""
    kind = "exact" if result["exact"] else "Monte Carlo"
    return "\n".join([
        f"## {name_a} vs {name_b} ({baselines.score_label(suite)})", "",
        f"- IQM {name_a} = {result['iqm_a']:.4g}, IQM {name_b} = {result['iqm_b']:.4g}",
        f"- IQM difference = {result['diff']:.4g}, 95% CI [{result['lo']:.4g}, {result['hi']:.4g}]",
        f"- permutation test p = {result['p_permutation']:.4g} ({kind}, {int(result['permutations'])} relabellings "
        f"within tasks)",
        f"- Welch t-test on per-run means: t = {result['t_welch']:.4g}, p = {result['p_welch']:.4g} "
        f"(means {result['mean_a']:.4g} vs {result['mean_b']:.4g})",
    ])


def _reference_names(args: argparse.Namespace, suite: str) -> list[str]:
    if args.reference is not None:
        names = [n for n in args.reference if n != "none"]
        unknown = [n for n in names if n not in readers.REFERENCES]
        if unknown:
            raise ValueError(f"unknown reference {unknown[0]!r}; known: {', '.join(readers.REFERENCES)}, none")
        return names
    if suite == "generic":
        return []
    try:
        readers.reference_path(suite, "dreamerv3", args.reference_dir)
    except FileNotFoundError:
        return []
    return ["dreamerv3"]


def _restrict(ref: pd.DataFrame, tasks: list[str], suite: str) -> pd.DataFrame:
    """The reference rows of our tasks; error if none of our tasks is in the reference."""
    kept = ref[ref["task"].isin(tasks)]
    if kept.empty:
        raise ValueError(f"the {suite} reference has none of the runs' tasks ({', '.join(tasks)}); its tasks are "
                         f"e.g. {', '.join(sorted(ref['task'].unique())[:3])}. Check --suite, or pass "
                         f"--reference none")
    return kept


def _baselines(args: argparse.Namespace, suite: str) -> dict[str, tuple[float, float]] | None:
    if args.baselines_yaml:
        return baselines.load_baselines(args.baselines_yaml)
    if baselines.normaliser(suite) != "human" or suite == "atari100k":
        return None  # built-in Atari100k table
    root = Path(args.reference_dir) if args.reference_dir else readers.default_reference_dir()
    path = root / "dreamerv3" / "baselines.yaml" if root else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"suite {suite} needs random/human baselines beyond the built-in Atari100k table; "
                                f"pass --baselines-yaml PATH/baselines.yaml")
    return baselines.load_baselines(path)


def _matrices(scores: pd.DataFrame, methods: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """``{method: (R, K)}`` over the tasks where every method has a score (aggregates compare like with like)."""
    finite = scores[np.isfinite(scores["score"])]
    common = sorted(set.intersection(*(set(finite.loc[finite["method"] == m, "task"]) for m in methods)))
    if not common:
        empty = [m for m in methods if finite.loc[finite["method"] == m].empty]
        raise ValueError(
            "no task has a score for every method in the protocol's window"
            + (f"; no score at all for: {', '.join(empty)}" if empty else "")
            + ". A run is scored only by episodes that end inside the window (atari100k: [390k, 400k] frames), "
              "so a short run has none: train to the suite's budget, or compare a short run on its own frames with "
              "`--window LO HI --reference none` (or against another set with `--baseline`).")
    left_out = sorted(set(scores["task"]) - set(common))
    if left_out:
        warnings.warn(f"tasks left out of the aggregates (not scored for every method): {', '.join(left_out)}",
                      stacklevel=2)
    return {m: aggregate.score_matrix(scores, m, common)[0] for m in methods}, common


def _fmt(value: float) -> str:
    """Returns to a readable precision: 1327, 18.4, 0.153."""
    if value is None or not np.isfinite(value):
        return "nan"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
