"""CEM planning time per action for PlaNet's world model. Prints numbers.

    OMP_NUM_THREADS=1 .venv/bin/python bench/planning.py    # reference: 1000 x 12 x 10, size 200/30/200
    .venv/bin/python bench/planning.py --candidates 250 --horizon 15 --iterations 5 --deter 100 --stoch 16 --units 100
    .venv/bin/python bench/planning.py --candidates 150 --horizon 10 --iterations 4 --top-k 15 --deter 100 --stoch 16 \
        --units 100 --head-units 100 --head-layers 2 --no-cont                   # agent_exp/planet_classic.yaml

Times ``PlaNet.act`` (posterior filter + CEM, what one env step costs at collection time) for a batch of
``--envs`` envs on vector observations; the CEM dominates (``iterations x horizon`` open-loop steps over
``envs x candidates`` latent states). Reports the median and the spread of ``--repeats`` calls after warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import numpy as np
import torch

from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.agents.planet import PlaNet
from reverie.models.dynamics import GaussianRSSM
from reverie.types import ActionSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--horizon", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--deter", type=int, default=200)
    parser.add_argument("--stoch", type=int, default=30)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--head-units", type=int, default=300, help="reward/continue heads (reference 3 x 300)")
    parser.add_argument("--head-layers", type=int, default=3)
    parser.add_argument("--action-dim", type=int, default=1)
    parser.add_argument("--discrete", action="store_true", help="categorical CEM over Discrete(action-dim)")
    parser.add_argument("--envs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-cont", action="store_true", help="plan without the continue head")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="float32", help="float32 | bfloat16 | auto (autocast compute dtype)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)
    torch.manual_seed(0)
    spec = ActionSpec(args.discrete, args.action_dim)
    dynamics = partial(GaussianRSSM, deter=args.deter, stoch=args.stoch, units=args.units)
    agent = PlaNet({"vector": (5,)}, spec, dynamics=dynamics, units=args.units,
                   head_units=args.head_units, head_layers=args.head_layers,
                   candidates=args.candidates, horizon=args.horizon, iterations=args.iterations,
                   top_k=min(args.top_k, args.candidates), plan_cont=not args.no_cont, device=args.device,
                   precision=args.precision)
    obs = {"vector": np.zeros((args.envs, 5), np.float32), "is_first": np.ones(args.envs, bool)}
    agent.act(obs, None, "explore")  # warm-up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        agent.act(obs, None, "explore")
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    ms = [t * 1000 for t in times]
    steps = args.iterations * args.horizon
    print(f"CEM {args.candidates} candidates x horizon {args.horizon} x {args.iterations} iterations, model "
          f"{args.deter}/{args.stoch}/{args.units}, heads {args.head_layers} x {args.head_units}, {args.envs} env(s), "
          f"{args.threads} thread(s), {args.device}, {args.precision}:")
    print(f"  {statistics.median(ms):.1f} ms per planned action (median of {args.repeats}; min {min(ms):.1f}, "
          f"max {max(ms):.1f}); {statistics.median(ms) / steps:.2f} ms per open-loop step of "
          f"{args.envs * args.candidates} states")


if __name__ == "__main__":
    main()
