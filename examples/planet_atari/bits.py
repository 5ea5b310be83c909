"""Bit depth in the PlaNet-on-Atari study (docs/planet.md, "PlaNet on Atari"): how much of a low-bit model's PSNR
loss is the quantisation itself.

    python examples/planet_atari/bits.py \\
        sweeps/planet_atari_knobs/trials/free_nats-3_overshooting-0_global_divergence_scale-0_image_b_68e747_seed0 ...

The study's PSNR compares each decoded frame with the true 8-bit frame. A model trained on ``image_bits: b`` frames
predicts (at best) the bin centres of the b-bit frame, so it cannot beat the PSNR of those bin centres against the
true frame (the *floor*: what a perfect b-bit prediction scores). For each run (its final checkpoint on the held-out
windows it was scored on, as strips.py loads them) this prints the open-loop PSNR (k >= 1, mean over steps and
windows) against the true frame, against the b-bit bin centres of the true frame, and the floor, in dB.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def bin_centres(frames: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-bit bin centres of uint8 ``frames`` as pixel values, float64: what the model is trained on
    without its dequantisation noise (``reverie.models.distributions.reduce_bits(..., noise=False)``)."""
    import torch

    from reverie.models.distributions import reduce_bits

    return reduce_bits(torch.from_numpy(np.ascontiguousarray(frames)), bits, noise=False).double().numpy()


def bit_depth_scores(truth: np.ndarray, pred: np.ndarray, bits: int, context: int) -> dict[str, float]:
    """Mean open-loop PSNR (dB) of ``pred`` against ``truth`` and against its ``bits``-bit bin centres, and the floor
    (the bin centres against the truth), over rows ``context..T-1`` of ``(T, B, H, W, C)`` uint8 frames."""
    from reverie.viz.quality import psnr

    to_chw = (0, 1, 4, 2, 3)  # psnr reads (..., C, H, W)
    true, guess = truth[context:].transpose(to_chw), pred[context:].transpose(to_chw)
    centres = bin_centres(true, bits)
    return {"psnr_vs_true": float(psnr(true, guess).mean()), "psnr_vs_bins": float(psnr(centres, guess).mean()),
            "floor": float(psnr(true, centres).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    from omegaconf import OmegaConf
    from strips import predictions  # this folder's strip script: the run's open loop on its held-out windows

    for run in args.runs:
        bits = int(OmegaConf.load(run / "config.yaml").agent.module.image_bits)
        truth, pred, context = predictions(run)
        scores = bit_depth_scores(truth, pred, bits, context)
        print(f"{run.name}: image_bits {bits}: open-loop PSNR {scores['psnr_vs_true']:.2f} dB against the true "
              f"frames, {scores['psnr_vs_bins']:.2f} against their {bits}-bit bin centres; floor (a perfect "
              f"{bits}-bit prediction) {scores['floor']:.2f}")


if __name__ == "__main__":
    main()
