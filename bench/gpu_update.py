"""DreamerV3 update time on 64x64 images at chosen size presets: the GPU check of issue 8, prepared to run as one
short script when a GPU is lent (it also runs on CPU, for a smoke test).

    .venv/bin/python bench/gpu_update.py --device cuda --sizes s xl               # the check: bf16, batch 16 x 64
    .venv/bin/python bench/gpu_update.py --device cuda --sizes s xl --compile     # + torch.compile of the hot callables
    .venv/bin/python bench/gpu_update.py --device cpu --sizes debug --updates 2   # smoke test here

Per size: builds DreamerV3 on ``image (3, 64, 64)`` uint8 observations with 18 discrete actions (Atari-shaped),
``--precision`` (default bfloat16), batch ``--batch`` x ``--length`` (16 x 64, the reference's), horizon 15;
runs ``--warmup`` updates, then times ``--updates`` updates (``torch.cuda.synchronize()`` around each on CUDA, so
the time is the device's, not the launch queue's) and prints the median and min ms/update, updates/s, peak device
memory, and the ratio to the JAX reference's published learner figure of 22 ms per update at 16 x 64 (DreamerV3
paper/repository, one A100; a different GPU than whatever runs this, so the ratio is indicative). A size that
does not fit in memory prints the error and the next size runs. Budget: xl builds a 4096-deter model; at the
defaults the whole script takes a few minutes on an H200.
"""

from __future__ import annotations

import os
import sys

# `python bench/<script>.py` puts bench/ first on the import path; this tree's root goes there instead.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import statistics
import time

import numpy as np
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.types import ActionSpec

from bench.run import SIZES, sized

JAX_REFERENCE_MS = 22.0  # DreamerV3 reference, learner ms per update at batch 16 x 64
ACTIONS = 18


def image_batch(T: int, B: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Replay-shaped batch: ``image (T, B, 3, 64, 64)`` uint8, one-hot ``prev_action (T, B, 18)``, flags."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    return {"image": rng.integers(0, 256, size=(T, B, 3, 64, 64), dtype=np.uint8),
            "prev_action": np.eye(ACTIONS, dtype=np.float32)[rng.integers(ACTIONS, size=(T, B))] * ~is_first[..., None],
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_terminal": rng.random((T, B)) < 0.01}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_size(size: str, args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    agent = DreamerV3({"image": (3, 64, 64)}, ActionSpec(True, ACTIONS), **sized(size, device=str(device),
                      precision=args.precision, compile=args.compile,
                      **({} if args.imag_last is None else {"imag_last": args.imag_last})))
    params = sum(p.numel() for p in agent.parameters()) / 1e6
    batch = image_batch(args.length, args.batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(args.warmup):
        agent.update(batch)
    sync(device)
    warm = time.perf_counter() - start
    times = []
    for _ in range(args.updates):
        sync(device)
        t0 = time.perf_counter()
        agent.update(batch)
        sync(device)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times) * 1e3
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    print(f"size={size:<5} params {params:7.1f} M  {args.precision} compile={args.compile}  "
          f"median {median:8.1f} ms/update (min {min(times) * 1e3:.1f}, n={len(times)}), "
          f"{1e3 / median:6.2f} updates/s, peak device memory {peak:.1f} GiB, warm-up {warm:.1f} s; "
          f"JAX reference 22 ms: x{median / JAX_REFERENCE_MS:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="+", default=["s", "xl"], choices=sorted(SIZES))
    parser.add_argument("--precision", default="bfloat16", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--compile", action="store_true", help="DreamerV3(compile=True)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--imag-last", type=int, default=None,
                        help="imagine from the last N rows of each sequence (default: all rows)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--updates", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        keep_freed_memory()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}", flush=True)
    else:
        print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads", flush=True)
    for size in args.sizes:
        try:
            time_size(size, args, device)
        except (RuntimeError, torch.OutOfMemoryError) as err:  # e.g. out of memory at xl: report, go on
            print(f"size={size}: failed: {str(err).splitlines()[0]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
