"""Video grids: rows of image sequences (truth / prediction / error) side by side over sequences, under a
``MARKER``-pixel bar (green: context step, red: open-loop step)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Height in pixels of the bar on top of each grid frame that tells context steps from open-loop steps.
MARKER = 2
CONTEXT_COLOR = (0, 200, 0)  # green: the model saw this frame (posterior)
OPENLOOP_COLOR = (220, 0, 0)  # red: open-loop prediction (prior, no frame seen)


def to_hwc(images: np.ndarray) -> np.ndarray:
    """uint8 ``(..., C, H, W)`` with ``C`` 1 or 3 -> ``(..., H, W, 3)`` (grey repeated); ValueError otherwise."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim < 3 or images.shape[-3] not in (1, 3):
        raise ValueError(f"images must be uint8 (..., C, H, W) with C = 1 or 3, got {images.dtype} "
                         f"{images.shape}; split other channel counts into 1- or 3-channel keys")
    images = np.moveaxis(images, -3, -1)  # (..., C, H, W) -> (..., H, W, C)
    return np.repeat(images, 3, -1) if images.shape[-1] == 1 else images


def abs_error(truth: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Per-pixel ``|truth - pred|`` of two uint8 arrays of one shape, as uint8 (black = perfect)."""
    return np.abs(truth.astype(np.int16) - pred.astype(np.int16)).astype(np.uint8)


def video_grid(rows: Sequence[np.ndarray], context: int | None = None, max_sequences: int | None = None
               ) -> np.ndarray:
    """Tile ``R`` uint8 sequences ``(T, B, C, H, W)`` of one shape into uint8 ``(T, [MARKER +] R * H, B' * W, 3)``,
    ``B' = min(B, max_sequences)``; with ``context``, a green bar over frames ``t < C``, red after.
    Raises ValueError for no rows, rows of different shapes, or a bad image layout."""
    if not rows:
        raise ValueError("video_grid needs at least one row")
    shapes = {np.shape(r) for r in rows}
    if len(shapes) != 1 or len(next(iter(shapes))) != 5:
        raise ValueError(f"video_grid rows must all be (T, B, C, H, W) of one shape, got {sorted(shapes)}")
    T, B = rows[0].shape[:2]
    keep = B if max_sequences is None else max(1, min(B, max_sequences))
    tiles = np.stack([to_hwc(r[:, :keep]) for r in rows], 1)  # (T, R, B', H, W, 3)
    _, R, _, H, W, _ = tiles.shape
    frames = tiles.transpose(0, 1, 3, 2, 4, 5)  # (T, R, B', H, W, 3) -> (T, R, H, B', W, 3)
    frames = frames.reshape(T, R * H, keep * W, 3)  # (T, R, H, B', W, 3) -> (T, R*H, B'*W, 3)
    if context is None:
        return np.ascontiguousarray(frames)
    bar = np.empty((T, MARKER, keep * W, 3), np.uint8)
    bar[:context] = CONTEXT_COLOR
    bar[context:] = OPENLOOP_COLOR
    return np.concatenate([bar, frames], 1)


def upscale(frames: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscaling of ``(..., H, W, 3)`` by an integer ``factor`` (sharp pixels in players)."""
    if factor <= 1:
        return frames
    return frames.repeat(factor, -3).repeat(factor, -2)
