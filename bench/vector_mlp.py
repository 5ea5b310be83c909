"""Update time of DreamerV3 with the vector encoder/decoder of a CPU preset against the reference's 5 x 1024.

    OMP_NUM_THREADS=1 .venv/bin/python bench/vector_mlp.py                        # exp=dmc_cpu, cartpole_swingup
    OMP_NUM_THREADS=1 .venv/bin/python bench/vector_mlp.py --overrides exp=classic --obs 4 --discrete 2

The 2023 reference builds its vector (MLP) encoder and decoder 5 x 1024 at every model size (configs.yaml
``encoder``/``decoder`` ``mlp_layers: 5, mlp_units: 1024``); reverie's CPU presets size them with the size preset
instead. This script builds the agent from the config (``reverie train``'s path, ``--overrides``) twice, once as the
preset has it and once with ``agent.module.mlp_units=1024 agent.module.mlp_layers=5``, and times full updates on a
random batch of the preset's ``batch_size x batch_length`` with the env's observation width (``--obs``; DMC proprio
cartpole_swingup: 5) and action space (``--continuous A`` or ``--discrete A``), alternating the two variants
(A B A B ...) after one untimed warm-up each. Prints the median process CPU and wall ms per update and the ratio.
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

import numpy as np
import torch

from reverie.agents.build import build_agent
from reverie.configs.compose import load_config
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.types import ActionSpec

REFERENCE = ["agent.module.mlp_units=1024", "agent.module.mlp_layers=5"]


def random_batch(T: int, B: int, obs: int, spec: ActionSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """A replay-shaped batch ``(T, B, ...)`` of random vector observations and actions (episode starts at 2%)."""
    rng = np.random.default_rng(seed)
    is_first = rng.random((T, B)) < 0.02
    is_first[0] = True
    if spec.discrete:
        action = np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=(T, B))]
    else:
        action = rng.uniform(-1, 1, size=(T, B, spec.dim)).astype(np.float32)
    return {"vector": rng.normal(size=(T, B, obs)).astype(np.float32), "prev_action": action * ~is_first[..., None],
            "reward": rng.random((T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overrides", nargs="*", default=["exp=dmc_cpu"], help="Hydra overrides of the preset")
    parser.add_argument("--obs", type=int, default=5, help="vector observation width F")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--continuous", type=int, default=None, metavar="A", help="Box action dims (default 1)")
    kind.add_argument("--discrete", type=int, default=None, metavar="A", help="Discrete actions")
    parser.add_argument("--rounds", type=int, default=5, help="timed updates per variant (alternating)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    spec = ActionSpec(True, args.discrete) if args.discrete else ActionSpec(False, args.continuous or 1)
    variants = {"preset": list(args.overrides), "reference 5x1024": list(args.overrides) + REFERENCE}
    agents, batch = {}, None
    for name, overrides in variants.items():
        cfg = load_config(overrides + ["agent.module.precision=float32"])
        torch.manual_seed(0)
        agents[name] = build_agent(cfg.agent, {"vector": (args.obs,)}, spec)
        m = cfg.agent.module
        print(f"{name}: vector encoder/decoder {m.mlp_layers} x {m.mlp_units}, heads {m.layers} x {m.units}, "
              f"batch {cfg.agent.batch_size} x {cfg.agent.batch_length}")
        batch = random_batch(cfg.agent.batch_length, cfg.agent.batch_size, args.obs, spec)
        agents[name].update(batch)  # warm-up
    cpu = {name: [] for name in agents}
    wall = {name: [] for name in agents}
    for _ in range(args.rounds):
        for name, agent in agents.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            agent.update(batch)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - cpu_start)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} alternating rounds, "
          f"load {os.getloadavg()[0]:.1f}")
    for name in agents:
        print(f"{name:<18} CPU median {statistics.median(cpu[name]) * 1e3:7.0f} ms   wall median "
              f"{statistics.median(wall[name]) * 1e3:7.0f} ms")
    a, b = (statistics.median(cpu[n]) for n in agents)
    print(f"reference / preset CPU time per update: {b / a:.2f}x")


if __name__ == "__main__":
    main()
