"""The one seam for randomness: every random draw an update makes (latent samples, imagined actions, PlaNet's
Gaussian latents) can be taken from a replacement source instead of torch's generator.

By default no source is installed and each sampler draws from torch's generator as it always did (the seam costs
one global read per draw). A test installs a source with :func:`drawing_from` to replay draws recorded elsewhere,
e.g. the official DreamerV3 code's (tests/goldens): a source has two methods,

- ``categorical(probs (..., K), unimix) -> index (...) int64``: a class drawn from ``(1 - unimix) * probs +
  unimix / K`` (``probs``: the softmax of the logits, float32 or wider; the caller one-hots the index);
- ``normal(mean (...), std (...)) -> eps (...)``: standard normal noise; the sample is ``mean + std * eps`` (the
  caller keeps the reparameterised gradient through ``mean`` and ``std``).

Callers: :func:`reverie.models.distributions.unimix_index` (every categorical draw: RSSM latents, the discrete
policy, the transformer's latents, the observe-scan kernel), the block-scan kernel
(:mod:`reverie.models.kernels.block_scan` asks per step when a source is installed, instead of drawing all steps'
uniforms at once), :class:`reverie.models.distributions.BoundedNormal` (the continuous policy) and PlaNet's
Gaussian RSSM.
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
    """Take every draw from ``replacement`` inside the block (not thread-safe: one source per process).

    Raises:
        RuntimeError: a source is already installed (nested replacements would hide which one draws).
    """
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
