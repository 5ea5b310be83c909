"""Each run's evaluation curve (``eval/return_mean`` of ``metrics.jsonl`` against env steps), one line per run,
for runs that stop at different steps (``reverie compare`` averages over the runs still going, which a stop rule
makes misleading). Optional ``--confirm``: marks each run's confirmation evaluations (``eval/confirm_return_mean``).

    .venv/bin/python bench/eval_curves.py RUN [RUN ...] --out docs/results/cartpole_until_solved.png --threshold 475

Prints each run's curve as numbers too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curve(run: Path, key: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threshold", type=float, default=None, help="a horizontal line (e.g. 475)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    for run in args.runs:
        points = curve(run, "eval/return_mean")
        confirm = curve(run, "eval/confirm_return_mean")
        line, = ax.plot([s for s, _ in points], [v for _, v in points], marker=".", lw=1.2, label=run.name)
        if confirm:
            ax.plot([s for s, _ in confirm], [v for _, v in confirm], marker="*", ms=10, ls="none",
                    color=line.get_color())
        print(run.name, " ".join(f"{s}:{v:.0f}" for s, v in points),
              "| confirmed " + " ".join(f"{s}:{v:.1f}" for s, v in confirm) if confirm else "")
    if args.threshold is not None:
        ax.axhline(args.threshold, color="#777777", lw=1, ls="--")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean eval return (10 episodes; * 100)")
    ax.set_title(args.title, fontsize=9)
    ax.grid(color="#eeeeee")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
