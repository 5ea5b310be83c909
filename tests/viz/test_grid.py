"""Geometry of the video grid: rows, columns, frame count, tile placement and the context marker."""

import numpy as np
import pytest

from reverie.viz.grid import CONTEXT_COLOR, MARKER, OPENLOOP_COLOR, abs_error, to_hwc, upscale, video_grid


def rows_of(T, B, C, H, W, R, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (T, B, C, H, W), dtype=np.uint8) for _ in range(R)]


@pytest.mark.parametrize("T, B, H, W, R, context", [(7, 2, 5, 6, 3, 3), (4, 1, 8, 8, 3, 1), (6, 3, 4, 2, 2, None)])
def test_grid_geometry_and_tile_placement(T, B, H, W, R, context):
    rows = rows_of(T, B, 3, H, W, R)
    grid = video_grid(rows, context)
    top = 0 if context is None else MARKER
    assert grid.shape == (T, top + R * H, B * W, 3) and grid.dtype == np.uint8  # frames, rows x H, columns x W
    for t in range(T):
        for r in range(R):
            for b in range(B):
                tile = grid[t, top + r * H: top + (r + 1) * H, b * W: (b + 1) * W]
                np.testing.assert_array_equal(tile, rows[r][t, b].transpose(1, 2, 0))  # (C, H, W) -> (H, W, C)
    if context is not None:
        assert (grid[:context, :MARKER] == CONTEXT_COLOR).all()
        assert (grid[context:, :MARKER] == OPENLOOP_COLOR).all()


def test_max_sequences_keeps_the_first_columns_and_grey_is_repeated():
    rows = rows_of(5, 4, 1, 3, 3, 2)
    grid = video_grid(rows, None, max_sequences=2)
    assert grid.shape == (5, 2 * 3, 2 * 3, 3)
    np.testing.assert_array_equal(grid[2, 3:6, 3:6, 1], rows[1][2, 1, 0])
    assert (grid[..., 0] == grid[..., 2]).all()


def test_abs_error_and_upscale():
    a = np.array([[0, 255, 10]], np.uint8)
    b = np.array([[255, 0, 12]], np.uint8)
    np.testing.assert_array_equal(abs_error(a, b), [[255, 255, 2]])
    frames = np.arange(2 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 2, 3)
    big = upscale(frames, 3)
    assert big.shape == (2, 6, 6, 3) and (big[1, 3:6, 0:3] == frames[1, 1, 0]).all()


def test_bad_rows_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one row"):
        video_grid([])
    with pytest.raises(ValueError, match="one shape"):
        video_grid(rows_of(3, 1, 3, 4, 4, 1) + rows_of(3, 1, 3, 4, 5, 1))
    with pytest.raises(ValueError, match="C = 1 or 3"):
        to_hwc(np.zeros((2, 4, 5, 5), np.uint8))
