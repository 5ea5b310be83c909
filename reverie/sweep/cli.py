"""``reverie sweep FILE``: run a sweep file on Ray Tune (local Ray by default, a cluster with ``--address``).

Examples::

    reverie sweep examples/sweeps/cartpole_train_ratio.yaml                 # local Ray, all CPUs
    reverie sweep examples/sweeps/cartpole_train_ratio.yaml --num-cpus 2    # local Ray, 2 CPUs
    reverie sweep examples/sweeps/cartpole_train_ratio.yaml --address auto  # the Ray cluster this node belongs to
    reverie sweep examples/sweeps/cartpole_train_ratio.yaml --dry-run       # list the trials, run nothing
    reverie sweep examples/sweeps/cartpole_train_ratio.yaml --summary-only  # rewrite summary.md and the plots

The sweep directory (default ``sweeps/<name>``) holds ``trials/<config-id>_seed<k>/`` (ordinary run
directories), ``summary.md``, ``summary.csv``, ``trials.csv``, ``best.json``, ``params.png`` and ``compare/``.
Run the same command again after an interruption: finished trials (``summary.json``) are skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reverie.sweep.spec import SweepSpecError, load_spec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reverie sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a sweep file (base overrides, search space, seeds, metric, resources) on Ray Tune; each "
                    "trial is a `reverie train` run directory under the sweep directory. See docs/sweep.md.",
        epilog=__doc__.split("Examples::")[1])
    parser.add_argument("file", help="sweep YAML file (examples/sweeps/*.yaml)")
    parser.add_argument("--dir", default=None, help="sweep directory (default: sweeps/<name>)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster address (auto, HOST:6379 or ray://HOST:10001); default: start a local Ray")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs of the local Ray (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="validate and list the trials; run nothing")
    parser.add_argument("--summary-only", action="store_true",
                        help="write the summary of the trials so far; run nothing")
    parser.add_argument("--verbose", action="store_true", help="also show Ray Tune's status tables and worker logs")
    return parser


def cmd_sweep(argv: list[str]) -> int:
    """Entry of ``reverie sweep``; returns the exit status (2 with a message on stderr for a bad sweep file, 1 when
    trials failed after their retries or did not run)."""
    args = build_parser().parse_args(argv)
    if not (args.dry_run or args.summary_only):
        try:
            import ray.tune  # noqa: F401
        except ImportError as err:
            print(f"sweep error: Ray Tune is not installed ({err}); install it with `pip install 'reverie[sweep]'` "
                  f"(and `reverie[optuna]` for search.algorithm: optuna)", file=sys.stderr)
            return 2
    try:
        spec = load_spec(args.file)
        sweep_dir = Path(args.dir or Path("sweeps") / spec.name)
        if args.dry_run:
            return dry_run(spec, sweep_dir)
        if args.summary_only:
            from reverie.sweep.summary import write_summary

            if not sweep_dir.is_dir():
                raise SweepSpecError(f"{sweep_dir} does not exist: run the sweep first (or pass --dir)")
            summary = write_summary(spec, sweep_dir)
        else:
            from reverie.sweep.runner import run_sweep

            summary = run_sweep(spec, sweep_dir, address=args.address, num_cpus=args.num_cpus,
                                num_gpus=args.num_gpus, verbose=args.verbose)
    except SweepSpecError as err:
        print(f"sweep error: {err}", file=sys.stderr)
        return 2
    print(Path(summary["summary_md"]).read_text(encoding="utf-8"))
    print(f"wrote {sweep_dir}/: summary.md, summary.csv, trials.csv" +
          (", best.json, params.png" if summary["best"] else "") +
          (", compare/" if summary["best"] and spec.command == "train" else ""))
    if summary["finished"] and not summary.get("scored", True):
        print(f"warning: {spec.metric} is in no finished trial's summary.json (prediction quality is written for "
              f"image keys only, and only by runs whose open-loop reports are on); choose another metric",
              file=sys.stderr)
    failed = summary.get("failed") or []
    if failed:
        print(f"{len(failed)} trial(s) failed after their retries: {', '.join(failed)}; see their train.log. Run the "
              f"same command again to retry them (finished trials are skipped).", file=sys.stderr)
    elif summary.get("incomplete") and not args.summary_only:
        print(f"{summary['incomplete']} trial(s) did not finish; run the same command again to run them (finished "
              f"trials are skipped).", file=sys.stderr)
    return 1 if failed or (summary.get("incomplete") and not args.summary_only) else 0


def dry_run(spec, sweep_dir: Path) -> int:
    """Print the trials a sweep would run (and which are already finished); validate every configuration."""
    from reverie.sweep.runner import check_configs
    from reverie.sweep.space import configurations, overrides
    from reverie.sweep.trial import SUMMARY, trial_dir

    if spec.algorithm == "optuna":
        check_configs(spec, [{p.key: p.values[0] for p in spec.params}])
        print(f"optuna search: {spec.samples} configurations x seeds {list(spec.seeds)}, chosen while it runs")
        return 0
    configs = configurations(spec)
    check_configs(spec, configs)
    for params in configs:
        for seed in spec.seeds:
            path = trial_dir(sweep_dir, params, seed)
            state = "finished" if (path / SUMMARY).is_file() else "to run"
            print(f"{state:8s} {path}  {' '.join(overrides(params))} seed={seed}")
    print(f"{len(configs)} configurations x {len(spec.seeds)} seeds = {len(configs) * len(spec.seeds)} trials; "
          f"base: {' '.join(spec.base)}")
    return 0
