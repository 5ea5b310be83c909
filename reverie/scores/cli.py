"""``reverie compare``: our runs next to the official scores, normalised aggregates with CIs, two-set tests.

Examples::

    reverie scores fetch                              # once: the official score files into ./reference_scores/
    reverie compare runs/pong_*                       # suite from the runs' env_metadata.json (atari100k)
    reverie compare runs/dmc/ --window 90000 110000 --reference dreamerv3-2023   # a folder of DMC runs
    reverie compare --reference-only --suite atari100k --reference dreamerv3 dreamerv3-2023
    reverie compare --reference-only --suite dmc_vision --reference dreamerv3 drqv2 --reading auto
    reverie compare /tmp/cmp/lr3e-4_* --baseline /tmp/cmp/lr1e-4_* --name lr3e-4 --baseline-name lr1e-4

Prints the per-task table and the aggregate table (Markdown) and writes, into a new folder
``compare/<date>_<time>_<label>/`` (or ``--out DIR``, refused when it holds files unless ``--overwrite``):
``table.md``, ``run_scores.csv``, ``aggregates.csv``, ``curves.png``, ``curves.svg``, ``aggregates.png``,
``aggregates.svg`` and, with ``--baseline``, ``difference.png`` and ``difference.svg``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from reverie.scores import aggregate, baselines, output, plots, protocols, readers, references, report, suites


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reverie compare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Score reverie runs under a suite's protocol, next to official score files and/or a "
                    "baseline set of runs; normalised aggregates (mean, median, IQM, optimality gap) with "
                    "stratified bootstrap CIs.", epilog=__doc__.split("Examples::")[1])
    parser.add_argument("runs", nargs="*", metavar="RUN_OR_DIR", help="run directories or folders of runs")
    parser.add_argument("--suite", default=None, choices=list(protocols.PROTOCOLS),
                        type=lambda name: readers.SUITE_ALIASES.get(name, name),  # the 2023 spelling dmcproprio too
                        help="scoring protocol and normaliser (default: from the runs' env_metadata.json; "
                             "atari100k with --reference-only)")
    parser.add_argument("--reference", nargs="+", default=None, metavar="NAME_OR_FILE",
                        help=f"score sets in the official format: {', '.join(references.BUILTIN)}, any method "
                             f"whose <suite>-<method>.json.gz is in the reference folder (e.g. ppo_fixhp, drqv2), "
                             f"a file path, or none (default: dreamerv3 where the suite has its file)")
    parser.add_argument("--reference-dir", default=None, metavar="PATH",
                        help=f"folder holding the score files, directly or in sub-folders such as dreamerv3/ "
                             f"(default: ${references.REFERENCE_DIR_ENV}, else reference_scores/ here or in the "
                             f"parent folder; `{references.FETCH_COMMAND}` downloads the official ones)")
    parser.add_argument("--reading", default="auto", choices=readers.READINGS,
                        help="score files on a regular grid: bins (y = mean of the episodes ending in [x, x + "
                             "step)) or points (y = an evaluation at x); auto: points when the grid has a score at "
                             "x = 0, else bins")
    parser.add_argument("--reference-only", action="store_true", help="tabulate the official scores alone")
    parser.add_argument("--baseline", nargs="+", default=None, metavar="RUN_OR_DIR",
                        help="a second set of runs; reports IQM(runs) - IQM(baseline) with a CI and p-values")
    parser.add_argument("--name", default="reverie", help="label of RUN_OR_DIR runs")
    parser.add_argument("--baseline-name", default="baseline", help="label of the --baseline runs")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"output folder (default: a new {output.DEFAULT_ROOT}/<date>_<time>_<label>/); refused "
                             f"when it holds files, unless --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="replace compare's files in an existing --out DIR")
    parser.add_argument("--window", nargs=2, type=float, default=None, metavar=("LO", "HI"),
                        help="score window in environment frames, overriding the suite's")
    parser.add_argument("--budget", type=float, default=None,
                        help="frame budget; the window becomes its final --final-fraction")
    parser.add_argument("--final-fraction", type=float, default=None, help="final window fraction (generic: 0.1)")
    parser.add_argument("--mode", choices=["train", "eval"], default=None,
                        help="which episodes of our runs (default: eval for dmc_proprio/dmc_vision, else train)")
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
    missing = _missing_folder(args)
    try:
        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always", UserWarning)
            text = run_compare(args)
    except (FileNotFoundError, FileExistsError, ValueError, KeyError) as err:
        message = str(err.args[0] if err.args else err)
        if missing and references.FETCH_COMMAND not in message:
            message += f"\nnote: {missing}"
        print(f"compare error: {message}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note.message}", file=sys.stderr)
    print(text)
    return 0


def _missing_folder(args: argparse.Namespace) -> str | None:
    """:func:`reverie.scores.references.missing_folder_note` unless every ``--reference`` is ``none`` or a file."""
    if args.reference is not None and all(n == "none" or references.is_path(n) for n in args.reference):
        return None
    return references.missing_folder_note(args.reference_dir)


def run_compare(args: argparse.Namespace) -> str:
    """Do the comparison described by parsed ``args``; write the files; return the printed report.

    Everything is read and checked before the output folder is created.

    Raises:
        ValueError: nothing to compare, runs of several suites, unknown reference, runs whose tasks the reference
            lacks, or score sets with the same label.
        FileNotFoundError: missing run or score files.
        FileExistsError: ``--out`` holds files and ``--overwrite`` was not given.
    """
    if not args.runs and not args.reference_only:
        raise ValueError("give run directories (RUN_OR_DIR ...) or --reference-only")
    if args.reference_only and (args.runs or args.baseline):
        raise ValueError("--reference-only takes no runs and no --baseline")
    if args.baseline and args.name == args.baseline_name:
        raise ValueError(f"--name and --baseline-name are both {args.name!r}; give the two sets different labels")
    run_dirs = readers.find_runs(args.runs) if args.runs else []
    baseline_dirs = readers.find_runs(args.baseline) if args.baseline else []
    suite, source = _suite(args, run_dirs + baseline_dirs)
    mode = args.mode or ("eval" if suite.startswith("dmc") else "train")
    label = "_".join([suite, args.name, *(["vs", args.baseline_name] if args.baseline else [])]) if run_dirs else \
        f"{suite}_reference"
    out = output.choose_dir(args.out, label, args.overwrite)
    protocol = protocols.get_protocol(suite, window=args.window, budget=args.budget, final_fraction=args.final_fraction)
    names = _reference_names(args, suite)
    if args.reference_only and not names:
        note = references.missing_folder_note(args.reference_dir)
        raise ValueError(f"--reference-only needs a reference; suite {suite!r} has none"
                         + (f": {note}" if note else f" in {args.reference_dir or references.default_reference_dir()}"))

    ours = [_read_set(run_dirs, suite, args.name, mode)] if run_dirs else []
    if baseline_dirs:
        ours.append(_read_set(baseline_dirs, suite, args.baseline_name, mode))
    refs, readings = [], []
    for name in names:
        path = references.reference_path(suite, name, args.reference_dir)
        _check_file_suite(path, suite)
        ref, reading = readers.read_score_file(path, suite=suite, method=references.label(name), reading=args.reading)
        refs.append(ref)
        readings.append(f"- {', '.join(dict.fromkeys(ref['method']))}: `{path.name}`, read as {reading.describe()}")
    _check_labels(ours + refs)
    if ours:
        tasks = sorted(set().union(*(set(t["task"]) for t in ours)))
        refs = [_restrict(ref, tasks, suite) for ref in refs]
    table = pd.concat(ours + refs, ignore_index=True)

    lo, hi = protocol.resolve(pd.concat(ours) if ours else table)  # one window for every set, from our runs
    protocol = dataclasses.replace(protocol, window=(lo, hi))
    table_baselines = _baselines(args, suite)
    scores = protocols.run_scores(table, protocol, table_baselines)
    methods = list(dict.fromkeys(table["method"]))
    normalised = baselines.normaliser(suite) != "none"

    episodes = f"{mode} episodes of our runs" if ours else "official scores"
    missing = _missing_folder(args) if suite != "generic" else None  # generic: no official file exists anyway
    parts = [f"# reverie compare: suite {suite} ({source}), window [{lo:.10g}, {hi:.10g}] environment frames, "
             f"{episodes}\n" + ("\nScore files:\n" + "\n".join(readings) if readings else "")
             + (f"\nNote: {missing}" if missing else ""),
             report.task_table(scores, suite, methods, table_baselines, reps=args.reps, seed=args.seed)]
    matrices, common = _matrices(scores, methods, suite, (lo, hi))
    agg = aggregate.aggregates(matrices, reps=args.reps, seed=args.seed)
    if not normalised:
        agg = agg[agg["metric"] != "optimality_gap"]  # needs scores where 1 means 'solved'
    parts.append(report.aggregate_table(agg, suite, common))
    note = report.means_note(report.coverage(scores, methods, sorted(set(scores["task"]))), common, normalised)
    if note:
        parts.append(note)
    result = None
    if args.baseline:
        result = aggregate.compare_sets(matrices[args.name], matrices[args.baseline_name], reps=args.reps,
                                        permutations=args.permutations, seed=args.seed)
        parts.append(report.comparison_text(result, args.name, args.baseline_name, suite))
    text = "\n\n".join(parts) + "\n"

    output.prepare(out)
    (out / "table.md").write_text(text, encoding="utf-8")
    scores.to_csv(out / "run_scores.csv", index=False)
    agg.to_csv(out / "aggregates.csv", index=False)
    written = [out / "table.md", out / "run_scores.csv", out / "aggregates.csv"]
    if not args.no_plots:
        score_label = baselines.score_label(suite)
        xmax = max(float(pd.concat(ours)["frames"].max()), hi) if ours else None  # the reference up to our frames
        written += plots.plot_curves(table, out / "curves", window=(lo, hi), xmax=xmax, reps=args.reps,
                                     seed=args.seed, ylabel=f"{'eval ' if mode == 'eval' and ours else ''}return")
        written += plots.plot_intervals(agg, out / "aggregates", xlabel=score_label)
        if result is not None:
            written += plots.plot_difference(result, out / "difference", args.name, args.baseline_name,
                                             xlabel=score_label)
    return text + f"\nwrote {out}/: {', '.join(p.name for p in written)}"


def _suite(args: argparse.Namespace, run_dirs: list[Path]) -> tuple[str, str]:
    """``(suite, where it came from)``: ``--suite``, else the runs' env metadata, else atari100k (reference only).

    Raises:
        ValueError: no ``--suite`` and runs of several suites.
    """
    if not run_dirs:
        return (args.suite, "--suite") if args.suite else ("atari100k", "the --reference-only default")
    if not args.suite:
        inferred, files = suites.infer_suite(run_dirs)
        return inferred, f"from the runs' {files}"
    try:
        inferred, files = suites.infer_suite(run_dirs)
    except (ValueError, FileNotFoundError):  # mixed or unreadable: --suite decides
        return args.suite, "--suite"
    if inferred != args.suite:
        warnings.warn(f"--suite {args.suite} overrides the runs' own suite {inferred} (from their {files})",
                      stacklevel=2)
    return args.suite, "--suite"


def _read_set(run_dirs: list[Path], suite: str, name: str, mode: str) -> pd.DataFrame:
    table = readers.read_runs(run_dirs, suite=suite, method=name, mode=mode)
    if table.empty:
        other = "train" if mode == "eval" else "eval"
        raise ValueError(f"no {mode} episodes in the {name} runs ({', '.join(map(str, run_dirs[:3]))}"
                         f"{' ...' if len(run_dirs) > 3 else ''}); "
                         + ("DMC runs are scored by their evaluation episodes, written every train.eval_every steps; "
                            if mode == "eval" and suite.startswith("dmc") else "")
                         + f"pass --mode {other} to score their {other} episodes")
    return table


def _check_file_suite(path: Path, suite: str) -> None:
    named = readers.suite_from_filename(path)
    if named in protocols.PROTOCOLS and named != suite:
        raise ValueError(f"score file {path} is for suite {named}, but this comparison is on suite {suite}; pass "
                         f"--suite {named} or a {suite} file")


def _check_labels(tables: list[pd.DataFrame]) -> None:
    seen: dict[str, int] = {}
    for i, t in enumerate(tables):
        for method in dict.fromkeys(t["method"]):
            if method in seen and seen[method] != i:
                raise ValueError(f"two score sets are both labelled {method!r}; give the runs another --name, or "
                                 f"pass only one of the score files whose method is {method!r}")
            seen[method] = i


def _reference_names(args: argparse.Namespace, suite: str) -> list[str]:
    if args.reference is not None:
        return [n for n in args.reference if n != "none"]
    if suite == "generic":
        return []
    try:
        references.reference_path(suite, "dreamerv3", args.reference_dir)
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
    root = Path(args.reference_dir) if args.reference_dir else references.default_reference_dir()
    path = root / "dreamerv3" / "baselines.yaml" if root else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"suite {suite} needs random/human baselines beyond the built-in Atari100k table; "
                                f"pass --baselines-yaml PATH/baselines.yaml")
    return baselines.load_baselines(path)


def _matrices(scores: pd.DataFrame, methods: list[str], suite: str,
              window: tuple[float, float]) -> tuple[dict[str, np.ndarray], list[str]]:
    """``{method: (R, K)}`` over the tasks where every method has a score (aggregates compare like with like).

    Raises:
        ValueError: no such task; the message cites ``suite``'s ``window`` (frames) and how to score a short run.
    """
    finite = scores[np.isfinite(scores["score"])]
    common = sorted(set.intersection(*(set(finite.loc[finite["method"] == m, "task"]) for m in methods)))
    if not common:
        empty = [m for m in methods if finite.loc[finite["method"] == m].empty]
        raise ValueError(
            "no task has a score for every method in the protocol's window"
            + (f"; no score at all for: {', '.join(empty)}" if empty else "")
            + f". A run is scored only by episodes that end inside the window ({suite}: [{_frames(window[0])}, "
              f"{_frames(window[1])}] frames), "
              "so a short run has none: train to the suite's budget, or compare a short run on its own frames with "
              "`--window LO HI --reference none` (or against another set with `--baseline`).")
    return {m: aggregate.score_matrix(scores, m, common)[0] for m in methods}, common


def _frames(x: float) -> str:
    """``390000`` -> ``390k``, ``1000000`` -> ``1M``, ``1234.5`` -> ``1234.5`` (frame counts in messages)."""
    for scale, unit in ((1_000_000, "M"), (1_000, "k")):
        if x >= scale and x % (scale // 1000 if unit == "M" else scale) == 0:
            return f"{x / scale:.10g}{unit}"
    return f"{x:.10g}"
