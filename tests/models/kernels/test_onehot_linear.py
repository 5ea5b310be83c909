"""The one-hot layer (reverie.models.kernels.onehot_linear): the row-gather product equals dense ``F.linear``
(forward, input and weight gradients), :class:`OneHotFeatures` keeps its class index only where it stays true, and
:class:`OneHotLinear` gathers only where it applies."""

import copy

import pytest
import torch
import torch.nn.functional as F

import reverie.models.kernels.onehot_linear as module
from reverie.models.dynamics import CategoricalRSSM
from reverie.models.kernels.onehot_linear import (GATHER_MIN_ROWS, OneHotFeatures, OneHotLinear, one_hot_argmax,
                                                  onehot_linear)
from reverie.models.kernels.rssm import FusedRSSM


def _features(lead=(3, 5), deter=6, groups=4, classes=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, deter, dtype=dtype, generator=g)
    index = torch.randint(0, classes, (*lead, groups), generator=g)
    z = F.one_hot(index, classes).to(dtype)
    return h, z, index


def _onehot(h, z, index):
    """``cat(h, flat z)`` as :class:`OneHotFeatures` (``h`` None: the one-hot alone)."""
    parts = [z.flatten(-2)] if h is None else [h, z.flatten(-2)]
    return OneHotFeatures.of(torch.cat(parts, -1), 0 if h is None else h.shape[-1], index.shape[-1])


@pytest.fixture
def gathers(monkeypatch):
    """The calls :class:`OneHotLinear` makes to :func:`onehot_linear` (its gather path)."""
    calls = []
    monkeypatch.setattr(module, "onehot_linear", lambda *a, **k: calls.append(1) or onehot_linear(*a, **k))
    return calls


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_deter", [True, False])
@pytest.mark.parametrize("through", ["function", "layer"])
def test_forward_and_gradients_equal_dense_linear(gathers, bias, with_deter, through):
    lead = (16, 20)  # 320 rows: the layer gathers
    h, z, index = _features(lead=lead)
    h.requires_grad_(True)
    z.requires_grad_(True)
    in_dim = (h.shape[-1] if with_deter else 0) + z.shape[-2] * z.shape[-1]
    layer = OneHotLinear(in_dim, 7, bias=bias).double()
    dense_in = torch.cat([h, z.flatten(-2)], -1) if with_deter else z.flatten(-2)
    upstream = torch.randn(*lead, 7, dtype=torch.float64)
    inputs = [h, z, *layer.parameters()]

    dense = F.linear(dense_in, layer.weight, layer.bias)
    grads_dense = torch.autograd.grad((dense * upstream).sum(), inputs, allow_unused=True)
    if through == "function":
        fast = onehot_linear(h if with_deter else None, z, index, layer.weight, layer.bias)
    else:
        fast = layer(_onehot(h if with_deter else None, z, index))
        assert gathers == [1]
    grads_fast = torch.autograd.grad((fast * upstream).sum(), inputs, allow_unused=True)

    assert fast.shape == (*lead, 7) and fast.dtype == torch.float64 and type(fast) is torch.Tensor
    torch.testing.assert_close(fast, dense, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_fast, grads_dense, strict=True):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_exact_numbers_of_a_tiny_case():
    # W = [W_h | W_z] with D=1, S=2 groups of K=2: y = h * w_h + W_z[:, index_0] + W_z[:, 2 + index_1]
    weight = torch.tensor([[10.0, 1.0, 2.0, 3.0, 4.0]], dtype=torch.float64, requires_grad=True)
    h = torch.tensor([[0.5]], dtype=torch.float64)
    index = torch.tensor([[1, 0]])
    out = onehot_linear(h, F.one_hot(index, 2).double(), index, weight)
    assert out.item() == 10.0 * 0.5 + 2.0 + 3.0
    out.sum().backward()
    assert weight.grad.tolist() == [[0.5, 0.0, 1.0, 1.0, 0.0]]  # only the selected rows get gradient


def test_repeated_classes_accumulate_their_weight_gradient():
    h, z, index = _features(lead=(40,), groups=2, classes=2)  # many rows share a class: index_add sums them
    weight = torch.randn(3, 6 + 4, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(40, 3, dtype=torch.float64)
    (onehot_linear(h, z, index, weight) * upstream).sum().backward()
    expected = upstream.t() @ torch.cat([h, z.flatten(-2)], -1)  # dense weight gradient: g^T @ x
    torch.testing.assert_close(weight.grad, expected, rtol=1e-12, atol=1e-12)


def test_float32_gathers_and_bfloat16_autocast_runs_the_dense_product(gathers):
    """The layer gathers in float32; under bf16 autocast it runs the dense product (bit for bit ``nn.Linear``'s);
    the function itself gathers in bf16 too, within bf16 rounding of the dense product."""
    h, z, index = _features(lead=(300,), deter=32, groups=8, classes=8, dtype=torch.float32)
    layer = OneHotLinear(32 + 64, 16, bias=False)
    feat = _onehot(h, z, index)
    dense_in = feat.as_subclass(torch.Tensor)
    torch.testing.assert_close(layer(feat), layer(dense_in), rtol=1e-5, atol=1e-5)
    assert gathers == [1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, dense = layer(feat), layer(dense_in)
        function = onehot_linear(h, z, index, layer.weight)
    assert fast.dtype == dense.dtype == function.dtype == torch.bfloat16 and gathers == [1]  # the layer: dense
    assert torch.equal(fast, dense)
    torch.testing.assert_close(function.float(), dense.float(), rtol=2e-2, atol=2e-2)


def test_width_mismatch_is_a_clear_error():
    h, z, index = _features(lead=(GATHER_MIN_ROWS,))
    with pytest.raises(ValueError, match="feat_dim"):
        OneHotLinear(5, 2)(_onehot(h, z, index))
    with pytest.raises(ValueError, match="feat_dim"):
        onehot_linear(h, z, index, torch.zeros(2, 5))


def test_below_the_threshold_the_dense_product_runs(gathers):
    layer = OneHotLinear(6 + 12, 3).double()
    for rows, calls in ((GATHER_MIN_ROWS - 1, []), (GATHER_MIN_ROWS, [1])):
        feat = _onehot(*_features(lead=(rows,)))
        out = layer(feat)
        assert gathers == calls and type(out) is torch.Tensor
        torch.testing.assert_close(out, F.linear(feat.as_subclass(torch.Tensor), layer.weight, layer.bias))


def test_features_keep_their_index_through_leading_dimension_ops():
    h, z, index = _features(lead=(4, 3))
    feat = _onehot(h, z, index)
    dense = feat.as_subclass(torch.Tensor)
    assert (feat.width, feat.groups) == (6, 4)
    known = OneHotFeatures.of(dense, 6, 4, index)  # a given index is indexed alike (here: not recomputed)
    assert torch.equal(known[1:].flatten(0, 1).detach()[[0, 2]].parts()[2], index[1:].flatten(0, 1)[[0, 2]])
    kept = {"[1:]": (feat[1:], dense[1:], index[1:]), "[2]": (feat[2], dense[2], index[2]),
            "[:, 0]": (feat[:, 0], dense[:, 0], index[:, 0]),
            "flatten(0, 1)": (feat.flatten(0, 1), dense.flatten(0, 1), index.flatten(0, 1)),
            "flatten(end_dim=1)": (feat.flatten(end_dim=1), dense.flatten(0, 1), index.flatten(0, 1)),
            "[mask]": (feat[index[..., 0] > 0], dense[index[..., 0] > 0], index[index[..., 0] > 0]),
            "detach": (feat.detach(), dense, index), "to(float32)": (feat.to(torch.float32), dense.float(), index)}
    for name, (out, values, idx) in kept.items():
        assert type(out) is OneHotFeatures, name
        assert out.width == 6, name
        torch.testing.assert_close(out.as_subclass(torch.Tensor), values, rtol=0, atol=0, msg=name)
        deter, stoch, split_index = out.parts()
        assert torch.equal(deter, values[..., :6]) and torch.equal(stoch, values[..., 6:].unflatten(-1, (4, 3)))
        assert torch.equal(split_index, idx) and torch.equal(one_hot_argmax(stoch), idx), name


def test_other_ops_give_plain_tensors():
    feat = _onehot(*_features(lead=(4, 3)))
    dense = feat.as_subclass(torch.Tensor)
    plain = {"feat - 1.0": (feat - 1.0, dense - 1.0), "feat * 2": (feat * 2, dense * 2),
             "[..., 1:]": (feat[..., 1:], dense[..., 1:]), "[:, :, :5]": (feat[:, :, :5], dense[:, :, :5]),
             "flatten()": (feat.flatten(), dense.flatten()), "sum(-1)": (feat.sum(-1), dense.sum(-1)),
             "cat": (torch.cat([feat, feat]), torch.cat([dense, dense])), "to(int64)": (feat.long(), dense.long())}
    for name, (out, expected) in plain.items():
        assert type(out) is torch.Tensor, name
        assert torch.equal(out, expected), name


@pytest.mark.parametrize("write", ["feature", "source"])
def test_an_in_place_write_drops_the_index_and_the_layer_computes_densely(gathers, write):
    """After a write (to the features or the tensor they were made from) the index may be stale: ``split()`` is
    None and the layer's dense product reads the written values."""
    h, z, index = _features(lead=(GATHER_MIN_ROWS,))
    dense = torch.cat([h, z.flatten(-2)], -1)
    feat = OneHotFeatures.of(dense, 6, index.shape[-1])
    layer = OneHotLinear(6 + 12, 3).double()
    assert feat.parts() is not None
    before = layer(feat)
    if write == "feature":
        feat[:, -1] = 0.5
    else:
        dense[:, 6:9] = 0.25
    assert feat.parts() is None and gathers == [1]
    after = layer(feat)
    assert gathers == [1] and type(after) is torch.Tensor
    torch.testing.assert_close(after, F.linear(dense, layer.weight, layer.bias), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(after, before)


@pytest.mark.parametrize("one_call, block", [(0, 7 * 3), (0, 1 << 20), (1 << 30, 1 << 20)])
def test_weight_gradient_paths_agree(monkeypatch, one_call, block):
    """The W_z gradient by one index_add (small batches) and by blocks of per-group index_adds (large ones)."""
    monkeypatch.setattr(module, "_ONE_CALL_ELEMENTS", one_call)
    monkeypatch.setattr(module, "_BLOCK_ELEMENTS", block)  # 21: blocks of 7 rows (O = 3)
    h, z, index = _features(lead=(50,), groups=5, classes=4)
    weight = torch.randn(3, 6 + 20, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(50, 3, dtype=torch.float64)
    (onehot_linear(h, z, index, weight) * upstream).sum().backward()
    expected = upstream.t() @ torch.cat([h, z.flatten(-2)], -1)  # dense weight gradient: g^T @ x
    torch.testing.assert_close(weight.grad, expected, rtol=1e-12, atol=1e-12)


def test_the_layer_follows_weight_updates(gathers):
    feat = _onehot(*_features(lead=(GATHER_MIN_ROWS,)))
    layer = OneHotLinear(6 + 12, 3, bias=False).double()
    before = layer(feat)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an in-place update, as an optimiser step
    torch.testing.assert_close(layer(feat), 2.0 * before)
    layer.load_state_dict({"weight": torch.zeros_like(layer.weight)})
    assert layer(feat).abs().max().item() == 0.0 and gathers == [1, 1, 1]


@pytest.mark.parametrize("autocast", [False])
def test_writes_through_data_reach_the_layer(gathers, autocast):
    """``weight.data.mul_(0.5)`` (the target-network idiom; ``.data`` writes do not bump the version counter) and
    ``weight.data.copy_(...)``: the layer reads the weights as they are now, as the dense ``nn.Linear`` does (issue
    26). Each comparison in its own autocast region: autocast caches its cast of the dense weight per region."""
    torch.manual_seed(0)
    feat = _onehot(*_features(lead=(GATHER_MIN_ROWS,), dtype=torch.float32))
    layer = OneHotLinear(6 + 12, 5)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-6, atol=1e-6)  # bf16 rounding / float32 sum order

    def check():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            torch.testing.assert_close(layer(feat).float(), layer(feat.as_subclass(torch.Tensor)).float(), **tol)

    check()  # a first call (what a cache would keep)
    layer.weight.data.mul_(0.5)
    check()
    layer.weight.data.copy_(torch.randn_like(layer.weight))
    check()
    assert len(gathers) == 3


def test_one_hot_argmax_is_the_class_index():
    index = torch.randint(0, 32, (64, 32))
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(one_hot_argmax(F.one_hot(index, 32).to(dtype)), index)


def test_the_layer_follows_fused_adam_steps(gathers):
    """The fused Adam kernel writes parameters without bumping their version; reverie's adam() bumps it, so the
    gathers and autograd's saved-tensor checks see the new weights."""
    from reverie.agents.base import adam

    feat = _onehot(*_features(lead=(GATHER_MIN_ROWS,), dtype=torch.float32))
    dense = feat.as_subclass(torch.Tensor)
    layer = OneHotLinear(6 + 12, 3, bias=False)
    opt = adam(layer.parameters(), lr=0.1, eps=1e-8)
    layer(feat).sum().backward()
    opt.step()
    torch.testing.assert_close(layer(feat), layer(dense))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the compute-dtype gather table follows too
        first = layer(feat)
        layer(feat).float().sum().backward()
        opt.step()
        torch.testing.assert_close(layer(feat).float(), layer(dense).float(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(first, layer(feat).bfloat16()) and gathers


def test_fused_rssm_reads_features_and_its_input_by_index(gathers):
    """:class:`FusedRSSM`: ``features()`` is the readable ``cat`` with the class index beside it, and ``img_step`` on
    enough rows (its input layer gathering) gives the readable step's values, draws and gradients (float64)."""
    torch.manual_seed(0)
    readable = CategoricalRSSM(3, 10, deter=16, stoch=4, classes=5, units=12).double()
    fused = FusedRSSM.adopt(copy.deepcopy(readable))
    assert type(fused) is FusedRSSM and type(fused.in_z) is OneHotLinear and type(readable.in_z) is torch.nn.Linear
    rows = GATHER_MIN_ROWS + 44
    index = torch.randint(0, 5, (rows, 4))
    state = {"deter": torch.randn(rows, 16, dtype=torch.float64), "stoch": F.one_hot(index, 5).double()}
    feat = fused.features(state)
    assert type(feat) is OneHotFeatures and torch.equal(feat.parts()[2], index)
    assert torch.equal(feat.as_subclass(torch.Tensor), readable.features(state))
    action = torch.randn(rows, 3, dtype=torch.float64)
    out = []
    for rssm in (readable, fused):
        torch.manual_seed(1)
        step = rssm.img_step(state, action)
        loss = sum((v.double() * torch.randn(v.shape, dtype=torch.float64)).sum() for v in step.values())
        names, params = zip(*rssm.named_parameters())
        grads = torch.autograd.grad(loss, params, allow_unused=True)  # img_step: no posterior
        out.append(({k: v.detach() for k, v in step.items()}, dict(zip(names, grads))))
    assert gathers, "the fused input layer did not gather"
    for key in out[0][0]:
        torch.testing.assert_close(out[1][0][key], out[0][0][key], rtol=1e-12, atol=1e-12, msg=key)
    assert float(out[0][1]["in_z.weight"].abs().max()) > 0
    assert out[1][1].keys() == out[0][1].keys()
    for name, b in out[0][1].items():
        a = out[1][1][name]
        assert (a is None) == (b is None), name
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_tensor_methods_copies_and_masks_behave_as_on_a_plain_tensor():
    """``Tensor.split`` still splits, a deep copy and a pickle give plain tensors, and a boolean mask over every
    dimension gives a plain tensor even when it picks as many entries as the last dimension has."""
    import copy
    import pickle

    h, z, index = _features(lead=(4, 3))
    feat = _onehot(h, z, index)
    dense = feat.as_subclass(torch.Tensor)
    assert [torch.equal(a, b) for a, b in zip(feat.split([6, 12], -1), dense.split([6, 12], -1))] == [True, True]
    for copied in (copy.deepcopy(feat), pickle.loads(pickle.dumps(feat))):
        assert type(copied) is torch.Tensor and torch.equal(copied, dense)
    mask = torch.zeros(feat.shape, dtype=torch.bool)
    mask[0, 0, :18] = True  # 18 entries: the last dimension's size
    picked = feat[mask]
    assert type(picked) is torch.Tensor and torch.equal(picked, dense[mask])


def test_inference_tensors_are_read_densely(gathers):
    """Inference tensors count no in-place writes, so the layer cannot know the mark still holds: dense product."""
    layer = OneHotLinear(6 + 12, 3).double()
    with torch.inference_mode():
        feat = _onehot(*_features(lead=(GATHER_MIN_ROWS,)))
        feat.mul_(0.5)  # no longer one-hot
        out = layer(feat)
        expected = F.linear(feat.as_subclass(torch.Tensor), layer.weight, layer.bias)
    assert feat.parts() is None and gathers == []
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("lead", [(5, 300), (300,)])
def test_one_hot_argmax_reads_the_columns_of_a_wider_tensor(lead):
    """The index of the one-hot columns of ``cat(deter, one-hot)`` without copying them (a strided view)."""
    h, z, index = _features(lead=lead, deter=6, groups=4, classes=3, dtype=torch.float32)
    wide = torch.cat([h, z.flatten(-2)], -1)[..., 6:].unflatten(-1, (4, 3))
    assert not wide.is_contiguous() and torch.equal(one_hot_argmax(wide), index)


@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float32])
def test_fused_imagine_writes_one_buffer_in_the_compute_dtype_with_the_readable_values(precision):
    """:meth:`FusedRSSM.imagine` without autograd under autocast: the states are views of one buffer in the compute
    dtype (bf16: no float32 buffer for the heads to cast again), equal to the readable rollout's states cast to it,
    with the same actions (the recurrence keeps ``deter`` in float32, so every draw is the same)."""
    torch.manual_seed(0)
    readable = CategoricalRSSM(2, 10, deter=16, stoch=4, classes=5, units=12)
    fused = FusedRSSM.adopt(copy.deepcopy(readable))
    actor = torch.nn.Linear(16 + 4 * 5, 2)
    rows = GATHER_MIN_ROWS + 44
    start = {"deter": torch.randn(rows, 16), "stoch": F.one_hot(torch.randint(0, 5, (rows, 4)), 5).float()}
    out = {}
    for name, rssm in (("readable", readable), ("fused", fused)):
        def policy(state, rssm=rssm):
            logits = actor(rssm.features(state).to(precision).as_subclass(torch.Tensor)).float()
            return F.one_hot(logits.argmax(-1), 2).float()
        torch.manual_seed(1)
        with torch.no_grad(), torch.autocast("cpu", dtype=precision, enabled=precision != torch.float32):
            states, actions = rssm.imagine(policy, start, 6)
        out[name] = (states, actions)
    (states, actions), (ref, ref_actions) = out["fused"], out["readable"]
    assert states["deter"].dtype == states["stoch"].dtype == precision
    assert states["deter"].untyped_storage().data_ptr() == states["stoch"].untyped_storage().data_ptr()  # one buffer
    assert ref["deter"].dtype == torch.float32  # the readable recurrence's own state
    for key in ("deter", "stoch"):
        assert torch.equal(states[key], ref[key].to(precision)), key
    assert torch.equal(actions, ref_actions) and 0 < float(actions[..., 0].mean()) < 1
