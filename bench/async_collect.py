"""train.async_collect: env steps/s and updates/s with and without stepping the envs during the updates.

    .venv/bin/python bench/async_collect.py                               # xs, CartPole + 50 ms sleep per step
    .venv/bin/python bench/async_collect.py --size debug --sleep 0.02 --iterations 40

Runs ``reverie train`` twice with the same seed and ``env.vector_mode=async`` (one process per env), once with
``train.async_collect=false`` (act, step, wait, update) and once with ``true`` (act, send the step, update,
wait), on CartPole-v1 made slow by :class:`reverie.envs.testing.Sleep` (a stand-in for a simulator or a robot
whose step takes ``--sleep`` seconds). Rates are taken over the learning phase only (from the first metrics
row with updates to the last row, so process start-up, prefill and the final evaluation are left out).
``--train-ratio`` sets the updates per loop iteration (``train_ratio * N / (batch * length)``); the overlap
saves up to ``min(env step, updates)`` per iteration. Both runs must end with the same update count and the
same last losses (the switch changes wall time only); the script checks that and says so. It also prints the
median time per learning iteration that the loop waited for the envs (``step``, or ``step_wait`` after the
updates), which does not depend on how busy the machine is: about ``--sleep`` without the switch, about 0 with it
when the updates take longer than an env step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from reverie.cli import main as reverie_main
from reverie.envs.stepper import VectorStepper

BLOCKED: list[tuple[int, str, float]] = []  # (stepper id, method, seconds) of every step / step_wait call


def _timed(method):
    def wrapper(self, *args):
        start = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            BLOCKED.append((id(self), method.__name__, time.perf_counter() - start))
    return wrapper


VectorStepper.step = _timed(VectorStepper.step)  # async_collect=false waits here
VectorStepper.step_wait = _timed(VectorStepper.step_wait)  # async_collect=true waits here (step() calls it too)


def run(run_dir: Path, overrides: list[str], learning_iterations: int) -> dict:
    """Train and return the learning-phase rates from ``metrics.jsonl`` and the median wait for the envs."""
    BLOCKED.clear()
    assert reverie_main(["train", f"run_dir={run_dir}", *overrides]) == 0
    # the training stepper is the first one used (evaluation builds its own); step() calls step_wait(): count it once
    waits = [t for owner, name, t in BLOCKED if owner == BLOCKED[0][0] and name == "step_wait"]
    blocked = waits[-learning_iterations:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    learning = [r for r in rows if r.get("updates", 0) > 0]
    first, last = learning[0], learning[-1]
    wall = last["wall_s"] - first["wall_s"]
    return {"env_steps/s": (last["step"] - first["step"]) / wall,
            "updates/s": (last["updates"] - first["updates"]) / wall,
            "wall_s": wall, "updates": last["updates"], "loss/model": last.get("loss/model"),
            "blocked_ms": 1000 * statistics.median(blocked) if blocked else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="xs", help="size preset (xs, debug, s, ...)")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds added to every env step")
    parser.add_argument("--train-ratio", type=float, default=512.0,
                        help="512 at batch 16x64 and 2 envs: 1 update per iteration")
    parser.add_argument("--iterations", type=int, default=30, help="loop iterations after prefill (N env steps each)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    n = args.num_envs
    prefill = 64 * n  # enough rows for one 16 x 64 batch (batch_length 64 < 64 * N / N + 1)
    log_every = 5 * n
    steps = prefill + args.iterations * n
    steps += (-steps) % log_every  # the last metrics row is written inside the loop, before the final evaluation
    common = [f"size={args.size}", "env=cartpole", f"env.num_envs={n}", "env.vector_mode=async", "env.time_limit=200",
              f"env.wrappers=[{{_target_: reverie.envs.testing.Sleep, seconds: {args.sleep}}}]",
              f"agent.train_ratio={args.train_ratio}", f"train.steps={steps}", f"train.prefill={prefill}",
              f"train.log_every={log_every}", "train.eval_every=0", "train.eval_episodes=1", "train.checkpoint_every=0",
              "train.report_every=0", "train.video=false", "train.progress=false", "logger=none",
              f"threads={args.threads}", "seed=0"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for on in (False, True):
            results[on] = run(Path(tmp) / f"async_{on}", [*common, f"train.async_collect={on}"],
                              args.iterations - 2)
    print(f"\nsize={args.size} N={n} sleep={args.sleep * 1000:.0f} ms/step train_ratio={args.train_ratio} "
          f"threads={args.threads}; learning phase only")
    print(f"{'async_collect':<14} {'env steps/s':>12} {'updates/s':>10} {'wall s':>8} {'updates':>8} "
          f"{'waits for envs (median ms/iteration)':>38}")
    for on, r in results.items():
        print(f"{str(on).lower():<14} {r['env_steps/s']:>12.2f} {r['updates/s']:>10.3f} {r['wall_s']:>8.1f} "
              f"{r['updates']:>8} {r['blocked_ms']:>38.1f}")
    speedup = results[True]["updates/s"] / results[False]["updates/s"]
    same = (results[True]["updates"] == results[False]["updates"]
            and results[True]["loss/model"] == results[False]["loss/model"])
    print(f"speed-up (updates/s and env steps/s): {speedup:.2f}x; same updates and last loss/model: {same}")


if __name__ == "__main__":
    main()
