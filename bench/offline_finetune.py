"""Offline pretraining, then online fine-tuning, against learning from scratch (issue 19's table; docs/offline.md).

For each env (CartPole-v1, Pendulum-v1; DreamerV3 xs, exp=classic):

1. source policy: ``reverie train`` from scratch for ``--source-steps`` env steps (seed 100), or ``--source RUN``,
   or ``--source pkg.module.function``, a scripted controller (:func:`reverie.envs.testing.cartpole_balance`,
   also importable from here, for a budget that cannot afford training one);
2. dataset: ``reverie record`` of ``--episodes`` episodes of the source policy with per-step probability
   ``--epsilon`` of a uniform random action, plus ``--random-episodes`` episodes of the random policy (seed 0);
   held-out data: the same mix, fewer episodes, another seed (7);
3. per seed: ``reverie pretrain`` (``--updates`` full updates: world model and actor-critic in imagination, so the
   offline policy can be scored), then ``reverie train init_from=<pretrain run>`` (dataset kept in replay) and
   ``reverie train`` from scratch, both for ``--online-steps`` env steps with the same seed and eval cadence;
4. table: the offline policy's eval return before any online step, eval return against online env steps for
   fine-tuned vs scratch (mean over seeds and each seed), and the world model's open-loop error on the held-out
   episodes (the pretrained model, and the final fine-tuned and scratch models).

Every run is an ordinary ``python -m reverie`` process (``threads=1``; pin the script with ``taskset``). Prints the
table and writes ``<out>/results.json`` and ``<out>/table.md``::

    taskset -c 1 env OMP_NUM_THREADS=1 .venv/bin/python bench/offline_finetune.py --out bench_runs/offline
    taskset -c 1 env OMP_NUM_THREADS=1 .venv/bin/python bench/offline_finetune.py --env pendulum --seeds 0 1 2
    ... --env cartpole --source bench.offline_finetune.cartpole_balance --override size=debug   # no source run
    ... --override size=debug --source-steps 2000 --updates 100 --online-steps 1000   # a quick pipeline check
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from reverie.envs.testing import cartpole_balance  # noqa: F401  (--source bench.offline_finetune.cartpole_balance)

ENVS = {"cartpole": "env=cartpole", "pendulum": "env=pendulum"}


def reverie(*args: str) -> None:
    """``python -m reverie ARGS`` in a child process; raises when it fails."""
    cmd = [sys.executable, "-m", "reverie", *args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def common(args: argparse.Namespace, env: str) -> list[str]:
    return [ENVS[env], "exp=classic", "threads=1", "train.progress=false", "train.video=false", "logger=none",
            f"train.eval_episodes={args.eval_episodes}", *args.override]


def evals(run_dir: Path) -> list[tuple[int, float]]:
    return [(int(step), float(ret)) for step, _, ret in json.loads((run_dir / "summary.json").read_text())["evals"]]


def heldout_error(run_dir: Path, heldout: Path, length: int, sequences: int) -> dict[str, float]:
    """The open-loop errors of a run's final world model on the held-out episodes (fixed windows)."""
    from reverie.data import load_dataset
    from reverie.data.heldout import heldout_errors, heldout_replay
    from reverie.state.saved_run import load_run

    run = load_run(run_dir, checkpoint="last")  # the final model
    replay = heldout_replay(load_dataset(heldout, run.config["env"]))
    return heldout_errors(run.agent, replay, length, sequences)


def run_env(args: argparse.Namespace, env: str, out: Path) -> dict:
    base = common(args, env)
    scripted = bool(args.source) and not Path(args.source).exists()  # an import path, not a run
    source = args.source if scripted else Path(args.source) if args.source else out / "source"
    if not args.source and not (source / "summary.json").exists():
        reverie("train", *base, "seed=100", f"train.steps={args.source_steps}", f"run_dir={source}",
                f"train.eval_every={args.source_steps}")
    data, heldout = out / "data", out / "heldout"
    if not (data / "dataset.json").exists():
        reverie("record", "--out", str(data), "--policy", str(source), "--episodes", str(args.episodes),
                "--epsilon", str(args.epsilon), ENVS[env], "seed=0")
        reverie("record", "--out", str(data), "--episodes", str(args.random_episodes), ENVS[env], "seed=0")
        reverie("record", "--out", str(heldout), "--policy", str(source), "--episodes",
                str(max(2, args.episodes // 4)), "--epsilon", str(args.epsilon), ENVS[env], "seed=7")
        reverie("record", "--out", str(heldout), "--episodes", str(max(1, args.random_episodes // 4)), ENVS[env],
                "seed=7")
    # a scripted source has no evaluations (the table shows the mean return of each recording of the mix)
    result: dict = {"source": {"run": str(source), "evals": [] if scripted else evals(source)},
                    "dataset": json.loads((data / "dataset.json").read_text())["recordings"], "seeds": {}}
    online = [f"train.steps={args.online_steps}", f"train.eval_every={args.eval_every}"]
    for seed in args.seeds:
        pre, fine, scratch = out / f"pretrain_s{seed}", out / f"finetune_s{seed}", out / f"scratch_s{seed}"
        if not (pre / "summary.json").exists():
            reverie("pretrain", str(data), *base, f"seed={seed}", f"run_dir={pre}", f"pretrain.updates={args.updates}",
                    "pretrain.behavior=true", f"pretrain.report_every={args.updates}", f"pretrain.heldout={heldout}",
                    f"pretrain.log_every={max(1, args.updates // 4)}", f"pretrain.checkpoint_every={args.updates}")
        for run_dir, extra in ((fine, [f"init_from={pre}"]), (scratch, [])):
            if not (run_dir / "summary.json").exists():
                reverie("train", *base, f"seed={seed}", f"run_dir={run_dir}", *online, *extra)
        rows = [json.loads(line) for line in (pre / "metrics.jsonl").read_text().splitlines()]
        length = int(OmegaConf.load(pre / "config.yaml").agent.batch_length)  # windows of the training length
        result["seeds"][seed] = {
            "offline_policy_return": evals(pre)[-1][1],
            "pretrain_heldout": {k: v for r in rows for k, v in r.items() if k.startswith("heldout/")},
            "finetune": evals(fine), "scratch": evals(scratch),
            "finetune_heldout": heldout_error(fine, heldout, length, args.sequences),
            "scratch_heldout": heldout_error(scratch, heldout, length, args.sequences)}
    return result


def table(env: str, result: dict) -> str:
    seeds = result["seeds"]
    mix = "; ".join(f"{r['episodes']} episodes ({r['steps']} steps, mean return {np.mean(r['returns']):.1f}) of "
                    f"{r['policy']}" for r in result["dataset"])
    source = result["source"]
    lines = [f"### {env}", "", f"dataset: {mix}", f"source policy: {source['run']}" + (
        f", eval return {source['evals'][-1][1]:.1f}" if source["evals"] else " (scripted, not evaluated)"), "",
        "| | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |", "|---" * (len(seeds) + 2) + "|"]

    def row(name: str, values: list[float]) -> None:
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {sum(values) / len(values):.2f} |")

    row("offline policy, 0 online steps", [s["offline_policy_return"] for s in seeds.values()])
    for step in [e[0] for e in next(iter(seeds.values()))["scratch"]]:
        for kind in ("finetune", "scratch"):
            row(f"{kind} @ {step} env steps", [dict(s[kind])[step] for s in seeds.values()])
    key = "heldout/openloop/vector_error"
    row("open-loop error (held out), pretrained", [s["pretrain_heldout"][key] for s in seeds.values()])
    row("open-loop error (held out), fine-tuned end", [s["finetune_heldout"][key] for s in seeds.values()])
    row("open-loop error (held out), scratch end", [s["scratch_heldout"][key] for s in seeds.values()])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--source", default=None, help="a trained run to record from (default: train one)")
    parser.add_argument("--source-steps", type=int, default=5000)
    parser.add_argument("--episodes", type=int, default=30, help="episodes of the source policy (with --epsilon)")
    parser.add_argument("--epsilon", type=float, default=0.3)
    parser.add_argument("--random-episodes", type=int, default=10)
    parser.add_argument("--updates", type=int, default=500, help="pretrain updates (world model + actor-critic)")
    parser.add_argument("--online-steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--sequences", type=int, default=64, help="held-out windows for the open-loop error")
    parser.add_argument("--override", nargs="*", default=[],
                        help="more Hydra overrides for every run (e.g. size=debug for a quick check of the pipeline)")
    parser.add_argument("--out", default="bench_runs/offline_finetune")
    args = parser.parse_args()
    results, tables = {}, []
    for env in args.env:
        out = Path(args.out) / env
        out.mkdir(parents=True, exist_ok=True)
        results[env] = run_env(args, env, out)
        tables.append(table(env, results[env]))
        print(tables[-1], flush=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1))
    (Path(args.out) / "table.md").write_text("\n\n".join(tables) + "\n")


if __name__ == "__main__":
    main()
