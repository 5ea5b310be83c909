"""Predicted vs true reward and continue probability, and the latent agreement, along the open-loop sequences (a
figure): what a world model without decoders shows instead of frames (docs/representation.md), and every model
shows beside them."""

from __future__ import annotations

import numpy as np

from reverie.viz.figure import figure_to_array, new_figure, shade_context
from reverie.viz.openloop import OpenLoop


def reward_plot(result: OpenLoop, max_sequences: int = 4) -> np.ndarray:
    """uint8 ``(H, W, 3)``: one column per sequence (at most ``max_sequences``); rows reward, continue probability
    (if the model has one) and latent agreement, against step ``t``. Lines: true (black), posterior (blue), open
    loop (red; context steps shaded); latent row: cosine of open-loop (red) / one-step prior (green) features."""
    B = result.reward["true"].shape[1]
    cols = max(1, min(B, max_sequences))
    panels = [("reward", result.reward)] + ([("continue", result.cont)] if result.cont else []) + \
        ([("latent agreement", result.latent)] if result.latent else [])
    rows = len(panels)
    fig, axes = new_figure(rows, cols, sharex=True)
    steps = np.arange(result.reward["true"].shape[0])
    for r, (name, values) in enumerate(panels):
        for b in range(cols):
            ax = axes[r, b]
            shade_context(ax, result.context)
            if name == "latent agreement":  # cos(features, posterior features) per step
                ax.plot(steps, values["onestep"][:, b], color="tab:green", lw=1, ls=":", label="one-step prior")
                ax.plot(steps, values["openloop"][:, b], color="tab:red", lw=1, label="open loop")
                ax.set_ylim(min(-0.05, float(np.min(values["openloop"][:, b])) - 0.05), 1.05)
                ax.legend(fontsize=6, loc="lower left")
            else:
                ax.plot(steps, values["true"][:, b], color="k", lw=1.5, label="true")
                ax.plot(steps, values["recon"][:, b], color="tab:blue", lw=1, label="posterior")
                ax.plot(steps, values["openloop"][:, b], color="tab:red", lw=1, ls="-", label="open loop")
            firsts = np.flatnonzero(result.is_first[:, b]) if result.is_first is not None else []
            for t in firsts:
                ax.axvline(t, color="tab:green", lw=0.8, ls=":")
            if name == "continue":
                ax.set_ylim(-0.05, 1.05)
            ax.set_title(f"{name}, sequence {b}", fontsize=8)
            ax.tick_params(labelsize=7)
            if r == rows - 1:
                ax.set_xlabel("step t", fontsize=8)
    axes[0, 0].legend(fontsize=6, loc="best")
    return figure_to_array(fig)
