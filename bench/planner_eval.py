"""Eval return of a trained DreamerV3 run acting with its actor vs planning over its world model and critic.
Prints numbers.

    OMP_NUM_THREADS=1 .venv/bin/python bench/planner_eval.py runs/<run> --episodes 10 --planner cem
    .venv/bin/python bench/planner_eval.py runs/<run> --episodes 10 --planner cem mppi --plan candidates=500
    .venv/bin/python bench/planner_eval.py runs/<run> --planner cem --plan policy_candidates=32   # actor-seeded

Every variant (the actor first, then each ``--planner``) plays the same episodes: the evaluation envs of
``reverie eval`` (seeded from ``--seed``, default the run's), and torch's generator reseeded with the same seed
before each, in policy mode (``eval``). Reports per variant the mean/std/min/max return, the per-episode returns,
and the time per ``act`` call (one call acts for all ``E`` parallel envs; ``--envs``, default
``min(episodes, 16)``) and per env action (call / E), both the median over the run's calls, in wall time and
in this process's CPU time (the second is what counts on a machine other jobs share). The planner settings
are the run's ``agent.module.plan`` (defaults in reverie/agents/dreamer_planning.py) updated by ``--plan``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from reverie.agents.dreamer_planning import PLAN_DEFAULTS  # noqa: E402
from reverie.cli import plan_settings  # noqa: E402
from reverie.runtime.cpu_memory import keep_freed_memory  # noqa: E402
from reverie.loop.evaluate import evaluate  # noqa: E402
from reverie.state.saved_run import load_run  # noqa: E402


class TimedAgent:
    """``agent.act`` with the wall time and this process's CPU time of every call recorded (seconds)."""

    def __init__(self, agent):
        self.agent, self.times, self.cpu_times = agent, [], []

    def act(self, obs, state, mode):
        start, cpu = time.perf_counter(), time.process_time()
        out = self.agent.act(obs, state, mode)
        self.times.append(time.perf_counter() - start)
        self.cpu_times.append(time.process_time() - cpu)
        return out


def variant(run_path: str, planner: str, plan: dict, episodes: int, seed: int | None, envs: int,
            device: str) -> dict:
    run = load_run(run_path, device=device, planner=planner, plan=plan)
    seed = run.config["seed"] if seed is None else seed
    timed = TimedAgent(run.agent)
    torch.manual_seed(seed)
    result = evaluate(timed, run.config["env"], episodes, seed, mode="eval", max_envs=envs)
    call, cpu = statistics.median(timed.times), statistics.median(timed.cpu_times)
    return {"acting": run.acting, "seed": seed, "env_steps": run.counters.get("env_steps"), "envs": envs,
            "ms_per_call": 1000 * call, "ms_per_action": 1000 * call / envs, "cpu_ms_per_action": 1000 * cpu / envs,
            "calls": len(timed.times),
            **{k: result[k] for k in ("mean", "std", "min", "max", "returns")}}


def describe(acting: dict) -> str:
    """``"actor"`` or ``"cem horizon=15 candidates=128 ..."``."""
    name = acting.get("planner", "?")
    if name == "actor":
        return name
    keys = ("horizon", "candidates", "top_k", "iterations", "policy_candidates", "value")
    keys += ("temperature",) if name == "mppi" else ()
    return name + " " + " ".join(f"{k}={acting[k]}" for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run directory or checkpoint of a DreamerV3 run")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="env and torch seed (default: the run's)")
    parser.add_argument("--envs", type=int, default=None, help="parallel eval envs (default min(episodes, 16))")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-actor", action="store_true", help="skip the actor's own evaluation")
    parser.add_argument("--planner", nargs="+", choices=("cem", "mppi"), default=["cem"],
                        help="planner(s) to compare with the actor (default cem)")
    parser.add_argument("--plan", action="append", default=[], metavar="KEY=VALUE",
                        help=f"planner setting, repeatable ({', '.join(PLAN_DEFAULTS)})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    plan = plan_settings(args.plan)
    envs = args.envs or min(args.episodes, 16)
    print(f"run {args.run}, {args.episodes} episodes, {envs} parallel envs, {args.threads} thread(s)", flush=True)
    print(f"{'acting':<60} {'mean':>8} {'std':>7} {'min':>7} {'max':>7} {'ms/call':>9} {'ms/action':>9} "
          f"{'cpu ms/action':>13}", flush=True)
    rows = []
    names = ([] if args.no_actor else ["actor"]) + list(args.planner)
    for name in names:
        row = variant(args.run, name, {} if name == "actor" else plan, args.episodes, args.seed, envs, args.device)
        rows.append(row)
        print(f"{describe(row['acting']):<60} {row['mean']:8.1f} {row['std']:7.1f} {row['min']:7.1f} {row['max']:7.1f} "
              f"{row['ms_per_call']:9.1f} {row['ms_per_action']:9.1f} {row['cpu_ms_per_action']:13.1f}", flush=True)
    print(f"env steps of the checkpoint: {rows[0]['env_steps']}, seed {rows[0]['seed']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
