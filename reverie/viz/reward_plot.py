"""Predicted vs true reward and continue probability along the open-loop sequences (a figure)."""

from __future__ import annotations

import numpy as np

from reverie.viz.figure import figure_to_array, new_figure, shade_context
from reverie.viz.openloop import OpenLoop


def reward_plot(result: OpenLoop, max_sequences: int = 4) -> np.ndarray:
    """One column per sequence; top row reward, bottom row continue probability (if the model has one).

    Lines: true (black), posterior reconstruction (blue, closed loop), open-loop prediction (red, the
    posterior for ``t < C``, grey background). x axis: step ``t`` of the sequence.

    Args:
        result: :func:`reverie.viz.open_loop` output.
        max_sequences: columns (the first sequences of the batch).

    Returns:
        uint8 ``(H, W, 3)`` image of the figure.
    """
    B = result.reward["true"].shape[1]
    cols = max(1, min(B, max_sequences))
    rows = 2 if result.cont else 1
    fig, axes = new_figure(rows, cols, sharex=True)
    steps = np.arange(result.reward["true"].shape[0])
    panels = [("reward", result.reward)] + ([("continue", result.cont)] if result.cont else [])
    for r, (name, values) in enumerate(panels):
        for b in range(cols):
            ax = axes[r, b]
            shade_context(ax, result.context)
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
