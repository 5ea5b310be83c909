"""An MLP run once per step of a rollout without autograd, then differentiated over all steps in one pass.

DreamerV3's actor for discrete actions (REINFORCE, section 4) is evaluated twice on the imagined states: once per
step of the rollout to sample the actions (no gradient), and once more on all ``H`` steps together for the loss
``-log pi(a_t | s_t) * adv_t`` (with gradient). The two passes give the same values (same weights, same inputs),
so the second one is redundant work: about 5% of an update at size s on the 2-core CPU (docs/speed.md).

:class:`MLPTape` keeps what the rollout's passes computed (inputs, pre-norm activations, LayerNorm statistics,
normalised activations, outputs), and :meth:`MLPTape.replay` returns the stacked outputs ``(steps, N, out)``
as a function of the MLP's parameters whose backward is written out over all steps at once, with autograd's
own kernels: ``silu_backward``, ``native_layer_norm_backward``, one ``G^T @ X`` per weight, and the one-hot rows'
weight gradient of :mod:`reverie.models.onehot_linear` for a :class:`SplitFeat` input. Reusing the 15 per-step
graphs instead (one backward per step) was measured slower: the small per-step weight gradients cost what the
second forward pass saves. ``tests/models/test_mlp_tape.py`` checks values and every parameter gradient against
autograd through a fresh forward pass, in float64 and bf16.

Supports :class:`reverie.models.networks.MLP` with LayerNorm hidden layers (``NormLinear``: linear, LayerNorm,
SiLU) and an output layer. The inputs get no gradient (the actor reads detached features).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.onehot_linear import SplitFeat, _index_grad

_LN_GRADS = [True, True, True]  # native_layer_norm_backward: input, weight and bias gradients


class MLPTape:
    """Records forward passes of ``mlp`` made without autograd, one per rollout step; see the module docstring.

    ``tape(x)`` for ``x (N, in)`` (a tensor or :class:`SplitFeat`) returns ``mlp(x)`` ``(N, out)`` (same
    values) and keeps the activations; ``tape.replay(steps)`` returns the outputs of the first ``steps``
    recorded passes stacked ``(steps, N, out)``, differentiable in ``mlp``'s parameters.

    Raises:
        TypeError: ``mlp`` has a hidden layer that is not linear -> LayerNorm -> SiLU, or no output layer.
    """

    def __init__(self, mlp: nn.Module):
        for layer in mlp.hidden:
            if len(layer) != 3 or not isinstance(layer[1], nn.LayerNorm) or not isinstance(layer[2], nn.SiLU):
                raise TypeError(f"MLPTape supports linear -> LayerNorm -> SiLU hidden layers, got {layer}")
        if mlp.out is None:
            raise TypeError("MLPTape needs an MLP with an output layer")
        self.mlp = mlp
        self.steps: list[tuple[list[tuple], torch.Tensor, torch.Tensor]] = []

    def __call__(self, x: torch.Tensor | SplitFeat) -> torch.Tensor:
        """``mlp(x)`` computed without autograd, its activations recorded. ``x (N, in)`` -> ``(N, out)``."""
        hidden = []
        with torch.no_grad():
            for linear, norm, _ in self.mlp.hidden:
                y = linear(x)  # (N, units), in the compute dtype under autocast
                n, mean, rstd = torch.native_layer_norm(y, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
                hidden.append((x, y, mean, rstd, n))
                x = F.silu(n)
            out = self.mlp.out(x)
        self.steps.append((hidden, x, out))
        return out

    def replay(self, steps: int) -> torch.Tensor:
        """The first ``steps`` recorded outputs ``(steps, N, out)``; their gradient reaches the MLP's parameters.

        Raises:
            ValueError: fewer than ``steps`` passes recorded.
        """
        if steps > len(self.steps):
            raise ValueError(f"MLPTape.replay({steps}): only {len(self.steps)} forward passes were recorded")
        return _Replay.apply(self, steps, *self.mlp.parameters())


def _cat(parts: list[torch.Tensor | SplitFeat]) -> torch.Tensor | SplitFeat:
    """Concatenate per-step inputs along rows (``SplitFeat``: its deter and index; no one-hot)."""
    if isinstance(parts[0], SplitFeat):
        deter = None if parts[0].deter is None else torch.cat([p.deter for p in parts])
        return SplitFeat(deter, None, torch.cat([p.index for p in parts]), parts[0].classes)
    return torch.cat(parts)


def _linear_grads(linear: nn.Linear, x: torch.Tensor | SplitFeat, dy: torch.Tensor, need_input: bool):
    """Weight (and bias) gradient of ``linear`` at input ``x (M, in)`` for output gradient ``dy (M, out)`` in the
    compute dtype, and the input gradient when ``need_input`` (dense inputs only)."""
    weight = linear.weight
    if isinstance(x, SplitFeat):  # FeatLinear on (deter, index): dense W_h part, one-hot rows by index_add
        s, k = x.index.shape[-1], x.classes
        d = weight.shape[1] - s * k
        grad_weight = torch.empty_like(weight)
        flat = x.index + torch.arange(0, s * k, k, device=x.index.device)  # (M, S) rows of W_z
        grad_weight[:, d:] = _index_grad(dy, flat, s * k, weight.dtype).t()
        if x.deter is not None:
            grad_weight[:, :d] = (dy.t() @ x.deter.to(dy.dtype)).to(weight.dtype)
        grad_x = None
    else:
        grad_weight = (dy.t() @ x.to(dy.dtype)).to(weight.dtype)
        grad_x = dy @ weight.to(dy.dtype) if need_input else None
    grad_bias = None if linear.bias is None else dy.sum(0, dtype=linear.bias.dtype)
    return grad_weight, grad_bias, grad_x


class _Replay(torch.autograd.Function):
    """``(tape, steps, *mlp parameters) -> (steps, N, out)``: the recorded outputs; backward over all steps."""

    @staticmethod
    def forward(ctx, tape, steps, *params):
        ctx.tape, ctx.steps = tape, steps
        return torch.stack([out for _, _, out in tape.steps[:steps]])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        tape, records = ctx.tape, ctx.tape.steps[:ctx.steps]
        mlp = tape.mlp
        dt = records[0][2].dtype  # the compute dtype the passes ran in
        grads: dict[nn.Parameter, torch.Tensor | None] = {}
        with torch.autocast(grad.device.type, enabled=False):
            dh = grad.reshape(-1, grad.shape[-1]).to(dt)  # (steps * N, out)
            x = _cat([x for _, x, _ in records])
            gw, gb, dh = _linear_grads(mlp.out, x, dh, need_input=True)
            grads[mlp.out.weight], grads[mlp.out.bias] = gw, gb
            for i in reversed(range(len(mlp.hidden))):
                linear, norm, _ = mlp.hidden[i]
                x, y, mean, rstd, n = (_cat([hidden[i][j] for hidden, _, _ in records]) for j in range(5))
                dy, dgamma, dbeta = torch.ops.aten.native_layer_norm_backward(
                    torch.ops.aten.silu_backward(dh, n), y, norm.normalized_shape, mean, rstd, norm.weight,
                    norm.bias, _LN_GRADS)
                grads[norm.weight], grads[norm.bias] = dgamma, dbeta
                gw, gb, dh = _linear_grads(linear, x, dy, need_input=i > 0)
                grads[linear.weight] = gw
                if linear.bias is not None:
                    grads[linear.bias] = gb
        return (None, None, *[grads.get(p) for p in mlp.parameters()])
