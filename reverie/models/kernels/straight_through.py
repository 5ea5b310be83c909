"""The straight-through sample of a unimix categorical as one autograd node (replaces the graph
``one_hot + probs - probs.detach()`` of :func:`reverie.models.distributions.unimix_sample` with ``fast=False``).

Value: the one-hot of the drawn class. Gradient: that of the unimix probabilities ``(1 - unimix) * softmax(logits)
+ unimix / K`` (Bengio et al. 2013; DreamerV3 section 3), written out as ``(1 - unimix) * p * (g - sum(g * p))``.
One node instead of four (mix, subtract, add, softmax) per latent sample of the observe scan: part of the 4.7% at
size xs of round 2 (docs/changelog.md). :func:`straight_through_grad` is also the fused observe scan's backward of
the sample. ``tests/models/kernels/test_sampling.py`` checks the gradient against the plain graph.
"""

from __future__ import annotations

import torch


def straight_through_grad(grad: torch.Tensor, probs: torch.Tensor, unimix: float) -> torch.Tensor:
    """Gradient w.r.t. the logits ``(..., K)`` float32 of the unimix probabilities ``(1 - unimix) * softmax(logits) +
    unimix / K`` for an upstream gradient ``grad (..., K)`` on them: ``(1 - unimix) * p * (g - sum(g * p))`` with
    ``p = softmax(logits)`` ``(..., K)`` float32 (the straight-through estimator's backward)."""
    grad_logits = (grad - (grad * probs).sum(-1, keepdim=True)).mul_(probs)
    return grad_logits.mul_(1.0 - unimix) if unimix else grad_logits


class StraightThrough(torch.autograd.Function):
    """``(logits (..., K), probs = softmax(logits) (..., K) float32, index (...), unimix) -> one-hot (..., K)`` in
    ``probs``' dtype, with the gradient of the unimix probabilities (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits, probs, index, unimix):
        ctx.save_for_backward(probs)
        ctx.unimix, ctx.dtype = unimix, logits.dtype
        out = torch.zeros(*index.shape, probs.shape[-1], device=index.device, dtype=probs.dtype)
        return out.scatter_(-1, index.unsqueeze(-1), 1.0)

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return straight_through_grad(grad, p, ctx.unimix).to(ctx.dtype), None, None, None
