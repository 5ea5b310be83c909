"""Linear layers applied at every step of a scan, their weight gradients deferred to one product
``sum_t g_t^T @ x_t = G^T @ X`` each (the categorical RSSM's observe loop where the fused scan does not apply, via
:meth:`reverie.models.kernels.rssm.RSSMKernels.deferred_weights`; docs/changelog.md round 2).

``_Sink`` turns a weight into a scalar token that every step's ``_DeferredLinear`` takes as input, so the sink's
backward runs after every step's and stacks the ``(x_t, g_t)`` pairs they filed. No ``create_graph=True``.
``tests/models/kernels/test_scan_linear.py`` checks against autograd in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _graph_task() -> int:
    """Id of the backward pass running now, so a sink sums only its own pass's pairs."""
    return torch._C._current_graph_task_id()


def stacked_weight_grad(pairs: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype,
                        bias: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(sum_t g_t^T @ x_t (O, I), sum_t g_t.sum(0) (O,) or None)`` over ``(x_t (B, I), g_t (B, O))`` pairs."""
    x = torch.cat([x for x, _ in pairs])  # (steps * B, I)
    g = torch.cat([g for _, g in pairs])  # (steps * B, O)
    return (g.t() @ x).to(dtype), g.sum(0, dtype=dtype) if bias else None


class _Sink(torch.autograd.Function):
    """``weight (O, I), bias (O,) or None -> token ()``; backward: ``G^T @ X`` and ``G.sum(0)`` of the filed pairs."""

    @staticmethod
    def forward(ctx, weight, bias, filed):
        ctx.filed, ctx.has_bias = filed, bias is not None
        ctx.weight_dtype = weight.dtype
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx, _token_grad):
        filed = ctx.filed  # kept on ctx and emptied below: a second backward (retain_graph) files its own pairs
        task = _graph_task()
        mine = [(x, g) for pass_id, x, g in filed if pass_id == task]  # not pairs of a pass that skipped the sink
        filed.clear()
        if not mine:
            return None, None, None
        grad_weight, grad_bias = stacked_weight_grad(mine, ctx.weight_dtype, ctx.has_bias)
        return grad_weight, grad_bias, None


class _DeferredLinear(torch.autograd.Function):
    """``x (B, I) @ weight^T (+ bias) -> (B, O)``; backward: ``g @ weight`` for ``x``, ``(x, g)`` filed for the sink."""

    @staticmethod
    def forward(ctx, x, weight, bias, token, filed):
        ctx.save_for_backward(x, weight)
        ctx.filed = filed
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        ctx.filed.append((_graph_task(), x, grad))
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        return grad_x, None, None, grad.new_zeros(()), None


class ScanLinears:
    """The ``{name: nn.Linear}`` of one scan, applied as ``linears(name, x)``, with deferred weight gradients while
    autograd records. Build one per forward pass: the tokens tie the weights to that pass's graph."""

    def __init__(self, layers: dict[str, nn.Linear], dtype: torch.dtype | None = None):
        self.layers = layers
        self.record = torch.is_grad_enabled() and any(p.requires_grad for m in layers.values() for p in m.parameters())
        self.parts: dict[str, tuple] = {}
        if not self.record:
            return
        for name, layer in layers.items():
            dt = dtype or layer.weight.dtype
            filed: list[tuple[torch.Tensor, torch.Tensor]] = []
            bias = None if layer.bias is None else layer.bias.detach().to(dt)
            token = _Sink.apply(layer.weight, layer.bias, filed)
            self.parts[name] = (layer.weight.detach().to(dt), bias, token, filed)

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``layers[name](x)`` for ``x (B, I)`` -> ``(B, O)``."""
        if not self.record:
            return self.layers[name](x)
        weight, bias, token, filed = self.parts[name]
        with torch.autocast(x.device.type, enabled=False):
            return _DeferredLinear.apply(x.to(weight.dtype), weight, bias, token, filed)
