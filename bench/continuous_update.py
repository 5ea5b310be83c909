"""ms per DreamerV3 update with continuous actions (dynamics backprop), DMC cartpole_swingup shapes; paired A/B.

    .venv/bin/python bench/continuous_update.py . --preset dmc_cpu              # one tree, the exp=dmc_cpu widths
    .venv/bin/python bench/continuous_update.py /tmp/before . --preset dmc_cpu  # paired: two trees, alternated
    .venv/bin/python bench/continuous_update.py . --preset xs --threads 2       # the xs size preset, reference batch

Run from the repository root. The batch has the shapes of DMC cartpole_swingup from proprio (obs (5,), one action
dim in [-1, 1]). Presets: ``xs`` (deter 256, units 256, 32 x 32 latents, batch 16 x 64, every row starts an
imagination) and ``dmc_cpu`` (the widths of ``exp=dmc_cpu``: deter 128, units 128, 16 x 16 latents, batch 16 x 32,
imagination from the last 8 rows). With two trees, each tree's agent is built with its own ``reverie`` in this
process and their updates alternate (A B, B A, ...), so both see the machine at nearly the same moment; printed:
the median ms/update of each and the median of the per-pair ratios A/B (> 1: B is faster). Each tree's DreamerV3
must accept the keyword arguments of the preset.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

import numpy as np
import torch

PRESETS = {
    "xs": dict(model=dict(deter=256, units=256, stoch=32, classes=32, layers=1), T=64, B=16, imag_last=0),
    "dmc_cpu": dict(model=dict(deter=128, units=128, stoch=16, classes=16, layers=1), T=32, B=16, imag_last=8),
}


def swingup_batch(T: int, B: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A replay sample ``(T, B, ...)`` with cartpole_swingup's shapes (episodes of 500 steps: few is_first)."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    return {"vector": rng.normal(size=(T, B, 5)).astype(np.float32),
            "prev_action": rng.uniform(-1, 1, size=(T, B, 1)).astype(np.float32),
            "reward": rng.random((T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}


def load(root: str, preset: dict, precision: str):
    """Build ``root``'s continuous-action agent with ``root``'s own ``reverie`` (earlier imports are dropped)."""
    for name in [n for n in sys.modules if n.split(".")[0] == "reverie"]:
        del sys.modules[name]
    sys.path.insert(0, os.path.abspath(root))
    try:
        agents = importlib.import_module("reverie.agents")
        types = importlib.import_module("reverie.types")
        torch.manual_seed(0)
        kwargs = dict(preset["model"], precision=precision)
        if preset["imag_last"]:
            kwargs["imag_last"] = preset["imag_last"]
        agent = agents.DreamerV3({"vector": (5,)}, types.ActionSpec(False, 1), **kwargs)
        return agent, swingup_batch(preset["T"], preset["B"])
    finally:
        sys.path.remove(os.path.abspath(root))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", help="one checkout, or two (A then B) for a paired comparison")
    parser.add_argument("--preset", default="dmc_cpu", choices=sorted(PRESETS))
    parser.add_argument("--precision", default="float32", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--updates", type=int, default=16, help="timed updates per tree")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if len(args.trees) > 2:
        parser.error("give one tree or two")
    torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]
    runs = [load(root, preset, args.precision) for root in args.trees]
    for agent, batch in runs:  # warm-up
        agent.update(batch)
        agent.update(batch)
    times: list[list[float]] = [[] for _ in runs]
    for i in range(args.updates):
        order = range(len(runs)) if i % 2 == 0 else reversed(range(len(runs)))
        for j in order:
            agent, batch = runs[j]
            start = time.perf_counter()
            agent.update(batch)
            times[j].append(time.perf_counter() - start)
    head = f"preset {args.preset}, {args.precision}, {args.threads} thread(s), {args.updates} updates per tree"
    if len(runs) == 1:
        print(f"{head}: {statistics.median(times[0]) * 1e3:.1f} ms per update (min {min(times[0]) * 1e3:.1f})")
        return
    ratios = [a / b for a, b in zip(*times)]
    print(f"{head}: A {statistics.median(times[0]) * 1e3:.1f} ms, B {statistics.median(times[1]) * 1e3:.1f} ms per "
          f"update; paired ratio A/B median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
