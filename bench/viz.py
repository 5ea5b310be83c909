"""Time of one open-loop report (reverie.viz.report) per model size and observation type. Prints numbers.

    .venv/bin/python bench/viz.py                      # xs and s, vector (4,) and image (3, 64, 64), 3 repeats
    .venv/bin/python bench/viz.py --sizes xs --repeats 5

One report = open-loop + closed-loop pass over B=4 sequences of T=64 steps (C=5 context), the open-loop and
closed-loop mp4s and TensorBoard GIFs per image key, the reward/continue figure, a vector figure per vector
key, and the scalars. Frames: a square moving over a gradient (a simple game; random noise would be the
worst case for the video encoders). Untrained models: the cost does not depend on the weights. The first
report of a process also imports matplotlib; it is printed apart from the median of the following ones.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.agents.dreamer import DreamerV3
from reverie.logs.logger import Logger
from reverie.types import ActionSpec
from reverie.viz import report

from bench.run import sized


def moving_square(T: int, B: int, shape: tuple[int, int, int]) -> np.ndarray:
    """uint8 (T, B, C, H, W) frames like a simple game: a gradient background and a square moving right
    (random noise would be the worst case for the video encoders, not what observations look like)."""
    C, H, W = shape
    frames = np.broadcast_to(np.linspace(40, 120, W, dtype=np.float32), (T, B, C, H, W)).astype(np.uint8).copy()
    for t in range(T):
        for b in range(B):
            x, y = (3 * t + 7 * b) % (W - 8), (11 * b) % (H - 8)
            frames[t, b, :, y: y + 8, x: x + 8] = 230
    return frames


def batch(obs_shapes: dict, T: int, B: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: (moving_square(T, B, s) if len(s) == 3 else rng.normal(size=(T, B, *s)).astype(np.float32))
           for k, s in obs_shapes.items()}
    out["prev_action"] = np.eye(2, dtype=np.float32)[rng.integers(0, 2, (T, B))]
    out["is_first"] = np.zeros((T, B), bool)
    out["is_first"][0] = True
    out["reward"] = rng.normal(size=(T, B)).astype(np.float32)
    out["is_terminal"] = np.zeros((T, B), bool)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["xs", "s"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)
    print(f"open-loop report, B=4 x T={args.length}, C=5, {args.threads} thread(s); seconds per report")
    for size in args.sizes:
        for name, shapes in (("vector", {"vector": (4,)}), ("image", {"image": (3, 64, 64)})):
            agent = DreamerV3(shapes, ActionSpec(True, 2), **sized(size, precision="float32"))
            data = batch(shapes, args.length, 4)
            times = []
            with tempfile.TemporaryDirectory() as tmp, Logger(tmp, backends=["tensorboard"]) as logger:
                for i in range(args.repeats + 1):
                    start = time.perf_counter()
                    report(agent, data, logger, step=i)
                    times.append(time.perf_counter() - start)
            median = statistics.median(times[1:])
            print(f"  size {size:3s} {name:6s}: first {times[0]:6.2f} s, then median {median:6.2f} s")


if __name__ == "__main__":
    main()
