"""The unimix categorical sampler the scans draw with (reverie.models.distributions.unimix_index / unimix_sample):
its law, and the straight-through gradient the fused scans write out (reverie/models/kernels/straight_through.py)."""

import pytest
import torch

from reverie.models.distributions import unimix_index, unimix_probs, unimix_sample
from reverie.models.kernels.straight_through import straight_through_grad


def test_index_and_one_hot_samplers_make_the_same_draw():
    logits = torch.randn(64, 8, 5)
    torch.manual_seed(3)
    index = unimix_index(torch.softmax(logits, -1), 0.01)
    torch.manual_seed(3)
    one_hot = unimix_sample(logits, 0.01)
    assert index.shape == (64, 8) and index.dtype == torch.int64
    assert torch.equal(one_hot.argmax(-1), index) and torch.equal(one_hot.sum(-1), torch.ones(64, 8))


def test_exact_classes_for_known_uniforms(monkeypatch):
    """u < unimix: class floor(u / unimix * K); otherwise the inverse CDF of softmax at (u - unimix) / (1 - unimix)."""
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).expand(6, 4)
    u = torch.tensor([0.0, 0.0049, 0.0051, 0.0101, 0.01 + 0.99 * 0.35, 0.01 + 0.99 * 0.65])
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: u.reshape(shape))
    # below 0.01, the uniform part: floor(u / 0.01 * 4) = 0, 1 (1.96), 2 (2.04); above, CDF targets 0.0001, 0.35,
    # 0.65 against the cumulative 0.1, 0.3, 0.6, 1.0 -> classes 0, 2, 3
    assert unimix_index(torch.softmax(logits, -1), 0.01).tolist() == [0, 1, 2, 0, 2, 3]
    assert unimix_sample(logits, 0.01).argmax(-1).tolist() == [0, 1, 2, 0, 2, 3]


@pytest.mark.parametrize("unimix", [0.0, 0.01, 0.3])
def test_frequencies_follow_the_unimix_law(unimix):
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 0.0, -1.0, -8.0]).expand(200_000, 4)
    freq = torch.bincount(unimix_sample(logits, unimix).argmax(-1), minlength=4).float() / 200_000
    torch.testing.assert_close(freq, unimix_probs(logits[0], unimix), atol=4e-3, rtol=0)


def test_bfloat16_logits_sample_from_their_float32_softmax():
    logits = torch.randn(16, 4, 7).bfloat16()
    torch.manual_seed(1)
    a = unimix_sample(logits, 0.01)
    torch.manual_seed(1)
    b = unimix_sample(logits.float(), 0.01)
    assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("unimix", [0.0, 0.01])
def test_straight_through_grad_is_autograds_gradient_of_the_sample(unimix):
    """The scans' written-out logits gradient equals autograd's through ``one_hot + probs - sg(probs)`` (float64)."""
    torch.manual_seed(0)
    logits = torch.randn(64, 8, 5, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(64, 8, 5, dtype=torch.float64)
    sample = unimix_sample(logits, unimix)
    (grad,) = torch.autograd.grad((sample * weights).sum(), logits)
    assert float(grad.abs().max()) > 0
    written = straight_through_grad(weights, torch.softmax(logits.detach(), -1), unimix)
    torch.testing.assert_close(written, grad, rtol=1e-12, atol=1e-14)
