"""Stored posteriors for a synthetic replay batch (the replay context of ``agent=dreamerv3_2025``), shared by the
update timings of bench/vs_jax.py and bench/paired_update.py."""

from __future__ import annotations

import numpy as np


def stored_latents(T: int, B: int, latents: dict[str, tuple[tuple[int, ...], np.dtype]],
                   rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``(T, B, ...)`` arrays for an agent's ``replay_latent_spec()``: booleans (``has_posterior``) true, ``(S, K)``
    shapes one-hot, the rest standard normal, in the spec's dtypes."""
    out = {}
    for key, (shape, dtype) in latents.items():
        if np.dtype(dtype) == np.dtype(bool):
            out[key] = np.ones((T, B, *shape), bool)
        elif len(shape) == 2:  # (S, K): one-hot latents
            out[key] = np.eye(shape[1], dtype=dtype)[rng.integers(shape[1], size=(T, B, shape[0]))]
        else:
            out[key] = rng.normal(size=(T, B, *shape)).astype(dtype)
    return out
