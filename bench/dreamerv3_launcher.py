"""Times the official DreamerV3 (JAX) gradient steps without changing its code (run by bench/vs_jax.py).

Runs INSIDE the throwaway JAX venv (it imports the official ``embodied`` and ``dreamerv3`` packages from
``--source``, never reverie). The official update is ``embodied.jax.agent.Agent.train`` (danijar/dreamerv3
e3f0224, embodied/jax/agent.py:264: world model + imagination + actor + critic, one call per gradient step).
Its call only dispatches the jitted step and returns; so the timer wraps the call AND a
``jax.block_until_ready(self.params)`` after it, and each timed figure is one finished gradient step. The
JAX profiler (``jaxcfg.profiler``, default on, traces a few early updates) is switched off on the first call.

    <jax-venv>/bin/python bench/dreamerv3_launcher.py --source <dreamerv3 checkout> --out times.json \\
        --skip 5 --max-seconds 120 -- --logdir <dir> --configs dmc_proprio --task dmc_cartpole_swingup ...

Writes ``{"times_s": [...], "cpu_times_s": [...], "skip": S, "stopped": "updates"|"time"|"run ended",
"jax": ...}`` to ``--out`` (times of the calls after the first ``--skip``, which include the jit compile) and
exits the process once ``--updates`` timed calls are done or ``--max-seconds`` have passed since the first call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="folder with danijar/dreamerv3's embodied/ and dreamerv3/")
    parser.add_argument("--out", required=True, help="JSON file for the per-update times")
    parser.add_argument("--skip", type=int, default=5, help="untimed first updates (jit compile, warm-up)")
    parser.add_argument("--updates", type=int, default=0, help="timed updates, then exit (0: no bound)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="stop this long after the first update")
    parser.add_argument("flags", nargs="*", help="dreamerv3/main.py flags (after --)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.source))

    import jax
    import embodied.jax.agent as jax_agent
    from dreamerv3.main import main as dreamerv3_main

    original = jax_agent.Agent.train
    times: list[float] = []
    cpu_times: list[float] = []
    state = {"calls": 0, "first": None}

    def finish(stopped: str) -> None:
        with open(args.out, "w") as f:
            json.dump({"times_s": times, "cpu_times_s": cpu_times, "skip": args.skip, "stopped": stopped,
                       "jax": jax.__version__}, f)
        sys.stdout.flush()
        os._exit(0)  # ends the official run loop (and its threads) right here: nothing else is left to time

    def timed_train(self, carry, data):
        if state["first"] is None:
            self.jaxcfg.profiler = False
            state["first"] = time.perf_counter()
        start, cpu_start = time.perf_counter(), time.process_time()
        out = original(self, carry, data)
        jax.block_until_ready(self.params)  # the call only dispatches: wait until this step is computed
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        state["calls"] += 1
        if state["calls"] > args.skip:
            times.append(elapsed)
            cpu_times.append(cpu)
        if args.updates and len(times) >= args.updates:
            finish("updates")
        if time.perf_counter() - state["first"] > args.max_seconds:
            finish("time")
        return out

    jax_agent.Agent.train = timed_train
    dreamerv3_main(args.flags)
    finish("run ended")


if __name__ == "__main__":
    main()
