"""Paired A/B timing of two reverie checkouts' DreamerV3 update, in one process, updates alternated.

    git worktree add --detach /tmp/before HEAD~1                     # a checkout of the previous commit
    taskset -c 1 .venv/bin/python bench/paired_update.py /tmp/before . --size xs --threads 1
    taskset -c 1 .venv/bin/python bench/paired_update.py /tmp/before . --config continuous --kernels off

Why: on a shared or virtualised machine the speed of the CPU drifts by 10% and more within minutes, so two
separate runs of ``bench/update_time.py`` cannot resolve a change of a few percent. Here both trees' agents are
built in the same process (each tree's ``reverie`` imported in turn under the same name), with the same batch,
seed, threads and allocator settings (:mod:`reverie.runtime.cpu_memory`), and their updates alternate (A B, B A,
A B, ...), so both see the same machine at nearly the same moment. Printed: the median ms/update of each, and the
median of the per-pair ratios A/B (> 1: B is faster) with its range.

Configs: ``discrete`` (CartPole-sized: vector obs (4,), 2 one-hot actions) and ``continuous`` (Pendulum-sized:
vector obs (3,), one action in [-1, 1]); batch 16 x 64, horizon 15, the ``--size`` preset. ``--kernels auto|off``
is ``agent.module.kernels`` for a tree with ``reverie/models/kernels/``; for an older tree, ``off`` turns its
fast paths off one by one where it had switches (``onehot_gather=False``, the fused and deferred-weight scans, the
actor tape), which leaves the few it had no switch for (the two-hot and straight-through nodes, the sampler).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import statistics
import sys
import time
from functools import partial

import numpy as np
import torch
import yaml


def make_batch(config: str, T: int = 64, B: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """A replay batch ``(T, B, ...)`` of the config's shapes, ``is_first`` at t = 0 and at 2% of the rest."""
    rng = np.random.default_rng(seed)
    is_first = rng.random((T, B)) < 0.02
    is_first[0] = True
    if config == "discrete":
        obs, action = rng.normal(size=(T, B, 4)), np.eye(2)[rng.integers(2, size=(T, B))]
    else:
        obs, action = rng.normal(size=(T, B, 3)), rng.uniform(-1.0, 1.0, size=(T, B, 1))
    return {"vector": obs.astype(np.float32), "prev_action": (action * ~is_first[..., None]).astype(np.float32),
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": rng.random((T, B)) < 0.02}


def load(root: str, size: str, precision: str, config: str, kernels: str):
    """Build ``root``'s agent with ``root``'s own ``reverie`` (earlier imports of it are dropped)."""
    for name in [n for n in sys.modules if n.split(".")[0] == "reverie"]:
        del sys.modules[name]
    root = os.path.abspath(root)
    sys.path.insert(0, root)
    try:
        DreamerV3 = importlib.import_module("reverie.agents.dreamer").DreamerV3
        ActionSpec = importlib.import_module("reverie.types").ActionSpec
        with open(os.path.join(root, "reverie", "configs", "size", f"{size}.yaml")) as f:
            s = yaml.safe_load(f)
        shapes = {"vector": (4,) if config == "discrete" else (3,)}
        spec = ActionSpec(config == "discrete", 2 if config == "discrete" else 1)
        torch.manual_seed(0)
        if "dynamics" in inspect.signature(DreamerV3).parameters:  # reverie/models/dynamics and kernels/
            rssm = importlib.import_module("reverie.models.dynamics").CategoricalRSSM
            dynamics = partial(rssm, deter=s["deter"], stoch=s["stoch"], classes=s["classes"], units=s["units"],
                               kernels=kernels)
            agent = DreamerV3(shapes, spec, dynamics=dynamics, units=s["units"], layers=s["layers"],
                              precision=precision, kernels=kernels)
        else:  # the layout before: the fast paths' own switches
            agent = DreamerV3(shapes, spec, deter=s["deter"], stoch=s["stoch"], classes=s["classes"],
                              units=s["units"], layers=s["layers"], precision=precision,
                              onehot_gather=kernels == "auto")
            if kernels == "off":
                agent.wm.rssm.fused_observe = agent.wm.rssm.defer_weight_grads = False
                agent.compiled = True  # only read to decide the actor tape: no tape
        return agent
    finally:
        sys.path.remove(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree_a", help="checkout A (e.g. a git worktree of the previous commit)")
    parser.add_argument("tree_b", help="checkout B (e.g. .)")
    parser.add_argument("--size", default="xs")
    parser.add_argument("--config", default="discrete", choices=["discrete", "continuous"])
    parser.add_argument("--kernels", default="auto", choices=["auto", "off"])
    parser.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--pairs", type=int, default=16, help="timed updates per tree")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    agents = [load(root, args.size, args.precision, args.config, args.kernels) for root in (args.tree_a, args.tree_b)]
    from reverie.runtime.cpu_memory import keep_freed_memory  # tree B's; process-wide, so both trees run with it

    keep_freed_memory()
    batch = make_batch(args.config)
    for agent in agents:  # warm-up
        agent.update(batch)
        agent.update(batch)
    times: list[list[float]] = [[], []]
    for i in range(args.pairs):
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            agents[j].update(batch)
            times[j].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(*times)]
    print(f"{args.config}, size {args.size}, kernels {args.kernels}, {args.precision}, {args.threads} thread(s), "
          f"{args.pairs} pairs: A {statistics.median(times[0]) * 1e3:.1f} ms, B {statistics.median(times[1]) * 1e3:.1f} "
          f"ms per update; paired ratio A/B median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
