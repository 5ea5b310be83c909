"""The straight-through sample of a unimix categorical as one autograd node, replacing
:func:`reverie.models.distributions.unimix_sample`'s graph ``one_hot + probs - probs.detach()`` (docs/changelog.md
round 2; ``tests/models/kernels/test_sampling.py``).
"""

from __future__ import annotations

import torch


def straight_through_grad(grad: torch.Tensor, probs: torch.Tensor, unimix: float) -> torch.Tensor:
    """Logits gradient ``(1 - unimix) * p * (g - sum(g * p))`` ``(..., K)`` of the unimix probabilities for
    ``grad (..., K)``, ``p = softmax(logits)`` (Bengio et al. 2013; DreamerV3 section 3)."""
    grad_logits = (grad - (grad * probs).sum(-1, keepdim=True)).mul_(probs)
    return grad_logits.mul_(1.0 - unimix) if unimix else grad_logits


class StraightThrough(torch.autograd.Function):
    """``(logits (..., K), probs (..., K), index (...), unimix) -> one-hot (..., K)``; gradient as
    :func:`straight_through_grad`."""

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
