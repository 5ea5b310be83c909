"""The gather path of one-hot latent inputs equals the dense Linear (forward, input and weight gradients)."""

import pytest
import torch
import torch.nn.functional as F

from reverie.models.kernels.onehot_linear import FeatLinear, SplitFeat, onehot_linear


def _features(lead=(3, 5), deter=6, groups=4, classes=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, deter, dtype=dtype, generator=g)
    index = torch.randint(0, classes, (*lead, groups), generator=g)
    z = F.one_hot(index, classes).to(dtype)
    return h, z, index


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_deter", [True, False])
def test_forward_and_gradients_equal_dense_linear(bias, with_deter):
    h, z, _ = _features()
    h.requires_grad_(True)
    z.requires_grad_(True)
    in_dim = (h.shape[-1] if with_deter else 0) + z.shape[-2] * z.shape[-1]
    layer = FeatLinear(in_dim, 7, bias=bias).double()
    dense_in = torch.cat([h, z.flatten(-2)], -1) if with_deter else z.flatten(-2)
    upstream = torch.randn(3, 5, 7, dtype=torch.float64)

    dense = F.linear(dense_in, layer.weight, layer.bias)
    grads_dense = torch.autograd.grad((dense * upstream).sum(), [h, z, *layer.parameters()], allow_unused=True)
    feat = SplitFeat.from_state(h if with_deter else None, z)
    fast = layer(feat)
    grads_fast = torch.autograd.grad((fast * upstream).sum(), [h, z, *layer.parameters()], allow_unused=True)

    assert fast.shape == (3, 5, 7) and fast.dtype == torch.float64
    torch.testing.assert_close(fast, dense, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_fast, grads_dense):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_exact_numbers_of_a_tiny_case():
    # W = [W_h | W_z] with D=1, S=2 groups of K=2: y = h * w_h + W_z[:, index_0] + W_z[:, 2 + index_1]
    weight = torch.tensor([[10.0, 1.0, 2.0, 3.0, 4.0]], dtype=torch.float64, requires_grad=True)
    h = torch.tensor([[0.5]], dtype=torch.float64)
    index = torch.tensor([[1, 0]])
    out = onehot_linear(SplitFeat(h, None, index, 2), weight)
    assert out.item() == 10.0 * 0.5 + 2.0 + 3.0
    out.sum().backward()
    assert weight.grad.tolist() == [[0.5, 0.0, 1.0, 1.0, 0.0]]  # only the selected rows get gradient


def test_no_stoch_gradient_without_stoch_and_repeated_classes_accumulate():
    h, z, index = _features(lead=(40,), groups=2, classes=2)  # many samples share a class: index_add sums them
    layer = FeatLinear(6 + 4, 3, bias=False).double()
    feat = SplitFeat(h, None, index, 2)
    upstream = torch.randn(40, 3, dtype=torch.float64)
    (layer(feat) * upstream).sum().backward()
    grad_fast = layer.weight.grad.clone()
    layer.weight.grad = None
    (F.linear(feat.dense(), layer.weight) * upstream).sum().backward()
    torch.testing.assert_close(grad_fast, layer.weight.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(feat.dense()[..., 6:], z.flatten(-2))


def test_float32_and_bfloat16_autocast_match_dense():
    h, z, _ = _features(lead=(64,), deter=32, groups=8, classes=8, dtype=torch.float32)
    layer = FeatLinear(32 + 64, 16, bias=False)
    feat = SplitFeat.from_state(h, z)
    torch.testing.assert_close(layer(feat), layer(feat.dense()), rtol=1e-5, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, dense = layer(feat), layer(feat.dense())
    assert fast.dtype == dense.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), dense.float(), rtol=2e-2, atol=2e-2)


def test_width_mismatch_is_a_clear_error():
    h, z, _ = _features()
    with pytest.raises(ValueError, match="feat_dim"):
        FeatLinear(5, 2)(SplitFeat.from_state(h, z))


def test_split_feat_slicing_and_flatten_keep_parts_aligned():
    h, z, index = _features(lead=(4, 3))
    feat = SplitFeat.from_state(h, z)
    dense = feat.dense()
    torch.testing.assert_close(feat[1:].dense(), dense[1:])
    torch.testing.assert_close(feat.flatten(0, 1).dense(), dense.flatten(0, 1))
    assert feat[:-1].lead == (3, 3) and feat.dim == 6 + 12


@pytest.mark.parametrize("one_call, block", [(0, 7 * 3), (0, 1 << 20), (1 << 30, 1 << 20)])
def test_weight_gradient_paths_agree(monkeypatch, one_call, block):
    """The W_z gradient by one index_add (small batches) and by blocks of per-group index_adds (large ones)."""
    import reverie.models.kernels.onehot_linear as module

    monkeypatch.setattr(module, "_ONE_CALL_ELEMENTS", one_call)
    monkeypatch.setattr(module, "_BLOCK_ELEMENTS", block)  # 21: blocks of 7 rows (O = 3)
    h, z, index = _features(lead=(50,), groups=5, classes=4)
    layer = FeatLinear(6 + 20, 3, bias=False).double()
    upstream = torch.randn(50, 3, dtype=torch.float64)
    (layer(SplitFeat(h, None, index, 4)) * upstream).sum().backward()
    expected = upstream.t() @ torch.cat([h, z.flatten(-2)], -1)  # dense weight gradient: g^T @ x
    torch.testing.assert_close(layer.weight.grad, expected, rtol=1e-12, atol=1e-12)


def test_kernel_follows_weight_updates():
    h, z, index = _features(lead=(8,))
    layer = FeatLinear(6 + 12, 3, bias=False).double()
    feat = SplitFeat(h, None, index, 3)
    before = layer(feat)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an in-place update, as an optimiser step
    torch.testing.assert_close(layer(feat), 2.0 * before)
    layer.load_state_dict({"weight": torch.zeros_like(layer.weight)})
    assert layer(feat).abs().max().item() == 0.0


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_writes_through_data_reach_the_kernel(autocast):
    """``weight.data.mul_(0.5)`` (the target-network idiom; ``.data`` writes do not bump the version counter) and
    ``weight.data.copy_(...)``: the layer reads the weights as they are now, as the dense ``nn.Linear`` does (a
    cache keyed on the version read stale weights: output off by up to 0.18, issue 26). Each comparison in its own
    autocast region: autocast keeps its own cast of the dense weight for a whole region."""
    torch.manual_seed(0)
    h, z, index = _features(lead=(16,), dtype=torch.float32)
    layer = FeatLinear(6 + 12, 5)
    feat = SplitFeat(h, None, index, 3)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-6, atol=1e-6)  # bf16 rounding / float32 sum order

    def check():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            torch.testing.assert_close(layer(feat).float(), layer(feat.dense()).float(), **tol)

    check()  # a first call (what a cache would keep)
    layer.weight.data.mul_(0.5)
    check()
    layer.weight.data.copy_(torch.randn_like(layer.weight))
    check()


def test_one_hot_argmax_is_the_class_index():
    from reverie.models.kernels.onehot_linear import one_hot_argmax

    index = torch.randint(0, 32, (64, 32))
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(one_hot_argmax(F.one_hot(index, 32).to(dtype)), index)


def test_kernel_follows_fused_adam_steps():
    """The fused Adam kernel writes parameters without bumping their version; reverie's adam() bumps it, so the
    gather tables and autograd's saved-tensor checks see the new weights."""
    from reverie.agents.base import adam

    h, z, index = _features(lead=(8,), dtype=torch.float32)
    layer = FeatLinear(6 + 12, 3, bias=False)
    feat = SplitFeat(h, None, index, 3)
    opt = adam(layer.parameters(), lr=0.1, eps=1e-8)
    layer(feat).sum().backward()
    opt.step()
    torch.testing.assert_close(layer(feat), layer(feat.dense()))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the compute-dtype table follows too
        first = layer(feat)
        layer(feat).float().sum().backward()
        opt.step()
        torch.testing.assert_close(layer(feat).float(), layer(feat.dense()).float(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(first, layer(feat).bfloat16())
