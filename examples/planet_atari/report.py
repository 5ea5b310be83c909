"""Held-out open-loop PSNR against the prediction step k, per configuration, for the PlaNet-on-Atari study's sweeps
(docs/planet.md, "PlaNet on Atari"): the curves the sweeps' own summaries (one number per trial) do not show.

    python examples/planet_atari/report.py sweeps/planet_atari_divergence sweeps/planet_atari_knobs \\
        --out docs/results/planet_atari_psnr_k.png

For every finished trial (``summary.json`` present) of every sweep folder given, reads the last ``metrics.jsonl`` row
holding ``heldout/quality/<key>_psnr_k<k>`` and averages it over the configuration's seeds; writes one panel per
sweep (a line per configuration, labelled by its swept values) and prints a table of the mean PSNR at each k.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

STEP = re.compile(r"^heldout/quality/(\w+)_psnr_k(\d+)$")


def trial_curves(sweep: Path, key: str = "image") -> dict[str, dict[int, list[float]]]:
    """``{label: {k: [psnr per seed]}}`` of a sweep folder's finished trials; the label is the swept values."""
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trial in sorted((sweep / "trials").glob("*")):
        if not (trial / "summary.json").is_file() or not (trial / "sweep_trial.json").is_file():
            continue
        params = json.loads((trial / "sweep_trial.json").read_text())["params"]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(params.items()))
        last: dict[int, float] = {}
        for line in (trial / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            found = {int(m.group(2)): v for name, v in row.items() if (m := STEP.match(name)) and m.group(1) == key}
            last = found or last
        for k, value in last.items():
            curves[label][k].append(float(value))
    return curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--key", default="image", help="the image observation key (default image)")
    parser.add_argument("--out", type=Path, default=Path("planet_atari_psnr_k.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.sweeps), figsize=(6 * len(args.sweeps), 4), squeeze=False)
    for ax, sweep in zip(axes[0], args.sweeps):
        curves = trial_curves(sweep, args.key)
        print(f"## {sweep.name}\n\n| configuration | seeds | PSNR (dB) at k = 1 / 5 / 10 / last |\n|---|---|---|")
        for label, per_k in sorted(curves.items()):
            ks = sorted(per_k)
            means = [sum(per_k[k]) / len(per_k[k]) for k in ks]
            ax.plot(ks, means, label=label)
            picks = [means[ks.index(k)] for k in (1, 5, 10) if k in ks] + [means[-1]]
            print(f"| {label} | {len(per_k[ks[0]])} | {' / '.join(f'{m:.2f}' for m in picks)} |")
        print()
        ax.set(title=sweep.name, xlabel="open-loop step k (after the context frames)", ylabel="held-out PSNR (dB)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
