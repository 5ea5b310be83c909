"""Image strips of the PlaNet-on-Atari study (docs/planet.md, "PlaNet on Atari"): for each trained world model, the
true frames of one held-out window above its open-loop prediction, the context frames marked.

    python examples/planet_atari/strips.py sweeps/planet_atari_divergence/trials/<default>_seed0 \\
        sweeps/planet_atari_divergence/trials/<best>_seed0 --out docs/results/planet_atari_strips_boxing.png

Each run's final checkpoint is loaded (``reverie.load_run``, ``checkpoint="last"``) and predicts the same
held-out windows as its ``heldout/quality`` metrics (``pretrain.heldout_sequences`` windows of the run's batch
length, drawn with seed 0, ``reverie.data.heldout.run_heldout_windows``; run it from the folder the sweep ran in,
whose relative data paths the runs' configs hold): 5 posterior context frames, then the open loop driven by the
logged actions. The window shown is ``--window`` (default: the one whose true frames change most after the
context, so that something moves). Prints each row's PSNR per step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def predictions(run: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``truth, openloop (T, B, H, W, 3) uint8`` of ``run``'s model on the held-out windows it was scored on, and
    the context length."""
    from omegaconf import OmegaConf

    from reverie import load_run
    from reverie.data.heldout import run_heldout_windows
    from reverie.viz.openloop import open_loop

    loaded = load_run(run, checkpoint="last")
    batch, context = run_heldout_windows(OmegaConf.create(loaded.config))  # the windows of its heldout metrics
    result = open_loop(loaded.agent, batch, context=context, seed=0)
    key = result.image_keys[0]
    to_hwc = (0, 1, 3, 4, 2)  # (T, B, C, H, W) -> (T, B, H, W, C)
    return result.truth[key].transpose(to_hwc), result.openloop[key].transpose(to_hwc), result.context


def busiest_window(truth: np.ndarray, context: int) -> int:
    """The window (index into B of ``truth (T, B, H, W, C)``) whose frames after the context change the most."""
    moving = np.abs(np.diff(truth[context:].astype(np.float64), axis=0)).mean(axis=(0, 2, 3, 4))  # (B,)
    return int(np.argmax(moving))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--labels", nargs="*", default=None, help="one row label per run (default: the folder)")
    parser.add_argument("--window", type=int, default=None)
    parser.add_argument("--frames", type=int, default=20, help="frames shown (context included)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reverie.viz.quality import psnr

    labels = args.labels or [run.parent.parent.name + "/" + run.name for run in args.runs]
    rows, names, context = [], [], 0
    for run, label in zip(args.runs, labels):
        truth, pred, context = predictions(run)
        window = busiest_window(truth, context) if args.window is None else args.window
        if not rows:
            rows.append(truth[:args.frames, window])
            names.append(f"true (window {window})")
        frames = pred[:args.frames, window]
        rows.append(frames)
        names.append(label)
        steps = psnr(truth[context:args.frames, window], frames[context:])
        print(f"{label}: PSNR (dB) at open-loop steps 1..{len(steps)}: {' '.join(f'{v:.1f}' for v in steps)}")
    n = len(rows[0])
    fig, axes = plt.subplots(len(rows), n, figsize=(0.9 * n, 1.05 * len(rows)), squeeze=False)
    for r, (frames, name) in enumerate(zip(rows, names)):
        for t in range(n):
            ax = axes[r, t]
            ax.imshow(frames[t])
            ax.set_xticks([]), ax.set_yticks([])
            for side in ax.spines.values():  # context frames: red frame; open loop: none
                side.set(color="red" if t < context else "white", linewidth=2)
            if r == 0:
                ax.set_title(f"t={t}" if t < context else f"k={t - context + 1}", fontsize=7)
        axes[r, 0].set_ylabel(name, fontsize=6, rotation=0, ha="right", va="center")
    fig.suptitle(f"held-out frames (top) and open-loop predictions; red: the {context} context frames", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
