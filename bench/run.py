"""Speed and memory benchmarks (docs/speed.md). Prints numbers; not part of `make test`.

    .venv/bin/python bench/run.py                       # everything below, defaults
    .venv/bin/python bench/run.py --sizes xs s --updates 10
    .venv/bin/python bench/run.py --only replay

Reports, on this machine:
- update: median ms per full DreamerV3 update (world model + imagination + actor + critic) and updates/s
  per size preset, on CartPole-sized vector inputs, batch 16 x 64, horizon 15 (the reference shapes);
- act: env steps/s of the policy acting in CartPole-v1 through the vector env (N envs);
- env: env steps/s of CartPole-v1 with random actions through the vector env (no agent);
- replay: median sample time of a 16 x 64 batch at capacity 1e4 vs 1e6 (full buffers);
- peak RSS of the process.
"""

from __future__ import annotations

import os
import sys

# `python bench/<script>.py` puts bench/ first on the import path, so the installed `reverie` (maybe another
# checkout's, through an editable install) would be imported. The repository root goes there instead, so this
# tree's `reverie` and `bench` are the ones imported.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import resource
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

import reverie

from reverie.agents.dreamer import DreamerV3
from reverie.models.dynamics import CategoricalRSSM
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.envs import make_vector_env
from reverie.envs.stepper import VectorStepper
from reverie.replay import Replay
from reverie.types import ActionSpec

SIZE_DIR = Path(reverie.__file__).parent / "configs" / "size"
SIZES = {path.stem: OmegaConf.to_container(OmegaConf.load(path)) for path in sorted(SIZE_DIR.glob("*.yaml"))}


def sized(size: str, kernels: str = "auto", **kwargs) -> dict:
    """DreamerV3 keyword arguments of a size preset (``reverie/configs/size/<size>.yaml``), as the CPU presets
    (exp=classic, exp=debug) build them: the dynamics' sizes in its factory, the MLPs' (vector encoder/decoder
    included: the size's units x layers) and conv stacks' in the agent."""
    s = SIZES[size]
    dynamics = partial(CategoricalRSSM, deter=s["deter"], stoch=s["stoch"], classes=s["classes"], units=s["units"],
                       kernels=kernels)
    return dict(dynamics=dynamics, units=s["units"], layers=s["layers"], mlp_units=s["units"], mlp_layers=s["layers"],
                cnn_depth=s["cnn_depth"], kernels=kernels, **kwargs)


def cartpole_batch(T: int, B: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    is_first = rng.random((T, B)) < 0.02
    is_first[0] = True
    return {"vector": rng.normal(size=(T, B, 4)).astype(np.float32),
            "prev_action": np.eye(2, dtype=np.float32)[rng.integers(2, size=(T, B))] * ~is_first[..., None],
            "reward": np.ones((T, B), np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": rng.random((T, B)) < 0.02}


def bench_update(size: str, updates: int, precision: str, T: int = 64, B: int = 16) -> float:
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **sized(size, precision=precision))
    batch = cartpole_batch(T, B)
    agent.update(batch)  # warm-up (allocator, autocast caches)
    times = []
    for _ in range(updates):
        start = time.perf_counter()
        agent.update(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_steps(num_envs: int, steps: int, agent: DreamerV3 | None) -> float:
    cfg = OmegaConf.create({"id": "CartPole-v1", "num_envs": num_envs})
    stepper = VectorStepper(make_vector_env(cfg, seed=0))
    rng = np.random.default_rng(0)
    row, state = stepper.reset(), None
    start = time.perf_counter()
    for _ in range(steps // num_envs):
        if agent is None:
            action = np.eye(2, dtype=np.float32)[rng.integers(2, size=num_envs)]
        else:
            action, state = agent.act(row, state, "explore")
        row, _ = stepper.step(action)
    elapsed = time.perf_counter() - start
    stepper.close()
    return (steps // num_envs) * num_envs / elapsed


def bench_replay(capacity: int, samples: int = 200, T: int = 64, B: int = 16) -> float:
    n = 4
    spec = {"vector": ((4,), np.dtype(np.float32)), "action": ((2,), np.dtype(np.float32)),
            "reward": ((), np.dtype(np.float32)), "is_first": ((), np.dtype(bool)),
            "is_last": ((), np.dtype(bool)), "is_terminal": ((), np.dtype(bool))}
    replay = Replay(capacity, n, spec, seed=0)
    rows = capacity // n
    # fill every row directly through add(); one row holds N = 4 env steps
    row = {"vector": np.zeros((n, 4), np.float32), "action": np.zeros((n, 2), np.float32),
           "reward": np.zeros(n, np.float32), "is_first": np.zeros(n, bool), "is_last": np.zeros(n, bool),
           "is_terminal": np.zeros(n, bool)}
    for _ in range(rows):
        replay.add(row)
    replay.sample(B, T)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        replay.sample(B, T)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["xs", "s"], choices=sorted(SIZES))
    parser.add_argument("--updates", type=int, default=10, help="timed updates per size")
    parser.add_argument("--precision", nargs="+", default=["auto", "float32"])
    parser.add_argument("--only", choices=["update", "act", "env", "replay"], default=None)
    args = parser.parse_args()
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.only in (None, "update"):
        for size in args.sizes:
            for precision in args.precision:
                sec = bench_update(size, args.updates, precision)
                print(f"update  size={size:<3} precision={precision:<8} {sec * 1e3:8.1f} ms/update  "
                      f"{1.0 / sec:6.2f} updates/s  (B16 x T64, H15, world model + actor + critic)")
    if args.only in (None, "act"):
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **sized("xs"))
        for n in (1, 4):
            print(f"act     size=xs N={n}  {bench_steps(n, 2000, agent):9.0f} env steps/s (policy acting, CartPole-v1)")
    if args.only in (None, "env"):
        for n in (1, 4):
            rate = bench_steps(n, 20000, None)
            print(f"env     N={n}          {rate:9.0f} env steps/s (random actions, CartPole-v1)")
    if args.only in (None, "replay"):
        small, large = bench_replay(10_000), bench_replay(1_000_000)
        print(f"replay  capacity 1e4 {small * 1e6:8.1f} us/sample   capacity 1e6 {large * 1e6:8.1f} us/sample   "
              f"ratio {large / small:.2f} (B16 x T64, full buffers)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
