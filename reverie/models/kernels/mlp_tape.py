"""An MLP run once per step of a rollout without autograd, then differentiated over all steps in one pass.

DreamerV3's actor for discrete actions (REINFORCE, section 4) is evaluated twice on the imagined states: once per
step of the rollout to sample the actions (no gradient), and once more on all ``H`` steps together for the loss
``-log pi(a_t | s_t) * adv_t`` (with gradient). The two passes give the same values (same weights, same inputs),
so the second one is redundant work: the tape gained 1.041x / 1.020x paired at sizes xs / s (docs/changelog.md,
round 3). It replaces :class:`reverie.agents.dreamer.ActorPasses` (the readable second pass) with kernels on.

:class:`MLPTape` keeps what the rollout's passes computed (pre-norm activations, LayerNorm statistics,
normalised and activated activations, written into ``(steps, N, units)`` buffers as they are computed, and the
outputs), and :meth:`MLPTape.replay` takes the passes' inputs as the rollout stacked them and returns the stacked
outputs ``(steps, N, out)`` as a function of the MLP's parameters whose backward is written out over all steps
at once, with autograd's own kernels: ``silu_backward``, ``native_layer_norm_backward``, one ``G^T @ X`` per
weight, and the one-hot rows'
weight gradient of :mod:`reverie.models.kernels.onehot_linear` for a :class:`SplitFeat` input. Reusing the 15 per-step
graphs instead (one backward per step) was measured slower: the small per-step weight gradients cost what the
second forward pass saves. ``tests/models/kernels/test_mlp_tape.py`` checks values and every parameter gradient against
autograd through a fresh forward pass, in float64 and bf16.

Supports :class:`reverie.models.networks.MLP` with LayerNorm hidden layers (``NormLinear``: linear, LayerNorm,
SiLU) and an output layer. The inputs get no gradient (the actor reads detached features).
"""

from __future__ import annotations

import torch
from torch import nn

from reverie.models.kernels.onehot_linear import SplitFeat, flat_rows, onehot_weight_grad

_LN_GRADS = [True, True, True]  # native_layer_norm_backward: input, weight and bias gradients


class MLPTape:
    """Records forward passes of ``mlp`` made without autograd, one per rollout step; see the module docstring.

    ``tape(x)`` for ``x (N, in)`` (a tensor or :class:`SplitFeat`) returns ``mlp(x)`` ``(N, out)`` (same
    values) and, for the first ``steps`` calls, keeps the activations: the normalised and activated ones are
    written straight into ``(steps, N, units)`` buffers (no copy at replay time). ``tape.replay(inputs)`` with
    those calls' inputs stacked ``(steps, N, in)`` (as the rollout stacks its states anyway) returns their
    outputs stacked ``(steps, N, out)``, differentiable in ``mlp``'s parameters.

    Raises:
        TypeError: ``mlp`` has a hidden layer that is not linear -> LayerNorm -> SiLU, or no output layer.
    """

    def __init__(self, mlp: nn.Module, steps: int):
        for layer in mlp.hidden:
            if len(layer) != 3 or not isinstance(layer[1], nn.LayerNorm) or not isinstance(layer[2], nn.SiLU):
                raise TypeError(f"MLPTape supports linear -> LayerNorm -> SiLU hidden layers, got {layer}")
        if mlp.out is None:
            raise TypeError("MLPTape needs an MLP with an output layer")
        self.mlp, self.steps, self.count = mlp, steps, 0
        self.pre: list[list[torch.Tensor]] = [[] for _ in mlp.hidden]  # per layer, per step: linear output (N, U)
        self.buffers: list[tuple[torch.Tensor, ...]] = []  # per layer: normalised, mean, rstd, activated
        self.outs: list[torch.Tensor] = []
        self.versions: list[int] = []

    def __call__(self, x: torch.Tensor | SplitFeat) -> torch.Tensor:
        """``mlp(x)`` computed without autograd, its activations recorded. ``x (N, in)`` -> ``(N, out)``."""
        t, record = self.count, self.count < self.steps
        if t == 0:  # what autograd's saved-tensor check would compare at backward time
            self.versions = [p._version for p in self.mlp.parameters()]
        with torch.no_grad():
            for i, (linear, norm, act) in enumerate(self.mlp.hidden):
                y = linear(x)  # (N, units), in the compute dtype under autocast
                if not record:
                    x = act(norm(y))
                    continue
                if len(self.buffers) == i:  # first call: (steps, N, units) buffers for this layer
                    stat_dtype = torch.promote_types(y.dtype, torch.float32)  # LayerNorm's mean/rstd dtype
                    stat = y.new_empty(self.steps, *y.shape[:-1], 1, dtype=stat_dtype)
                    self.buffers.append((y.new_empty(self.steps, *y.shape), stat, torch.empty_like(stat),
                                         y.new_empty(self.steps, *y.shape)))
                n, mean, rstd, h = self.buffers[i]
                torch.ops.aten.native_layer_norm.out(y, norm.normalized_shape, norm.weight, norm.bias, norm.eps,
                                                     out0=n[t], out1=mean[t], out2=rstd[t])
                torch.ops.aten.silu.out(n[t], out=h[t])
                self.pre[i].append(y)
                x = h[t]
            out = self.mlp.out(x)
        if record:
            self.outs.append(out)
        self.count += 1
        return out

    def replay(self, inputs: torch.Tensor | SplitFeat) -> torch.Tensor:
        """Outputs of the recorded calls ``(steps, N, out)``, their gradient reaching the MLP's parameters.

        Args:
            inputs: the recorded calls' inputs stacked ``(steps, N, in)`` (the first layer's weight gradient
                reads them).

        Raises:
            ValueError: fewer calls recorded than ``steps``, or ``inputs`` of another number of steps.
        """
        lead = inputs.lead if isinstance(inputs, SplitFeat) else inputs.shape[:-1]
        if len(self.outs) != self.steps or lead[0] != self.steps:
            raise ValueError(f"MLPTape.replay: {len(self.outs)} of {self.steps} calls recorded, inputs of "
                             f"{lead[0]} steps; replay after the rollout, with its first {self.steps} inputs")
        return _Replay.apply(self, inputs.flatten(0, 1), *self.mlp.parameters())

    def clear(self) -> None:
        """Drop the recorded activations (``(steps, N, units)`` buffers per layer) once the replay's backward ran:
        they are not saved through autograd, so they live as long as the tape does."""
        self.pre, self.buffers, self.outs = [[] for _ in self.mlp.hidden], [], []


def _linear_grads(linear: nn.Linear, x: torch.Tensor | SplitFeat, dy: torch.Tensor, need_input: bool):
    """Weight (and bias) gradient of ``linear`` at input ``x (M, in)`` for output gradient ``dy (M, out)`` in the
    compute dtype, and the input gradient when ``need_input`` (dense inputs only)."""
    weight = linear.weight
    if isinstance(x, SplitFeat):  # FeatLinear on (deter, index): dense W_h part, one-hot rows by index_add
        grad_weight = onehot_weight_grad(dy, x.deter, flat_rows(x.index, x.classes), weight)
        grad_x = None
    else:
        grad_weight = (dy.t() @ x.to(dy.dtype)).to(weight.dtype)
        grad_x = dy @ weight.to(dy.dtype) if need_input else None
    grad_bias = None if linear.bias is None else dy.sum(0, dtype=linear.bias.dtype)
    return grad_weight, grad_bias, grad_x


class _Replay(torch.autograd.Function):
    """``(tape, inputs (steps * N, in), *mlp parameters) -> (steps, N, out)``: the recorded outputs; backward
    over all steps at once."""

    @staticmethod
    def forward(ctx, tape, inputs, *params):
        ctx.tape, ctx.inputs = tape, inputs
        return torch.stack(tape.outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        tape, mlp = ctx.tape, ctx.tape.mlp
        if not tape.outs:
            raise RuntimeError("MLPTape: backward after clear(); the recorded activations are gone")
        if [p._version for p in mlp.parameters()] != tape.versions:
            raise RuntimeError("MLPTape: a parameter of the taped MLP was modified in place after the rollout "
                               "recorded it (an optimiser step?); run the backward pass before changing them")
        dt = tape.outs[0].dtype  # the compute dtype the passes ran in
        grads: dict[nn.Parameter, torch.Tensor | None] = {}
        with torch.autocast(grad.device.type, enabled=False):
            dh = grad.reshape(-1, grad.shape[-1]).to(dt)  # (steps * N, out)
            x = tape.buffers[-1][3].flatten(0, 1) if tape.buffers else ctx.inputs
            gw, gb, dh = _linear_grads(mlp.out, x, dh, need_input=bool(tape.buffers))
            grads[mlp.out.weight], grads[mlp.out.bias] = gw, gb
            for i in reversed(range(len(mlp.hidden))):
                linear, norm, _ = mlp.hidden[i]
                n, mean, rstd, _ = (b.flatten(0, 1) for b in tape.buffers[i])
                dy, dgamma, dbeta = torch.ops.aten.native_layer_norm_backward(
                    torch.ops.aten.silu_backward(dh, n), torch.cat(tape.pre[i]), norm.normalized_shape, mean, rstd,
                    norm.weight, norm.bias, _LN_GRADS)
                grads[norm.weight], grads[norm.bias] = dgamma, dbeta
                x = tape.buffers[i - 1][3].flatten(0, 1) if i > 0 else ctx.inputs
                gw, gb, dh = _linear_grads(linear, x, dy, need_input=i > 0)
                grads[linear.weight] = gw
                if linear.bias is not None:
                    grads[linear.bias] = gb
        return (None, None, *[grads.get(p) for p in mlp.parameters()])
