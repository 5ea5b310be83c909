"""The two-hot log-likelihood with a sparse backward (replaces ``log_softmax(logits)`` gathered at the two
neighbouring bins under autograd in :meth:`reverie.models.distributions.TwoHotSymlog.log_prob_mix`).

``sum_j weight[..., j] * log_softmax(logits)[..., index[..., j]]`` for ``J`` target entries per row (two per
target: the critic's loss has four, the return and the slow critic's mean). Autograd's gather builds a zero-filled
``(..., K)`` gradient per gather and a ``log_softmax`` backward; here the gradient is written out as
``scatter(weight) - softmax * sum_j weight_j``: one pass over ``(..., K)`` plus ``J`` scattered entries per row.
With ``probs`` (the caller's float32 softmax without autograd, e.g. the critic's, shared with its values) the
forward takes the log of its ``J`` entries and the backward reads it: no ``(..., 255)`` temporaries at all.
Measured with the critic's shared softmax (docs/changelog.md, rounds 2 and 4). ``tests/models/test_distributions.py``
checks values and gradients against the dense cross-entropy in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LOG_OF_PROBS_MIN = 1e-30  # given probabilities at least this large enter the log-likelihood as log(p)


class SparseTargetLogProb(torch.autograd.Function):
    """``(logits (..., K), index (..., J) int64, weight (..., J), probs (..., K) float32 or None) -> (...)``:
    ``sum_j weight_j * log_softmax(logits)[index_j]`` in float32 (at least), gradient for ``logits`` only."""

    @staticmethod
    def forward(ctx, logits, index, weight, probs):
        ctx.dtype, ctx.given = logits.dtype, probs is not None
        if probs is not None:  # the caller's float32 softmax: the backward reads it, the forward its J entries
            at = probs.gather(-1, index)  # (..., J)
            # log of a float32 probability of 1e-30 or more is log_softmax to float32 rounding; a smaller one (a
            # target bin ~69 nats or more below the best: near or in the subnormals, or 0) is not, so then the
            # full log_softmax below
            if not bool(((at < _LOG_OF_PROBS_MIN) & (weight != 0)).any()):
                ctx.save_for_backward(probs, index, weight)
                return torch.special.xlogy(weight, at).sum(-1)  # 0 where a weight is 0, even at a 0 probability
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logp = F.log_softmax(logits, -1, dtype=dtype)  # (..., K)
        ctx.save_for_backward(logp if probs is None else probs, index, weight)  # the backward needs softmax
        # a zero weight contributes 0 even where its bin's log-probability is -inf (a -inf logit next to a target
        # that sits exactly on a bin): 0 * -inf would be NaN
        picked = logp.gather(-1, index)  # (..., J)
        return torch.where(weight != 0, picked * weight, picked.new_zeros(())).sum(-1)

    @staticmethod
    def backward(ctx, grad):
        saved, index, weight = ctx.saved_tensors
        g = grad.unsqueeze(-1)  # (..., 1)
        scale = -(g * weight.sum(-1, keepdim=True))
        grad_logits = saved * scale if ctx.given else saved.exp().mul_(scale)  # - softmax * sum_j g w_j
        grad_logits.scatter_add_(-1, index, g * weight)  # + g w_j at index_j
        return grad_logits.to(ctx.dtype), None, None, None
