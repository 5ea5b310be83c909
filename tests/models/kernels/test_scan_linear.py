"""Deferred weight gradients of a scan's linear layers equal autograd's per-step gradients."""

import pytest
import torch
from torch import nn

from reverie.models.kernels.scan_linear import ScanLinears


def scan(layers: dict[str, nn.Linear], x0: torch.Tensor, inputs: torch.Tensor, deferred: bool, unused_last: bool):
    """h_t = tanh(A(h_{t-1}) + B(u_t)); loss reads every h_t (or all but the last)."""
    lin = ScanLinears(layers) if deferred else None
    apply = (lambda name, x: lin(name, x)) if deferred else (lambda name, x: layers[name](x))
    h, outs = x0, []
    for u in inputs:
        h = torch.tanh(apply("a", h) + apply("b", u))
        outs.append(h)
    if unused_last:
        outs = outs[:-1]
    return sum((o * torch.arange(1.0, o.shape[-1] + 1, dtype=o.dtype)).sum() for o in outs)


@pytest.mark.parametrize("unused_last", [False, True])
def test_weight_bias_and_input_gradients_equal_autograd(unused_last):
    torch.manual_seed(0)
    layers = {"a": nn.Linear(5, 5).double(), "b": nn.Linear(3, 5, bias=False).double()}
    x0 = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    inputs = torch.randn(6, 4, 3, dtype=torch.float64, requires_grad=True)
    grads = []
    for deferred in (False, True):
        for m in layers.values():
            m.zero_grad(set_to_none=True)
        x0.grad = inputs.grad = None
        loss = scan(layers, x0, inputs, deferred, unused_last)
        loss.backward()
        grads.append([layers["a"].weight.grad, layers["a"].bias.grad, layers["b"].weight.grad, x0.grad, inputs.grad])
    for plain, deferred in zip(*grads):
        torch.testing.assert_close(deferred, plain, rtol=1e-12, atol=1e-12)


def test_without_autograd_the_layers_run_plainly():
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    with torch.no_grad():
        lin = ScanLinears({"l": layer})
        assert not lin.record
        torch.testing.assert_close(lin("l", x), layer(x))


def test_bfloat16_compute_dtype_gives_float32_gradients_close_to_autocast():
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    x = torch.randn(3, 8)
    lin = ScanLinears({"l": layer}, torch.bfloat16)
    out = lin("l", x)
    assert out.dtype == torch.bfloat16
    h = out
    for _ in range(4):
        h = torch.tanh(lin("l", h.float()))
    h.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
    deferred = layer.weight.grad.clone()
    layer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = layer(x)
        for _ in range(4):
            h = torch.tanh(layer(h.float()))
    h.float().sum().backward()
    torch.testing.assert_close(deferred, layer.weight.grad, rtol=3e-2, atol=3e-2)


def test_a_retained_graph_gives_the_same_gradient_on_every_backward():
    torch.manual_seed(0)
    layers = {"a": nn.Linear(5, 5).double(), "b": nn.Linear(3, 5, bias=False).double()}
    x0 = torch.randn(4, 5, dtype=torch.float64)
    inputs = torch.randn(6, 4, 3, dtype=torch.float64)
    loss = scan(layers, x0, inputs, deferred=True, unused_last=False)
    first = torch.autograd.grad(loss, [layers["a"].weight, layers["b"].weight], retain_graph=True)
    second = torch.autograd.grad(loss, [layers["a"].weight, layers["b"].weight])
    expected = torch.autograd.grad(scan(layers, x0, inputs, deferred=False, unused_last=False),
                                   [layers["a"].weight, layers["b"].weight])
    for a, b, e in zip(first, second, expected):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b, e, rtol=1e-12, atol=1e-12)


def test_a_partial_backward_does_not_leave_pairs_for_the_next_one():
    """autograd.grad of the inputs only (the sink is not run) files per-step pairs; the next full backward must
    count its own pairs only."""
    torch.manual_seed(0)
    layers = {"a": nn.Linear(5, 5).double(), "b": nn.Linear(3, 5, bias=False).double()}
    x0 = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    inputs = torch.randn(6, 4, 3, dtype=torch.float64)
    loss = scan(layers, x0, inputs, deferred=True, unused_last=False)
    torch.autograd.grad(loss, [x0], retain_graph=True)
    loss.backward()
    weights = [layers["a"].weight, layers["b"].weight, layers["a"].bias]
    deferred = [w.grad.clone() for w in weights]
    expected = torch.autograd.grad(scan(layers, x0, inputs, deferred=False, unused_last=False), weights)
    for d, e in zip(deferred, expected):
        torch.testing.assert_close(d, e, rtol=1e-12, atol=1e-12)
