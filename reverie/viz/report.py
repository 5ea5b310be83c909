"""The open-loop report logged during training and at its end (issue 5; DreamerV3's ``report``).

Logs videos per image key, plots per vector key and the reward plot (the file table is in docs/viz.md), plus the
scalars of :func:`reverie.viz.openloop.prediction_errors`, the quality metrics and ``viz/report_s``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from reverie.viz.grid import abs_error, video_grid
from reverie.viz.openloop import OpenLoop, open_loop, prediction_errors
from reverie.viz.quality import prediction_quality, quality_plot
from reverie.viz.reward_plot import reward_plot
from reverie.viz.vector_plot import vector_plot

#: Defaults: 4 sequences (grid columns), 5 context steps (the DreamerV3 report's), video frame rate.
SEQUENCES, CONTEXT, FPS = 4, 5, 10


def sample_for_report(replay: Any, sequences: int, length: int, seed: int) -> dict[str, np.ndarray] | None:
    """``replay.sample(sequences, length)`` with its own RNG seeded by ``seed`` (training's draws are unchanged);
    None, with a warning, when replay is too short."""
    saved = replay.rng
    replay.rng = np.random.default_rng(seed)
    try:
        return replay.sample(sequences, length)
    except ValueError as err:
        warnings.warn(f"open-loop report skipped: {err}", stacklevel=3)
        return None
    finally:
        replay.rng = saved


def report(agent: Any, data: Any, logger: Any, step: int, *, length: int | None = None, sequences: int = SEQUENCES,
           context: int = CONTEXT, sample: bool = True, fps: int = FPS) -> OpenLoop | None:
    """Compute open-loop and closed-loop predictions and log them; return the :class:`OpenLoop`, or None when
    replay cannot give a window yet. ``data``: a :class:`reverie.Replay` (``sequences`` windows of ``length`` =
    ``T`` rows, RNG seeded by ``step``; ValueError without ``length``) or a batch ``(T, B, ...)``."""
    start = time.perf_counter()
    if hasattr(data, "sample"):
        if length is None:
            raise ValueError("report: pass length=T (e.g. the agent's batch_length) when data is a replay")
        data = sample_for_report(data, sequences, length, seed=step)
        if data is None:
            return None
    T = len(data["is_first"])
    result = open_loop(agent, data, context=max(1, min(context, T - 1)), sample=sample, seed=step)
    for key in result.image_keys:
        truth = result.truth[key]
        rows = [truth, result.openloop[key], abs_error(truth, result.openloop[key])]
        logger.video(f"openloop/{key}", video_grid(rows, result.context, sequences), step, fps=fps)
        rows = [truth, result.recon[key], result.onestep[key]]
        logger.video(f"closedloop/{key}", video_grid(rows, None, sequences), step, fps=fps)
    for key in result.vector_keys:
        logger.image(f"openloop/{key}", vector_plot(result, key), step)
    logger.image("openloop/reward", reward_plot(result, sequences), step)
    logger.scalars(prediction_errors(result))
    quality = result.quality = prediction_quality(result)  # PSNR / SSIM per open-loop step (reverie.viz.quality)
    logger.scalars(quality)
    for key in result.image_keys:
        logger.image(f"quality/{key}", quality_plot(quality, key), step)
    logger.scalar("viz/report_s", time.perf_counter() - start)
    return result
