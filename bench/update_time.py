"""Median CPU and wall time of reverie's full DreamerV3 update per size and precision (docs/speed.md).

    OMP_NUM_THREADS=1 .venv/bin/python bench/update_time.py --sizes xs s --precision float32 auto
    OMP_NUM_THREADS=1 .venv/bin/python bench/update_time.py --sizes xs --kernels off  # the readable path
    OMP_NUM_THREADS=1 .venv/bin/python bench/update_time.py --agents dreamerv3 dreamerv3_2025 --sizes size1m xs

``--agents``: each agent is built from its config (``agent=<name> size=<size>``, as ``reverie train`` builds it), so
the 2023 and the current agent are timed by the same code at the same size preset.

Run from the repository root. The update is the one of bench/run.py (CartPole-sized vector batch 16 x 64, horizon
15, discrete actions), after one untimed warm-up update. Prints, per size and precision, the median and minimum
process CPU time (the usable figure on a shared machine: 1 thread) and wall time, and the load average. To time
another checkout (e.g. main, for a before/after), copy this file into its bench/ and run it there.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT  # this tree's reverie, not an installed one (see bench/profile_update.py)
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import statistics
import time

import torch

from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec

from bench.run import SIZES, cartpole_batch, sized


def build(agent_name: str | None, size: str, precision: str, kernels: str):
    """The agent timed: ``DreamerV3`` from the size preset's keys (``agent_name`` None, the script's original
    path), or any agent built from its config ``agent=<agent_name> size=<size>``."""
    if agent_name is None:
        return DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **sized(size, kernels=kernels, precision=precision))
    from reverie.agents.build import build_agent
    from reverie.configs.compose import load_config

    context = ["agent.module.replay_context=0"] if agent_name == "dreamerv3_2025" else []  # no stored latents here
    cfg = load_config([f"agent={agent_name}", f"size={size}", f"agent.module.precision={precision}",
                       f"agent.module.kernels={kernels}", *context])
    return build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(True, 2))


def time_update(size: str, precision: str, updates: int, kernels: str,
                agent_name: str | None = None) -> tuple[list[float], list[float]]:
    """``(cpu seconds, wall seconds)`` of ``updates`` timed updates after one warm-up."""
    torch.manual_seed(0)
    agent = build(agent_name, size, precision, kernels)
    batch = cartpole_batch(64, 16)
    agent.update(batch)  # warm-up (allocator, autocast caches)
    cpu, wall = [], []
    for _ in range(updates):
        start, cpu_start = time.perf_counter(), time.process_time()
        agent.update(batch)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["xs", "s"], choices=sorted(SIZES))
    parser.add_argument("--precision", nargs="+", default=["float32", "auto"], choices=["float32", "auto", "bfloat16"])
    parser.add_argument("--updates", type=int, default=5, help="timed updates per size and precision")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--kernels", default="auto", choices=["auto", "off"], help="agent.module.kernels")
    parser.add_argument("--agents", nargs="+", default=[None], help="agent configs to build (e.g. dreamerv3 "
                        "dreamerv3_2025); default: DreamerV3 from the size preset")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); B16 x T64, H15; "
          f"kernels {args.kernels}; {args.updates} timed updates")
    print(f"{'agent':<15} {'size':<8} {'precision':<9} {'CPU median':>11} {'CPU min':>9} {'wall median':>12} "
          f"{'wall min':>9} {'load':>5}")
    for size in args.sizes:
        for precision in args.precision:
            for agent_name in args.agents:
                cpu, wall = time_update(size, precision, args.updates, args.kernels, agent_name)
                print(f"{agent_name or 'DreamerV3':<15} {size:<8} {precision:<9} {statistics.median(cpu) * 1e3:9.0f}ms "
                      f"{min(cpu) * 1e3:7.0f}ms "
                      f"{statistics.median(wall) * 1e3:10.0f}ms {min(wall) * 1e3:7.0f}ms {os.getloadavg()[0]:5.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
