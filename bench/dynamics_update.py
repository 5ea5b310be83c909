"""Paired update time of DreamerV3 with two dynamics (or any two config variants), built from their configs as
``reverie train`` builds them, updates alternated in one process (A B, B A, ...; docs/transformer.md).

    taskset -c 1 .venv/bin/python bench/dynamics_update.py --preset classic          # CartPole: RSSM vs dynamics=storm
    taskset -c 1 .venv/bin/python bench/dynamics_update.py --preset dmc_cpu          # DMC proprio swingup widths
    taskset -c 1 .venv/bin/python bench/dynamics_update.py --a "" --b "dynamics=storm agent.module.imag_last=0"

``--preset classic``: ``exp=classic`` (size xs, batch 16 x 64, imagination from every row) against the same plus
``dynamics=storm``; CartPole's spaces (vector (4,), 2 one-hot actions). ``--preset dmc_cpu``: ``exp=dmc_cpu``
(size xxs, 16 x 32, the last 8 rows) against the same plus ``dynamics=storm``; cartpole_swingup's spaces (vector
(5,), one action in [-1, 1]). ``--a``/``--b``: further overrides for each side. The batch is random data in the
contract (``is_first`` at row 0 and at 2% of the rest), the same for both. Prints the median ms per update of each
and the median of the per-pair ratios B/A (> 1: B is slower) with its range, and the load average: on a shared
machine quote the ratio, not the milliseconds.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT  # this tree's reverie, not an installed one
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import statistics
import time

import numpy as np
import torch

from reverie.agents.build import build_agent
from reverie.configs.compose import load_config
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.types import ActionSpec

PRESETS = {"classic": (["exp=classic"], {"vector": (4,)}, ActionSpec(True, 2)),
           "dmc_cpu": (["exp=dmc_cpu", "env.task=cartpole_swingup"], {"vector": (5,)}, ActionSpec(False, 1))}


def batch_for(spec: ActionSpec, obs: int, T: int, B: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A replay batch ``(T, B, ...)``: ``is_first`` at row 0 and at 2% of the rest, zero previous action there."""
    rng = np.random.default_rng(seed)
    is_first = rng.random((T, B)) < 0.02
    is_first[0] = True
    action = np.eye(spec.dim)[rng.integers(spec.dim, size=(T, B))] if spec.discrete else \
        rng.uniform(-1.0, 1.0, size=(T, B, spec.dim))
    return {"vector": rng.normal(size=(T, B, obs)).astype(np.float32),
            "prev_action": (action * ~is_first[..., None]).astype(np.float32),
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": rng.random((T, B)) < 0.02}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="classic", choices=sorted(PRESETS))
    parser.add_argument("--a", default="", help="overrides of side A (space-separated), after the preset's")
    parser.add_argument("--b", default="dynamics=storm", help="overrides of side B (default: dynamics=storm)")
    parser.add_argument("--pairs", type=int, default=12, help="timed updates per side")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU
    base, shapes, spec = PRESETS[args.preset]
    agents, cfgs = [], []
    for extra in (args.a, args.b):
        cfg = load_config([*base, *extra.split()])
        torch.manual_seed(0)
        agents.append(build_agent(cfg.agent, shapes, spec))
        cfgs.append(cfg)
    T, B = int(cfgs[0].agent.batch_length), int(cfgs[0].agent.batch_size)
    if (int(cfgs[1].agent.batch_length), int(cfgs[1].agent.batch_size)) != (T, B):
        parser.error("both sides need the same agent.batch_length and agent.batch_size (one batch for both)")
    batch = batch_for(spec, shapes["vector"][0], T, B)
    for agent in agents:  # warm-up
        agent.update(batch)
        agent.update(batch)
    times: list[list[float]] = [[], []]
    for i in range(args.pairs):
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            agents[j].update(batch)
            times[j].append(time.perf_counter() - start)
    ratios = [b / a for a, b in zip(*times)]
    names = [type(a.wm.dynamics).__name__ for a in agents]
    print(f"{args.preset}: batch {B} x {T}, {args.threads} thread(s), {args.pairs} updates per side; "
          f"A {names[0]} [{args.a or '-'}] {statistics.median(times[0]) * 1e3:.0f} ms, "
          f"B {names[1]} [{args.b or '-'}] {statistics.median(times[1]) * 1e3:.0f} ms per update; "
          f"paired ratio B/A median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
