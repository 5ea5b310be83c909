"""Env throughput: Atari (ale-py vs envpool, 1/4/8 envs) and DMC (pixels and proprio). Prints numbers.

    .venv/bin/python bench/envs.py                 # everything
    .venv/bin/python bench/envs.py --steps 2000 --only atari

Agent steps/s with random actions through reverie's env layer (make_vector_env + VectorStepper), so the
numbers include the dict-observation contract and the NEXT_STEP autoreset; frames/s = steps/s x action repeat.
DMC render fps is measured on one env (one 64x64 render per agent step).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from omegaconf import OmegaConf

from reverie.envs import make_vector_env
from reverie.envs.stepper import VectorStepper


def steps_per_second(cfg: dict, num_envs: int, steps: int, mode: str = "sync") -> float:
    stepper = VectorStepper(make_vector_env(OmegaConf.create(cfg), seed=0, num_envs=num_envs, mode=mode))
    spec = stepper.action_spec
    rng = np.random.default_rng(0)
    stepper.reset()
    calls = max(1, steps // num_envs)

    def act() -> np.ndarray:
        if spec.discrete:
            return np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=num_envs)]
        return rng.uniform(-1, 1, (num_envs, spec.dim)).astype(np.float32)

    for _ in range(10):  # warm-up
        stepper.step(act())
    start = time.perf_counter()
    for _ in range(calls):
        stepper.step(act())
    elapsed = time.perf_counter() - start
    stepper.close()
    return calls * num_envs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4000, help="agent steps per measurement")
    parser.add_argument("--only", choices=["atari", "dmc"], default=None)
    args = parser.parse_args()
    atari = OmegaConf.to_container(OmegaConf.load("reverie/configs/env/atari100k.yaml"))
    if args.only in (None, "atari"):
        for backend in ("ale", "envpool"):
            for n in (1, 4, 8):
                modes = ["sync"] if backend == "envpool" or n == 1 else ["sync", "async"]
                for mode in modes:
                    try:
                        sps = steps_per_second(atari | {"backend": backend}, n, args.steps, mode)
                    except ImportError as err:
                        print(f"atari   backend={backend:<7} N={n}: skipped ({err})")
                        break
                    print(f"atari   backend={backend:<7} N={n} {mode:<5} {sps:8.0f} agent steps/s "
                          f"{sps * 4:8.0f} frames/s  (pong, 64x64 RGB)")
    if args.only in (None, "dmc"):
        for name in ("dmc_vision", "dmc_proprio"):
            cfg = OmegaConf.to_container(OmegaConf.load(f"reverie/configs/env/{name}.yaml"))
            sps = steps_per_second(cfg, 1, max(200, args.steps // 10))
            what = "render fps (one 64x64 render per agent step)" if name == "dmc_vision" else "agent steps/s"
            print(f"dmc     {name:<11} N=1 {sps:8.0f} {what}; physics steps/s {sps * 2:.0f} (cartpole_swingup)")


if __name__ == "__main__":
    main()
