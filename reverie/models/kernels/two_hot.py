"""The two-hot log-likelihood with a sparse backward ``scatter(weight) - softmax * sum_j weight_j`` (replaces the
autograd gather of :meth:`reverie.models.distributions.TwoHotSymlog.log_prob_mix`; docs/changelog.md, rounds 2 and
4; ``tests/models/test_distributions.py`` checks it against the dense cross-entropy in float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LOG_OF_PROBS_MIN = 1e-30  # given probabilities at least this large enter the log-likelihood as log(p)


class SparseTargetLogProb(torch.autograd.Function):
    """``(logits (..., K), index (..., J) int64, weight (..., J), probs (..., K) float32 or None) -> (...)``:
    ``sum_j weight_j * log_softmax(logits)[index_j]``; gradient for ``logits`` only."""

    @staticmethod
    def forward(ctx, logits, index, weight, probs):
        ctx.dtype, ctx.given = logits.dtype, probs is not None
        if probs is not None:  # the caller's float32 softmax: the backward reads it, the forward its J entries
            at = probs.gather(-1, index)  # (..., J)
            # log(p) equals log_softmax to float32 rounding only for p >= 1e-30 (smaller: near the subnormals)
            if not bool(((at < _LOG_OF_PROBS_MIN) & (weight != 0)).any()):
                ctx.save_for_backward(probs, index, weight)
                return torch.special.xlogy(weight, at).sum(-1)  # 0 where a weight is 0, even at a 0 probability
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logp = F.log_softmax(logits, -1, dtype=dtype)  # (..., K)
        ctx.save_for_backward(logp if probs is None else probs, index, weight)  # the backward needs softmax
        # 0 * -inf would be NaN (a -inf logit next to a target exactly on a bin)
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
