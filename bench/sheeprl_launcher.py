"""Times sheeprl's DreamerV3 gradient steps without changing the algorithm (run by bench/vs_sheeprl.py).

Runs INSIDE the throwaway sheeprl venv (it imports sheeprl, never reverie). sheeprl's DreamerV3 update is the
function ``train`` in ``sheeprl.algos.dreamer_v3.dreamer_v3`` (world model + imagination + actor + critic, one
call per gradient step; ``main`` looks it up as a module global at every call), so wrapping that global with a
timer and then calling ``sheeprl.cli.run()`` times each update as sheeprl runs it (docs/speed.md).

    <sheeprl-venv>/bin/python bench/sheeprl_launcher.py --out times.json --warmup 2 --updates 10 \\
        --max-seconds 300 --threads 1 -- exp=dreamer_v3 env=gym env.id=CartPole-v1 algo=dreamer_v3_XS ...

Writes ``{"times_s": [...], "cpu_times_s": [...], "warmup": W, "stopped": "updates"|"time", "torch": ...,
"sheeprl": ...}`` to ``--out`` and exits the process as soon as ``--updates`` timed calls (after ``--warmup``
untimed ones) are done, or when ``--max-seconds`` of wall time have passed since the first update.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file for the per-update times")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first updates (allocator warm-up)")
    parser.add_argument("--updates", type=int, default=10, help="timed updates, then the process exits")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop this long after the first update")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (sheeprl num_threads)")
    parser.add_argument("overrides", nargs="*", help="sheeprl Hydra overrides (after --)")
    args = parser.parse_args()

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    import sheeprl
    import sheeprl.algos.dreamer_v3.dreamer_v3 as dv3
    from sheeprl.cli import run

    original = dv3.train
    times: list[float] = []
    cpu_times: list[float] = []  # process CPU seconds: less inflated than wall time when other jobs share the CPU
    state = {"calls": 0, "first": None}

    def finish(stopped: str) -> None:
        with open(args.out, "w") as f:
            json.dump({"times_s": times, "cpu_times_s": cpu_times, "warmup": args.warmup, "stopped": stopped,
                       "torch": torch.__version__,
                       "sheeprl": getattr(sheeprl, "__version__", "?"), "threads": torch.get_num_threads()}, f)
        sys.stdout.flush()
        os._exit(0)  # ends sheeprl's loop (and its env workers) right here: nothing else is left to time

    def timed_train(*a, **kw):
        if state["first"] is None:
            state["first"] = time.perf_counter()
        start, cpu_start = time.perf_counter(), time.process_time()
        out = original(*a, **kw)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        state["calls"] += 1
        if state["calls"] > args.warmup:
            times.append(elapsed)
            cpu_times.append(cpu)
            print(f"[sheeprl_launcher] update {len(times)}/{args.updates}: {elapsed * 1e3:.1f} ms", flush=True)
        if len(times) >= args.updates:
            finish("updates")
        if time.perf_counter() - state["first"] > args.max_seconds:
            finish("time")
        return out

    dv3.train = timed_train
    sys.argv = [sys.argv[0], *args.overrides, f"num_threads={args.threads}"]
    run()
    finish("run ended")  # the run ended before enough updates (e.g. total_steps too small)


if __name__ == "__main__":
    main()
