"""Frames (uint8 ``(T, H, W, 3)``) to files: H.264 mp4 writers, animated GIFs, filmstrips (imageio-ffmpeg, Pillow).
Shared by :class:`reverie.logs.logger.Logger` and ``reverie.viz``."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

#: Frames put side by side in the TensorBoard filmstrip that stands in for a video.
FILMSTRIP_FRAMES = 8


def filmstrip(video: Any, count: int = FILMSTRIP_FRAMES) -> np.ndarray:
    """Up to ``count`` evenly spaced frames of ``video`` ``(T, H, W, 3)`` side by side: uint8 ``(H, k*W, 3)``."""
    return np.concatenate([video[i] for i in _evenly_spaced(len(video), count)], axis=1)


def _evenly_spaced(n: int, count: int) -> np.ndarray:
    """Up to ``count`` evenly spaced indices of ``n`` frames, the first and last included."""
    return np.unique(np.linspace(0, n - 1, num=min(count, n)).round().astype(int))


def mp4_writer(path: str | Path, fps: int = 30) -> Any:
    """An imageio writer (context manager, ``append_data``) of H.264 yuv420p mp4 frames: uint8 ``(H, W, 3)``, even
    ``H`` and ``W`` (:func:`pad_even`)."""
    import imageio.v2 as imageio

    # macro_block_size=1: imageio would otherwise resize to multiples of 16; callers make sizes even.
    return imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
                              macro_block_size=1, ffmpeg_log_level="error")


def pad_even(frame: np.ndarray) -> np.ndarray:
    """Pads one ``(H, W, 3)`` frame by its edge pixels so that ``H`` and ``W`` are even (H.264 needs it)."""
    return _pad_even(frame[None])[0]


#: Fixed 6 x 7 x 6 colour cube (252 colours) used for GIFs: Pillow's adaptive quantiser costs ~1 s per frame.
_CUBE = (6, 7, 6)


_LEVELS = np.asarray(_CUBE)
_PALETTE = np.rint(np.stack(np.meshgrid(*[np.arange(n) for n in _CUBE], indexing="ij"), -1).reshape(-1, 3)
                   * (255.0 / (_LEVELS - 1))).astype(np.uint8)  # (252, 3): the colour of each palette index


def palette_index(rgb: np.ndarray) -> np.ndarray:
    """One uint8 ``(H, W, 3)`` frame as indices into the fixed colour cube: uint8 ``(H, W)`` (1 byte a pixel)."""
    q = np.rint(rgb.astype(np.float32) * ((_LEVELS - 1) / 255.0)).astype(np.uint8)  # (H, W, 3) levels
    return ((q[..., 0] * _LEVELS[1] + q[..., 1]) * _LEVELS[2] + q[..., 2]).astype(np.uint8)


def gif_bytes(video: Any, fps: int = 10) -> bytes:
    """Looping animated GIF of uint8 ``(T, H, W, 3)`` frames (or a list of ``(H, W, 3)``) in the fixed 252-colour
    cube (cheap, and colours stay steady from frame to frame; the mp4 keeps full colour)."""
    # frame by frame: a float copy of the whole clip (4 bytes per value) would be a run's memory peak
    return gif_from_indices([palette_index(rgb) for rgb in video], fps)


def gif_from_indices(indices: list[np.ndarray], fps: int = 10) -> bytes:
    """The animated GIF of :func:`gif_bytes` from frames already mapped by :func:`palette_index`."""
    from PIL import Image

    palette = _PALETTE.ravel().tolist()
    frames = []
    for frame in indices:
        image = Image.fromarray(frame, mode="P")
        image.putpalette(palette)
        frames.append(image)
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=max(1, round(1000 / fps)),
                   loop=0, optimize=False, disposal=1)
    return buffer.getvalue()


def _as_video(frames: Any) -> np.ndarray:
    """uint8 (T, H, W, 3) from (T, H, W, 3), (T, 3, H, W) or (T, H, W); raises on anything else."""
    if hasattr(frames, "detach"):  # a torch tensor
        frames = frames.detach().cpu().numpy()
    video = np.asarray(frames)
    if video.dtype != np.uint8:
        raise TypeError(
            f"Video frames must be uint8 in [0, 255], got dtype {video.dtype}; convert floats in [0, 1] "
            f"with (frames * 255).clip(0, 255).astype(np.uint8)."
        )
    if video.ndim == 3:
        video = np.repeat(video[..., None], 3, axis=-1)
    elif video.ndim == 4 and video.shape[-1] != 3 and video.shape[1] == 3:
        video = video.transpose(0, 2, 3, 1)  # (T, 3, H, W) -> (T, H, W, 3)
    if video.ndim != 4 or video.shape[-1] != 3 or video.shape[0] == 0:
        raise ValueError(
            f"Video frames must be shaped (T, H, W, 3) with T >= 1 (or (T, 3, H, W), (T, H, W)), "
            f"got {video.shape}."
        )
    return np.ascontiguousarray(video)


def as_frames(frames: Any) -> list[np.ndarray]:
    """A clip as a list of uint8 ``(H, W, 3)`` frames from a ``(T, H, W, 3)``, ``(T, 3, H, W)`` or ``(T, H, W)``
    array or tensor (views) or a list of frames (converted one by one, never stacked). Raises as :func:`_as_video`
    does, and on frames of different shapes."""
    if isinstance(frames, (list, tuple)):
        if not frames:
            raise ValueError("Video frames must be shaped (T, H, W, 3) with T >= 1, got an empty list.")
        out = [_as_video(np.asarray(frame)[None])[0] for frame in frames]
        shapes = {frame.shape for frame in out}
        if len(shapes) > 1:
            raise ValueError(f"Video frames must all have one shape, got {sorted(shapes)}.")
        return out
    return list(_as_video(frames))


def _pad_even(video: np.ndarray) -> np.ndarray:
    """Pads (T, H, W, 3) by repeating the last row/column so that H and W are even."""
    pad_h, pad_w = video.shape[1] % 2, video.shape[2] % 2
    if not (pad_h or pad_w):
        return video
    return np.pad(video, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


class ClipWriter:
    """A clip written as its frames come (:meth:`reverie.logs.logger.Logger.clip`): each uint8 ``(H, W, 3)`` frame
    (or ``(3, H, W)``, ``(H, W)``) goes into the mp4 at ``path`` at once and is kept only as 1-byte palette indices
    for the GIF and filmstrip."""

    def __init__(self, path: str | Path, fps: int = 30):
        self.path, self.fps = Path(path), fps
        self.indices: list[np.ndarray] = []
        self.shape: tuple[int, ...] | None = None
        self._writer = None

    def add(self, frame: Any) -> None:
        """Append one frame. Raises ValueError/TypeError on a bad frame or one of another shape."""
        rgb = _as_video(np.asarray(frame)[None])[0]
        if self.shape is None:
            self.shape = rgb.shape
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = mp4_writer(self.path, self.fps)
        elif rgb.shape != self.shape:
            raise ValueError(f"Video frames must all have one shape, got {self.shape} then {rgb.shape}.")
        self._writer.append_data(pad_even(rgb))
        self.indices.append(palette_index(rgb))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def filmstrip(self, count: int = FILMSTRIP_FRAMES) -> np.ndarray:
        """:func:`filmstrip` of the clip, in the GIF's colours: ``(H, k*W, 3)`` uint8."""
        return np.concatenate([_PALETTE[self.indices[i]] for i in _evenly_spaced(len(self.indices), count)], axis=1)
