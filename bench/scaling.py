"""How the DreamerV3 update's time grows with the work: batch size, sequence length, model size and threads.

    .venv/bin/python bench/scaling.py --out docs/results/scaling        # writes scaling.json and scaling.png

Each sweep moves one knob from the base point (size xs, batch 16 x 64, 1 thread, the ``--precision``) and times
``--updates`` updates after one warm-up (the update of bench/update_time.py: CartPole-sized vector batch, horizon 15,
discrete actions, imagination from every row). Prints one line per point (median wall ms per update, and ms per
1000 trained rows B*T so that the batch and length sweeps read as cost per unit of work) and plots the four sweeps
side by side. Run with nothing else on the machine: other processes move a point by 20-40%.
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
import json
import platform
from pathlib import Path

import torch

from bench.run import bench_update
from reverie.runtime.cpu_memory import keep_freed_memory

BASE = {"size": "xs", "batch": 16, "length": 64, "threads": 1}
SWEEPS = {"batch": [4, 8, 16, 32], "length": [16, 32, 64, 128], "size": ["xxs", "xs", "s", "m"], "threads": [1, 2]}


def time_point(point: dict, precision: str, updates: int) -> float:
    """Median wall seconds of one update at ``point`` (size, batch, length, threads)."""
    torch.set_num_threads(point["threads"])
    return bench_update(point["size"], updates, precision, T=point["length"], B=point["batch"])


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, knob in zip(axes, SWEEPS):
        points = [r for r in rows if r["sweep"] == knob]
        xs = [str(r[knob]) for r in points]
        ax.plot(xs, [r["ms"] for r in points], "o-", label="ms per update")
        ax.set_xlabel(knob + (" (B)" if knob == "batch" else " (T)" if knob == "length" else ""))
        ax.set_ylabel("ms per update")
        ax.set_ylim(bottom=0)
        if knob in ("batch", "length"):
            twin = ax.twinx()
            twin.plot(xs, [r["ms_per_1k_rows"] for r in points], "s--", color="tab:orange")
            twin.set_ylabel("ms per 1000 rows (B*T)", color="tab:orange")
            twin.set_ylim(bottom=0)
        others = ", ".join(f"{k} {v}" for k, v in BASE.items() if k != knob)
        ax.set_title(f"{knob} ({others})", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--updates", type=int, default=3, help="timed updates per point (after one warm-up)")
    parser.add_argument("--out", default=None, help="path stem for <out>.json and <out>.png (default: print only)")
    args = parser.parse_args()
    keep_freed_memory()  # as reverie train does on CPU
    rows = []
    for knob, values in SWEEPS.items():
        for value in values:
            point = BASE | {knob: value}
            seconds = time_point(point, args.precision, args.updates)
            row = point | {"sweep": knob, "ms": seconds * 1e3,
                           "ms_per_1k_rows": seconds * 1e6 / (point["batch"] * point["length"])}
            rows.append(row)
            print(f"{knob:<8} {str(value):<5} size {point['size']:<4} B{point['batch']:<3} T{point['length']:<4} "
                  f"threads {point['threads']}: {row['ms']:8.0f} ms/update, {row['ms_per_1k_rows']:6.0f} ms per 1000 "
                  f"rows", flush=True)
    title = (f"DreamerV3 update time, precision={args.precision}, torch {torch.__version__}, {cpu_name()}, "
             f"{os.cpu_count()} cores; median of {args.updates} updates")
    print(title)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps({"title": title, "rows": rows}, indent=1) + "\n")
        plot(rows, out.with_suffix(".png"), title)
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
