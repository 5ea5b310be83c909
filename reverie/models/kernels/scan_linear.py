"""Linear layers applied at every step of a scan, with their weight gradients deferred to one product each (replaces
autograd's per-step weight gradients of the categorical RSSM's step-by-step observe loop, where the fused scan does
not apply: GPUs; measured on CPU before the fused scan: 2.1% of an update at size xs, 3.3% at s, docs/changelog.md
round 2). :meth:`reverie.models.kernels.rssm.RSSMKernels.deferred_weights` installs it around that loop.

A recurrent scan (the RSSM's observe scan: ``T = 64`` steps of ``B = 16`` rows) uses the same weights at every
step. Autograd gives each step its own weight gradient, ``g_t^T @ x_t`` (a ``(out, B) @ (B, in)`` product, far
too small to run at the matrix units' speed), and adds it into ``weight.grad`` (one more pass over the weight per
step). The input gradients ``g_t @ W`` must stay sequential (step ``t``'s depends on step ``t+1``'s), but the
weight gradient is a sum over steps: ``sum_t g_t^T @ x_t = G^T @ X`` with ``G``, ``X`` the steps stacked
``(T*B, ...)``: one product at full speed instead of ``T`` small ones and ``T`` additions.

:class:`ScanLinears` does that with two autograd functions. ``_Sink`` turns a weight (and bias) into a scalar
token; every step's ``_DeferredLinear`` takes the token as an input, so autograd runs the sink's backward only
after every step's backward has run. A step's backward returns its input gradient, files ``(x_t, g_t)`` with the
sink and a zero gradient for the token; the sink's backward stacks what was filed and returns the weight and
bias gradients, counting only the pairs of its own backward pass (a retained graph may be backpropagated
again, or partly: ``autograd.grad`` of other inputs). Not supported: ``create_graph=True`` through these layers
(higher-order gradients; the weights enter the steps detached). Values: the same sums, in one rounding to the
compute dtype instead of one per step (under bf16 autocast the per-step products are bf16 each);
``tests/models/kernels/test_scan_linear.py`` checks them against autograd in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _graph_task() -> int:
    """Id of the backward pass running now (autograd's graph task; what ``torch.utils.checkpoint`` reads), so a
    sink sums only its own pass's pairs: a pass that does not reach the sink (``autograd.grad`` of other inputs,
    ``retain_graph``) leaves pairs it must not count."""
    return torch._C._current_graph_task_id()


def stacked_weight_grad(pairs: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype,
                        bias: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sum_t g_t^T @ x_t`` ``(O, I)`` over the steps' ``(x_t (B, I), g_t (B, O))`` pairs as one product on the
    stacked steps, in ``dtype``, and with ``bias`` also ``sum_t g_t.sum(0)`` ``(O,)`` (else None)."""
    x = torch.cat([x for x, _ in pairs])  # (steps * B, I)
    g = torch.cat([g for _, g in pairs])  # (steps * B, O)
    return (g.t() @ x).to(dtype), g.sum(0, dtype=dtype) if bias else None


class _Sink(torch.autograd.Function):
    """``weight (O, I), bias (O,) or None -> token ()``; backward: the weight (and bias) gradient from the filed
    ``(x_t (B, I), g_t (B, O))`` pairs: ``G^T @ X`` and ``G.sum(0)``."""

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
    """``x (B, I) @ weight^T (+ bias) -> (B, O)`` in ``x``'s dtype (``weight``/``bias`` given in it, detached);
    backward: ``g @ weight`` for ``x``, ``(x, g)`` filed for the sink, a zero gradient for its token."""

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
    """The linear layers of one scan, each applied as ``linears(name, x)`` at every step, with deferred weight
    gradients while autograd records (see the module docstring); plain ``F.linear`` otherwise.

    Args:
        layers: ``{name: nn.Linear}``.
        dtype: the compute dtype (the autocast dtype under autocast), None: each weight's own.

    Build one per scan (per forward pass): the tokens tie the weights to that pass's graph.
    """

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
