"""The logits gradient of a straight-through unimix sample, written out for the fused scans' backward passes (the
gradient autograd gives :func:`reverie.models.distributions.unimix_sample`'s ``one_hot + probs - probs.detach()``).
"""

from __future__ import annotations

import torch


def straight_through_grad(grad: torch.Tensor, probs: torch.Tensor, unimix: float) -> torch.Tensor:
    """Logits gradient ``(1 - unimix) * p * (g - sum(g * p))`` ``(..., K)`` of the unimix probabilities for
    ``grad (..., K)``, ``p = softmax(logits)`` (Bengio et al. 2013; DreamerV3 section 3)."""
    grad_logits = (grad - (grad * probs).sum(-1, keepdim=True)).mul_(probs)
    return grad_logits.mul_(1.0 - unimix) if unimix else grad_logits
