"""Eval return of a trained DreamerV3 run acting with its actor vs planning over its world model and critic.
Prints numbers.

    OMP_NUM_THREADS=1 .venv/bin/python bench/planner_eval.py runs/<run> --episodes 10 --planner cem
    .venv/bin/python bench/planner_eval.py runs/<run> --episodes 10 --planner cem mppi --plan candidates=500
    .venv/bin/python bench/planner_eval.py runs/<run> --planner cem --plan policy_candidates=32   # actor-seeded

Every variant (the actor first, then each ``--planner``) plays the same episodes: the evaluation envs of
``reverie eval`` (seeded from ``--seed``, default the run's), and torch's generator reseeded with the same seed
before each, in policy mode (``eval``). Reports per variant the mean/std/min/max return, the per-episode returns,
and the time per ``act`` call (one call acts for all ``E`` parallel envs; ``--envs``, default
``min(episodes, 16)``) and per env action (call / E), both the median over the run's calls. The planner settings
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
from reverie.cpu_memory import keep_freed_memory  # noqa: E402
from reverie.evaluate import evaluate  # noqa: E402
from reverie.run import load_run  # noqa: E402


class TimedAgent:
    """``agent.act`` with the wall time of every call recorded (seconds)."""

    def __init__(self, agent):
        self.agent, self.times = agent, []

    def act(self, obs, state, mode):
        start = time.perf_counter()
        out = self.agent.act(obs, state, mode)
        self.times.append(time.perf_counter() - start)
        return out


def variant(run_path: str, planner: str, plan: dict, episodes: int, seed: int | None, envs: int,
            device: str) -> dict:
    run = load_run(run_path, device=device, planner=planner, plan=plan)
    seed = run.config["seed"] if seed is None else seed
    timed = TimedAgent(run.agent)
    torch.manual_seed(seed)
    result = evaluate(timed, run.config["env"], episodes, seed, mode="eval", max_envs=envs)
    call = statistics.median(timed.times)
    return {"acting": run.acting, "seed": seed, "env_steps": run.counters.get("env_steps"), "envs": envs,
            "ms_per_call": 1000 * call, "ms_per_action": 1000 * call / envs, "calls": len(timed.times),
            **{k: result[k] for k in ("mean", "std", "min", "max", "returns")}}


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
    rows = []
    if not args.no_actor:
        rows.append(variant(args.run, "actor", {}, args.episodes, args.seed, envs, args.device))
    for name in args.planner:
        rows.append(variant(args.run, name, plan, args.episodes, args.seed, envs, args.device))
    print(f"run {args.run} (env steps {rows[0]['env_steps']}), {args.episodes} episodes, seed {rows[0]['seed']}, "
          f"{envs} parallel envs, {args.threads} thread(s)")
    print(f"{'acting':<58} {'mean':>8} {'std':>7} {'min':>7} {'max':>7} {'ms/call':>9} {'ms/action':>9}")
    for row in rows:
        acting = row["acting"]
        name = acting.get("planner", "?")
        if name != "actor":
            name += " " + " ".join(f"{k}={acting[k]}" for k in ("horizon", "candidates", "top_k", "iterations",
                                                               "policy_candidates"))
            name += f" T={acting['temperature']}" if acting["planner"] == "mppi" else ""
        print(f"{name:<58} {row['mean']:8.1f} {row['std']:7.1f} {row['min']:7.1f} {row['max']:7.1f} "
              f"{row['ms_per_call']:9.1f} {row['ms_per_action']:9.1f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
