"""The one seam for randomness: every random draw of an update can come from a source installed with
:func:`drawing_from` instead of torch's generator (tests replay the official code's draws, tests/goldens).

A source has ``categorical(probs (..., K), unimix) -> index (...) int64``, a class drawn from ``(1 - unimix) *
probs + unimix / K``, and ``normal(mean (...), std (...)) -> eps (...)``, standard normal noise.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Protocol

import torch


class DrawSource(Protocol):
    def categorical(self, probs: torch.Tensor, unimix: float) -> torch.Tensor: ...

    def normal(self, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor: ...


_source: DrawSource | None = None


def source() -> DrawSource | None:
    """The installed source, or None (draw from torch's generator)."""
    return _source


@contextlib.contextmanager
def drawing_from(replacement: DrawSource) -> Iterator[DrawSource]:
    """Take every draw from ``replacement`` inside the block (one source per process; not thread-safe).
    RuntimeError: a source is already installed."""
    global _source
    if _source is not None:
        raise RuntimeError(f"reverie.models.draws: a draw source ({type(_source).__name__}) is already installed")
    _source = replacement
    try:
        yield replacement
    finally:
        _source = None


def normal_noise(mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Standard normal noise of ``mean``'s shape: the source's, or ``torch.randn_like(std)``."""
    if _source is None:
        return torch.randn_like(std)
    return _source.normal(mean.detach(), std.detach()).to(std.dtype)
