"""Paired A/B timing of two reverie checkouts' DreamerV3 update, in one process, updates alternated.

    .venv/bin/python bench/paired_update.py /tmp/before .            # size xs, 16 pairs, 2 threads
    git worktree add --detach /tmp/before HEAD~1                      # a checkout of the previous commit
    .venv/bin/python bench/paired_update.py /tmp/before . --size s --pairs 8

Why: on a shared or virtualised machine the speed of the CPU drifts by 10% and more within minutes, so two
separate runs of ``bench/update_time.py`` cannot resolve a change of a few percent. Here both trees' agents are
built in the same process (each tree's ``reverie`` imported in turn under the same name), with the same batch,
seed, threads and allocator settings (:mod:`reverie.runtime.cpu_memory`), and their updates alternate (A B, B A, A B,
...), so both see the same machine at nearly the same moment. Printed: the median ms/update of each, and the
median of the per-pair ratios A/B (> 1: B is faster) with its range.

Each tree must contain ``bench/profile_update.py`` (its ``build`` and ``cartpole_batch``: the shapes of
bench/vs_sheeprl.py, CartPole vector obs, batch 16 x 64, horizon 15).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

import torch


def load(root: str, size: str, precision: str):
    """Build ``root``'s agent and batch with ``root``'s own ``reverie`` (earlier imports of it are dropped)."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("reverie", "bench", "profile_update")]:
        del sys.modules[name]
    paths = [os.path.abspath(root), os.path.join(os.path.abspath(root), "bench")]
    sys.path[:0] = paths
    try:
        module = importlib.import_module("profile_update")
        return module.build(size, precision, False), module.cartpole_batch(64, 16)
    finally:
        for path in paths:
            sys.path.remove(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree_a", help="checkout A (e.g. a git worktree of the previous commit)")
    parser.add_argument("tree_b", help="checkout B (e.g. .)")
    parser.add_argument("--size", default="xs")
    parser.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--pairs", type=int, default=16, help="timed updates per tree")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = [load(root, args.size, args.precision) for root in (args.tree_a, args.tree_b)]
    try:  # process-wide, so both trees run with it (a tree older than reverie/runtime/cpu_memory.py would not set it)
        from reverie.runtime.cpu_memory import keep_freed_memory
        keep_freed_memory()
    except ImportError:
        print("note: tree B has no reverie.runtime.cpu_memory; both trees run with glibc's default allocator settings")
    for agent, batch in runs:  # warm-up
        agent.update(batch)
        agent.update(batch)
    times: list[list[float]] = [[], []]
    for i in range(args.pairs):
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            agent, batch = runs[j]
            start = time.perf_counter()
            agent.update(batch)
            times[j].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(*times)]
    print(f"size {args.size}, {args.precision}, {args.threads} thread(s), {args.pairs} pairs: "
          f"A {statistics.median(times[0]) * 1e3:.1f} ms, B {statistics.median(times[1]) * 1e3:.1f} ms per update; "
          f"paired ratio A/B median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
