"""Open-loop predictions of vector observations: each feature's true and predicted values over time."""

from __future__ import annotations

import numpy as np

from reverie.viz.figure import figure_to_array, new_figure, shade_context
from reverie.viz.openloop import OpenLoop

#: At most this many features of a vector key are plotted (one panel each).
MAX_FEATURES = 8


def vector_plot(result: OpenLoop, key: str, sequence: int = 0, max_features: int = MAX_FEATURES) -> np.ndarray:
    """uint8 ``(H, W, 3)``: one panel per feature (the first ``max_features``) of vector key ``key`` ``(T, B, F)`` for
    one sequence: true (black), posterior (blue), one-step prior (green, dotted), open loop (red).
    Raises KeyError when ``key`` is not a vector key of ``result``."""
    if key not in result.vector_keys:
        raise KeyError(f"vector_plot: {key!r} is not a vector key; vector keys: {result.vector_keys}")
    truth = result.truth[key][:, sequence]  # (T, F)
    F = min(truth.shape[-1], max_features)
    cols = min(F, 4)
    rows = -(-F // cols)
    fig, axes = new_figure(rows, cols, sharex=True)
    steps = np.arange(len(truth))
    for f in range(rows * cols):
        ax = axes[f // cols, f % cols]
        if f >= F:
            ax.set_visible(False)
            continue
        shade_context(ax, result.context)
        ax.plot(steps, truth[:, f], color="k", lw=1.5, label="true")
        ax.plot(steps, result.recon[key][:, sequence, f], color="tab:blue", lw=1,
                label="posterior (decoded; saw obs_t)")
        ax.plot(steps, result.onestep[key][:, sequence, f], color="tab:green", lw=1, ls=":",
                label="one-step prior (saw up to obs_t-1)")
        ax.plot(steps, result.openloop[key][:, sequence, f], color="tab:red", lw=1,
                label=f"open loop (saw obs_0..{result.context - 1})")
        ax.set_title(f"{key}[{f}], sequence {sequence}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=6, loc="best")
    return figure_to_array(fig)
