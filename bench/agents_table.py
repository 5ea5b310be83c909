"""The two DreamerV3 agents side by side: the 2023 agent (``agent=dreamerv3``) and the current one
(``agent=dreamerv3_2025``), each under its CPU preset, with one wall-clock budget per run (docs/dreamerv3.md,
"The two agents at equal CPU time").

    .venv/bin/python bench/agents_table.py plan --minutes 25 --out ~/agents      # the runs, one command per line
    .venv/bin/python bench/agents_table.py report ~/agents                        # the table (markdown)

``plan`` prints one ``reverie train`` command per env, agent and seed: the env's CPU preset (:data:`ENVS`), one
thread, ``train.max_minutes`` (the budget: the run stops there with a final evaluation) and a run folder
``<out>/<env>_<agent>_s<seed>``. Run them one per core (``taskset -c 0 ...``), two at a time.

``report`` reads each finished run's ``summary.json`` (its evaluations: env step, wall seconds, mean return) and
writes, per env and agent, the return at the budget (equal wall-clock: every run had the same minutes, its
evaluations included) and the return at equal env steps (the last clocked evaluation, on the ``train.eval_every``
grid, that every run of that env reached), per seed and as a mean with a 95% t interval over seeds. Runs without
``summary.json`` (still going, or stopped before their budget) are listed as unfinished and left out of the means.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: bench/ is a folder at the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import OmegaConf  # noqa: E402

from bench.fidelity import mean_ci  # noqa: E402
from reverie.state.resume import read_summary  # noqa: E402

#: env name in run folders -> the overrides that select the env and its CPU preset (the same for both agents)
ENVS: dict[str, list[str]] = {
    "cartpole": ["exp=classic", "env=cartpole"],
    "pendulum": ["exp=classic", "env=pendulum"],
    "dmc_cartpole_swingup": ["exp=dmc_cpu", "env=dmc_proprio", "env.task=cartpole_swingup"],
}
AGENTS = ("dreamerv3", "dreamerv3_2025")
FIXED = ["threads=1", "train.progress=false", "train.video=false",
         "train.steps=1000000"]  # more than any run reaches in its budget: the budget is what stops every run


def run_name(env: str, agent: str, seed: int) -> str:
    return f"{env}_{agent}_s{seed}"


def plan(out: Path, minutes: float, seeds: list[int], python: str = ".venv/bin/python") -> list[str]:
    """One ``reverie train`` command line per env, seed and agent (agents alternate, so that two cores running the
    list in order run both agents of one env and seed side by side). Raises ``ValueError`` for a budget <= 0."""
    if not minutes > 0:
        raise ValueError(f"--minutes {minutes}: the wall-clock budget per run must be > 0 minutes (e.g. --minutes 25)")
    lines = []
    for env, overrides in ENVS.items():
        for seed in seeds:
            for agent in AGENTS:
                args = [f"agent={agent}", *overrides, f"seed={seed}", *FIXED, f"train.max_minutes={minutes:g}",
                        f"run_dir={out / run_name(env, agent, seed)}"]
                lines.append(f"{python} -m reverie train " + " ".join(args))
    return lines


def parse_name(name: str) -> tuple[str, str, int] | None:
    """``<env>_<agent>_s<seed>`` -> (env, agent, seed), or None for a folder of another kind."""
    head, sep, seed = name.rpartition("_s")
    if not sep or not seed.isdigit():
        return None
    for agent in sorted(AGENTS, key=len, reverse=True):  # dreamerv3_2025 before its prefix dreamerv3
        if head.endswith("_" + agent) and head[: -len(agent) - 1] in ENVS:
            return head[: -len(agent) - 1], agent, int(seed)
    return None


def eval_at(evals: list[list[float]], step: float) -> float | None:
    """The mean return of the last evaluation at or before env step ``step`` (``evals``: ``[step, wall_s, mean]``
    rows in step order), or None when every evaluation came later."""
    before = [e for e in evals if e[0] <= step]
    return float(before[-1][2]) if before else None


def _join(fmt: str, values: list) -> str:
    return " / ".join("-" if v is None else fmt.format(v) for v in values)


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    m, lo, hi = mean_ci(values)
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}]"


def report(out: Path) -> str:
    """The markdown table of every ``<env>_<agent>_s<seed>`` folder under ``out`` (see the module docstring)."""
    runs: dict[str, dict[str, list[dict]]] = {}
    unfinished = []
    for run_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        parsed = parse_name(run_dir.name)
        if parsed is None:
            continue
        env, agent, seed = parsed
        s = read_summary(run_dir)
        if s is None:
            unfinished.append(run_dir.name)
            continue
        every = int(OmegaConf.load(run_dir / "config.yaml").train.eval_every)
        runs.setdefault(env, {}).setdefault(agent, []).append(
            {"seed": seed, "steps": int(s["env_steps"]), "updates": int(s["updates"]), "wall": s["wall_s"] / 60.0,
             "evals": s["evals"], "final": float(s["eval_return"]), "every": every})
    lines = ["| env | agent | seeds | env steps reached | updates | wall min | return at the budget (per seed) | "
             "mean [95% CI] | return at equal env steps (step) | mean [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for env in ENVS:
        if env not in runs:
            continue
        items_all = [r for items in runs[env].values() for r in items]
        equal, every = min(r["steps"] for r in items_all), max(r["every"] for r in items_all)
        if every > 0 and equal >= every:  # down to the evaluation grid: a clocked evaluation of every run
            equal -= equal % every
        for agent in AGENTS:
            items = sorted(runs[env].get(agent, []), key=lambda r: r["seed"])
            if not items:
                continue
            at_equal = [eval_at(r["evals"], equal) for r in items]
            cells = [env, agent, str(len(items)), _join("{:,}", [r["steps"] for r in items]),
                     _join("{:,}", [r["updates"] for r in items]), _join("{:.1f}", [r["wall"] for r in items]),
                     _join("{:.1f}", [r["final"] for r in items]), _cell([r["final"] for r in items]),
                     f"{_join('{:.1f}', at_equal)} ({equal:,})", _cell([v for v in at_equal if v is not None])]
            lines.append("| " + " | ".join(cells) + " |")
    if unfinished:
        lines += ["", "Unfinished (no summary.json): " + ", ".join(unfinished)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the run commands")
    p.add_argument("--out", type=Path, required=True, help="folder of the run folders")
    p.add_argument("--minutes", type=float, required=True, help="wall-clock budget per run (train.max_minutes)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--python", default=".venv/bin/python")
    r = sub.add_parser("report", help="print the table of the finished runs")
    r.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "plan":
        try:
            print("\n".join(plan(args.out, args.minutes, args.seeds, args.python)))
        except ValueError as e:
            parser.error(str(e))
        return 0
    if not args.out.is_dir():
        parser.error(f"{args.out}: no such folder (give the --out folder of `plan`)")
    print(report(args.out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
