"""The checks shared by the fused observe-scan kernels' tests (``tests/models/kernels/test_observe_scan.py`` for the
categorical RSSM, ``test_block_scan.py`` for the block-GRU RSSM): inputs with resets mid-sequence, one observe pass
whose loss reads every output, and the comparison of two passes (the readable loop's and the kernel's)."""

from __future__ import annotations

import torch


def scan_inputs(dtype: torch.dtype, action_dim: int, embed_dim: int = 10, T: int = 9, B: int = 4):
    """``embed (T, B, E)``, ``action (T, B, A)`` (both requiring grad) and ``is_first (T, B)``: every row starts at
    step 0, one row resets at step 4 and two at step 6."""
    torch.manual_seed(3)
    embed = torch.randn(T, B, embed_dim, dtype=dtype, requires_grad=True)
    action = torch.randn(T, B, action_dim, dtype=dtype, requires_grad=True)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[0] = True
    first[4, 1] = True  # one row mid-sequence
    first[6, :2] = True
    return embed, action, first


def run_observe(rssm, embed, action, first, state=None, autocast=False, passes=1, cast_embed=False):
    """Posterior values and the gradients of every parameter and input (``embed``, ``action``, ``state/<key>``) of a
    loss that reads every posterior output and the prior (which reads the posterior's deter). ``autocast``: under
    CPU bf16 autocast; ``cast_embed``: the embedding handed in as bf16 there (an encoder's output under autocast).
    ``passes``: backward passes on the retained graph."""
    rssm.zero_grad(set_to_none=True)
    for t in (embed, action, *(state or {}).values()):
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        torch.manual_seed(1)
        post, prior = rssm.observe(embed.bfloat16() if autocast and cast_embed else embed, action, first, state)
        torch.manual_seed(2)
        loss = sum((post[k].float() * torch.randn(post[k].shape)).sum() for k in post)
        loss = loss + prior["logits"].float().square().sum() + post["logits"].float().softmax(-1).square().sum()
    for i in range(passes):
        loss.backward(retain_graph=i + 1 < passes)
    grads = {n: p.grad for n, p in rssm.named_parameters()}
    grads |= {"embed": embed.grad, "action": action.grad}
    grads |= {f"state/{k}": v.grad for k, v in (state or {}).items()}
    return {k: v.detach() for k, v in post.items()}, grads


def compare(a, b, rtol: float) -> None:
    """Two :func:`run_observe` results: the same posterior keys, dtypes and values bit for bit (the same ops on the
    same values: the same draws), the same gradients present, each within ``rtol`` of its largest entry."""
    values_a, grads_a = a
    values_b, grads_b = b
    assert list(values_a) == list(values_b)
    for key in values_a:
        assert values_a[key].dtype == values_b[key].dtype, key
        assert torch.equal(values_a[key], values_b[key]), key
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert (grads_a[name] is None) == (grads_b[name] is None), name
        if grads_a[name] is not None:
            scale = grads_a[name].abs().max()
            assert float((grads_a[name] - grads_b[name]).abs().max()) <= rtol * float(scale) + 1e-12, name


def check_backward_twice(rssm, embed, action, first) -> None:
    """Two backward passes on a retained graph accumulate twice the gradients of one."""
    once = run_observe(rssm, embed, action, first)[1]
    twice = run_observe(rssm, embed, action, first, passes=2)[1]
    for name, grad in once.items():
        torch.testing.assert_close(twice[name], 2 * grad, rtol=1e-9, atol=1e-12, msg=name)
