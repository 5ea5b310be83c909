"""matplotlib (Agg, no display needed) figures as uint8 RGB arrays for :meth:`reverie.logs.logger.Logger.image`."""

from __future__ import annotations

from typing import Any

import numpy as np


def new_figure(rows: int, cols: int, width: float = 3.2, height: float = 2.2, **kwargs: Any):
    """A ``rows x cols`` grid of axes drawn by Agg (never opens a window). Returns ``(fig, axes (rows, cols))``."""
    from matplotlib.figure import Figure  # a bare Figure drawn by FigureCanvasAgg: pyplot and its backend stay out

    fig = Figure(figsize=(width * cols, height * rows), dpi=80)
    axes = np.asarray(fig.subplots(rows, cols, squeeze=False, **kwargs))
    # Fixed margins: matplotlib's constrained layout measures every label and doubles the drawing time.
    fig.subplots_adjust(left=0.4 / (width * cols), right=1 - 0.1 / (width * cols), bottom=0.45 / (height * rows),
                        top=1 - 0.3 / (height * rows), wspace=0.3, hspace=0.45)
    return fig, axes


def figure_to_array(fig: Any) -> np.ndarray:
    """Render a matplotlib figure to uint8 ``(H, W, 3)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def shade_context(ax: Any, context: int) -> None:
    """Grey background over the context steps ``t < C`` and a dashed line where open loop starts."""
    ax.axvspan(-0.5, context - 0.5, color="0.9", zorder=0)
    ax.axvline(context - 0.5, color="0.4", ls="--", lw=0.8)
