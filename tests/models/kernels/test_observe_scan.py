"""The observe scan as one autograd node (reverie.models.kernels.observe_scan) against the readable loop it replaces
(CategoricalRSSM with kernels="off"), and the construction check that refuses an RSSM the scan does not reproduce."""

import numpy as np
import pytest
import torch
from torch import nn
from helpers.scan_checks import check_backward_twice, compare, run_observe, scan_inputs

from reverie.models.dynamics import CategoricalRSSM
from reverie.models.kernels import FusedRSSM, install

T, B = 9, 4


def make(dtype=torch.float64, kernels="auto"):
    torch.manual_seed(0)
    rssm = CategoricalRSSM(3, 10, deter=16, stoch=4, classes=5, units=12)
    install(rssm, kernels)  # as an agent does after building its modules
    return rssm.to(dtype)


def inputs(dtype):
    return scan_inputs(dtype, action_dim=3, T=T, B=B)


def run(rssm, embed, action, first, state=None, autocast=False, passes=1):
    """:func:`run_observe`, the embedding handed in as bf16 under autocast (an encoder's output there)."""
    return run_observe(rssm, embed, action, first, state, autocast, passes, cast_embed=True)


def test_fused_scan_equals_the_per_op_loop_in_float64():
    """Values, draws and every gradient (parameters incl. the learned initial state through rows that reset
    mid-sequence, embeddings, actions), up to the order of float64 additions."""
    embed, action, first = inputs(torch.float64)
    per_op = run(make(kernels="off"), embed, action, first)
    assert float(per_op[1]["initial_deter"].abs().max()) > 0  # resets carry gradient to the initial state
    compare(per_op, run(make(), embed, action, first), rtol=1e-9)


def test_fused_scan_from_a_given_state_without_resets():
    """A state handed in (e.g. a previous chunk's last state) gets its gradient; the learned initial state, not
    reached, gets a zero gradient (not None: the optimiser still steps it, as with the per-op loop)."""
    embed, action, _ = inputs(torch.float64)
    first = torch.zeros(T, B, dtype=torch.bool)
    torch.manual_seed(5)
    stoch = torch.nn.functional.one_hot(torch.randint(0, 5, (B, 4)), 5).double().requires_grad_()
    state = {"deter": torch.randn(B, 16, dtype=torch.float64, requires_grad=True), "stoch": stoch}
    per_op = run(make(kernels="off"), embed, action, first, state)
    fused = run(make(), embed, action, first, state)
    compare(per_op, fused, rtol=1e-9)
    assert torch.equal(fused[1]["initial_deter"], torch.zeros(16, dtype=torch.float64))


def test_fused_scan_in_bfloat16_autocast():
    embed, action, first = inputs(torch.float32)
    per_op = run(make(torch.float32, kernels="off"), embed, action, first, autocast=True)
    fused = run(make(torch.float32), embed, action, first, autocast=True)
    assert fused[0]["deter"].dtype == torch.float32 and fused[0]["logits"].dtype == torch.bfloat16  # state as the cell
    compare(per_op, fused, rtol=2e-2)  # bf16: sums rounded in another order


def test_fused_scan_backward_twice_on_a_retained_graph():
    check_backward_twice(make(), *inputs(torch.float64))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("image", [False, True])
def test_dreamer_update_runs_the_fused_scan(monkeypatch, precision, image):
    """The speed path is the one the update takes, also with images (whose float32 conv embedding once kept the
    action projection in float32 under bf16 autocast, and the update on the per-op loop)."""
    import reverie.models.kernels.rssm as kernels_module
    from helpers.agents import dreamer
    from reverie.agents.dreamer import DreamerV3
    from reverie.types import ActionSpec

    calls = []
    scan = kernels_module.observe_scan
    monkeypatch.setattr(kernels_module, "observe_scan", lambda *a, **k: calls.append(1) or scan(*a, **k))
    torch.manual_seed(0)
    shapes = {"vector": (4,)} | ({"image": (3, 16, 16)} if image else {})
    agent = DreamerV3(shapes, ActionSpec(True, 2), **dreamer(deter=16, units=16, horizon=3, precision=precision,
                                                             cnn_depth=2))
    calls.clear()  # the construction check ran the scan once
    rng = np.random.default_rng(0)
    is_first = np.zeros((6, 3), bool)
    is_first[0] = True
    data = {"vector": rng.normal(size=(6, 3, 4)).astype(np.float32),
            "prev_action": np.eye(2, dtype=np.float32)[rng.integers(2, size=(6, 3))],
            "reward": rng.normal(size=(6, 3)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((6, 3), bool), "is_terminal": np.zeros((6, 3), bool)}
    if image:
        data["image"] = rng.integers(0, 256, (6, 3, 3, 16, 16), dtype=np.uint8)
    metrics = agent.update(data)
    assert calls == [1] and np.isfinite(metrics["loss/model"])


def test_fused_scan_frees_its_activations_and_checks_parameter_versions():
    """Saved through autograd: released by the backward pass (not held while the outputs live on), and a
    parameter changed in place before the backward pass raises autograd's error, as the per-op loop does."""
    rssm = make()
    embed, action, first = inputs(torch.float64)
    post, _ = rssm.observe(embed, action, first)
    node = post["deter"].grad_fn
    assert type(node).__name__ == "_ObserveScanBackward"
    post["deter"].sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        node.saved_tensors
    post, _ = rssm.observe(embed, action, first)
    with torch.no_grad():
        rssm.post_norm[0].weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        post["deter"].sum().backward()


def test_the_scan_runs_where_it_applies_and_the_loop_elsewhere():
    """Sampled with autograd in the compute dtype: one node; the mode or no autograd: the loop; ``kernels="off"``:
    the readable class."""
    embed, action, first = inputs(torch.float64)
    rssm = make()
    assert type(rssm) is FusedRSSM and type(make(kernels="off")) is CategoricalRSSM
    assert type(rssm.observe(embed, action, first)[0]["deter"].grad_fn).__name__ == "_ObserveScanBackward"
    assert type(rssm.observe(embed, action, first, sample=False)[0]["deter"].grad_fn).__name__ != \
        "_ObserveScanBackward"
    with torch.no_grad():
        assert rssm.observe(embed, action, first)[0]["deter"].grad_fn is None
    assert type(make(kernels="off").observe(embed, action, first)[0]["deter"].grad_fn).__name__ != \
        "_ObserveScanBackward"


def test_initial_state_gradient_in_float64():
    """The learned initial state's gradient is summed in its own dtype (float64 here), as the per-op loop does."""
    rssm = make()
    embed, action, _ = inputs(torch.float64)
    embed, action = (x[:1].detach().requires_grad_() for x in (embed, action))  # T = 1
    first = torch.ones(1, B, dtype=torch.bool)  # the reset is the only path to the initial state
    per_op = run(make(kernels="off"), embed, action, first)[1]["initial_deter"]
    fused = run(rssm, embed, action, first)[1]["initial_deter"]
    torch.testing.assert_close(fused, per_op, rtol=1e-12, atol=1e-14)


def test_an_edited_cell_is_refused_with_kernels_and_runs_as_written_without(monkeypatch):
    """The fused scan reproduces GRUCell's forward as shipped. Edit it (here the update gate's bias, -1 -> 0) and an
    RSSM built with kernels is refused at construction, naming the fix; with kernels off the edit is what runs."""
    from reverie.models.dynamics import GRUCell

    def edited(self, x, h):
        reset, cand, update = self.norm(self.linear(torch.cat([x, h], -1))).chunk(3, -1)
        return torch.lerp(h, torch.tanh(torch.sigmoid(reset) * cand), torch.sigmoid(update))  # was update - 1

    embed, action, first = inputs(torch.float32)
    shipped, _ = make(torch.float32, kernels="off").observe(embed, action, first, sample=False)
    monkeypatch.setattr(GRUCell, "forward", edited)
    with pytest.raises(ValueError,
                       match=r"does not reproduce this RSSM: two steps give a different deter.*kernels=off"):
        make(torch.float32)
    refused = make(torch.float32, kernels="off")
    with pytest.raises(ValueError, match="kernels=off"):
        FusedRSSM.adopt(refused)
    assert type(refused) is CategoricalRSSM and type(refused.in_z) is nn.Linear  # refused: left as it was
    post, _ = make(torch.float32, kernels="off").observe(embed, action, first, sample=False)
    assert not torch.allclose(post["deter"], shipped["deter"])  # the edited cell ran


def test_modules_the_scan_does_not_read_are_refused():
    from reverie.models.kernels.rssm import check_fused_scan

    rssm = make(torch.float32, kernels="off")
    check_fused_scan(rssm)  # the shipped modules pass
    rssm.in_norm = nn.Sequential(nn.LayerNorm(12, eps=1e-3), nn.ReLU())
    with pytest.raises(ValueError, match="in_norm/post_norm are not LayerNorm -> SiLU"):
        check_fused_scan(rssm)
