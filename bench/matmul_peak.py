"""This CPU's matrix-multiply rate at float32 and bf16: the ceiling an update's FLOPs are measured against
(docs/speed.md, "How close to the limit").

    .venv/bin/python bench/matmul_peak.py                     # sizes 256 1024 2048, threads 1 and 2
    .venv/bin/python bench/matmul_peak.py --sizes 4096 --threads 2

For each square size n, dtype and thread count: ``torch.mm`` of two ``(n, n)`` matrices repeated for about
``--seconds``, after a warm-up; prints the median of ``--rounds`` rounds in GFLOP/s (2 n^3 per product, wall time).
bf16 runs on the CPU's native path where it has one (AVX512-BF16, AMX); its output is bf16 as under autocast.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def rate(n: int, dtype: torch.dtype, seconds: float) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        count += 1
    return 2 * n ** 3 * count / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; GFLOP/s, median of {args.rounds} rounds of ~{args.seconds:g} s (wall)")
    print(f"{'n':>6} {'dtype':>9} {'threads':>8} {'GFLOP/s':>9}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n in args.sizes:
            for dtype in (torch.float32, torch.bfloat16):
                value = statistics.median(rate(n, dtype, args.seconds) for _ in range(args.rounds))
                print(f"{n:6d} {str(dtype).removeprefix('torch.'):>9} {threads:8d} {value:9.0f}", flush=True)


if __name__ == "__main__":
    main()
