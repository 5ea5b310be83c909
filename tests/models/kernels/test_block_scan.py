"""The block-GRU observe scan as one autograd node (reverie.models.kernels.block_scan) against the readable loop it
replaces (BlockRSSM with kernels="off"), and the construction check that refuses an RSSM the scan does not
reproduce."""

import pytest
import torch
from helpers.scan_checks import check_backward_twice, compare, run_observe, scan_inputs

from reverie.models.dynamics import BlockRSSM
from reverie.models.kernels import FusedBlockRSSM, install

T, B = 9, 4


def make(dtype=torch.float64, kernels="auto", **kwargs):
    torch.manual_seed(0)
    rssm = BlockRSSM(2, 10, **({"deter": 16, "hidden": 8, "stoch": 3, "classes": 4, "blocks": 4} | kwargs),
                     kernels=kernels)
    install(rssm, kernels)  # as an agent does after building its modules
    return rssm.to(dtype)


def inputs(dtype):
    return scan_inputs(dtype, action_dim=2, T=T, B=B)  # actions scaled into [-1, 1] by the RSSM


def test_block_scan_equals_the_loop_in_float64():
    """Values, draws and every gradient (all parameters, embeddings, actions through rows that reset mid-sequence),
    up to the order of float64 additions."""
    embed, action, first = inputs(torch.float64)
    loop = run_observe(make(kernels="off"), embed, action, first)
    fused = run_observe(make(), embed, action, first)
    assert all(g is not None and float(g.abs().max()) > 0 for n, g in loop[1].items() if not n.startswith("prior"))
    compare(loop, fused, rtol=1e-9)


def test_block_scan_from_a_given_state():
    """A state handed in (the replay context's stored latent) gets its gradient, as through the loop."""
    embed, action, _ = inputs(torch.float64)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[5, 2] = True
    torch.manual_seed(5)
    stoch = torch.nn.functional.one_hot(torch.randint(0, 4, (B, 3)), 4).double().requires_grad_()
    state = {"deter": torch.randn(B, 16, dtype=torch.float64, requires_grad=True), "stoch": stoch}
    loop = run_observe(make(kernels="off"), embed, action, first, state)
    fused = run_observe(make(), embed, action, first, state)
    assert float(loop[1]["state/deter"].abs().max()) > 0 and float(loop[1]["state/stoch"].abs().max()) > 0
    compare(loop, fused, rtol=1e-9)


def test_block_scan_in_float32_draws_and_values_are_the_loops():
    embed, action, first = inputs(torch.float32)
    compare(run_observe(make(torch.float32, kernels="off"), embed, action, first),
            run_observe(make(torch.float32), embed, action, first), rtol=1e-5)


def test_block_scan_in_bfloat16_autocast():
    embed, action, first = inputs(torch.float32)
    loop = run_observe(make(torch.float32, kernels="off"), embed, action, first, autocast=True)
    fused = run_observe(make(torch.float32), embed, action, first, autocast=True)
    assert fused[0]["deter"].dtype == torch.float32 and fused[0]["logits"].dtype == torch.bfloat16  # state float32
    compare(loop, fused, rtol=2e-2)  # bf16: sums rounded in another order (measured 6e-3)


def test_block_scan_backward_twice_on_a_retained_graph():
    check_backward_twice(make(), *inputs(torch.float64))


def test_the_scan_runs_where_it_applies_and_the_loop_elsewhere():
    """Sampled with autograd: one node; the mode or no autograd: the loop. Other depths than the official ones and
    ``kernels="off"`` stay the readable class."""
    embed, action, first = inputs(torch.float64)
    rssm = make()
    assert type(rssm) is FusedBlockRSSM
    assert type(rssm.observe(embed, action, first)[0]["deter"].grad_fn).__name__ == "_BlockObserveScanBackward"
    assert type(rssm.observe(embed, action, first, sample=False)[0]["deter"].grad_fn).__name__ != \
        "_BlockObserveScanBackward"
    with torch.no_grad():
        assert rssm.observe(embed, action, first)[0]["deter"].grad_fn is None
    for readable in (make(dynlayers=2), make(obslayers=2), make(kernels="off")):
        assert type(readable) is BlockRSSM
        assert type(readable.observe(embed, action, first)[0]["deter"].grad_fn).__name__ != \
            "_BlockObserveScanBackward"


def test_block_scan_frees_its_activations_and_checks_parameter_versions():
    """Saved through autograd: released by the backward pass, and a parameter changed in place before the backward
    pass raises autograd's error, as the loop does."""
    rssm = make()
    embed, action, first = inputs(torch.float64)
    post, _ = rssm.observe(embed, action, first)
    node = post["deter"].grad_fn
    post["deter"].sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        node.saved_tensors
    post, _ = rssm.observe(embed, action, first)
    with torch.no_grad():
        rssm.post_net.out.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        post["deter"].sum().backward()


def test_an_edited_gru_is_refused_with_kernels_and_runs_as_written_without(monkeypatch):
    """The scan reproduces BlockGRU.step as shipped. Edit it (here the update gate's offset, -1 -> 0) and an RSSM
    with kernels is refused at install, naming the fix; with kernels off the edit is what runs."""
    from reverie.models.dynamics.block import BlockGRU

    step = BlockGRU.step

    def edited(self, deter, stoch, action_x, shared_weight):
        return step(self, deter, stoch, action_x, shared_weight) * 0.5

    embed, action, first = inputs(torch.float32)
    shipped, _ = make(torch.float32, kernels="off").observe(embed, action, first, sample=False)
    monkeypatch.setattr(BlockGRU, "step", edited)
    with pytest.raises(ValueError, match=r"fused observe scan .* computes other \['deter'.*kernels=off"):
        make(torch.float32)
    refused = make(torch.float32, kernels="off")
    with pytest.raises(ValueError, match="kernels=off"):
        FusedBlockRSSM.adopt(refused)
    assert type(refused) is BlockRSSM  # the check's class swap is undone
    post, _ = make(torch.float32, kernels="off").observe(embed, action, first, sample=False)
    assert not torch.allclose(post["deter"], shipped["deter"])  # the edited step ran


def test_modules_the_scan_does_not_read_run_the_loop():
    from torch import nn

    from reverie.models.kernels.block_scan import scan_applies

    rssm = make(torch.float32, kernels="off")
    assert scan_applies(rssm)
    rssm.core.hidden[2] = nn.ReLU()
    assert not scan_applies(rssm)
