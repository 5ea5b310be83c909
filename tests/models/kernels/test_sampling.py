"""The class-index sampler of unimix categoricals (imagination's hot path), its one-hot twin, and their kernels
(reverie/models/kernels/sampling.py, straight_through.py) against the readable draws and straight-through graph."""

import pytest
import torch

from reverie.models.distributions import unimix_probs, unimix_sample, unimix_sample_index
from reverie.models.kernels.sampling import count_below


@pytest.mark.parametrize("fast", [False, True])
def test_index_and_one_hot_samplers_make_the_same_draw(fast):
    logits = torch.randn(64, 8, 5)
    torch.manual_seed(3)
    index = unimix_sample_index(logits, 0.01, fast=fast)
    torch.manual_seed(3)
    one_hot = unimix_sample(logits, 0.01, fast=fast)
    assert index.shape == (64, 8) and index.dtype == torch.int64
    assert torch.equal(one_hot.argmax(-1), index) and torch.equal(one_hot.sum(-1), torch.ones(64, 8))


@pytest.mark.parametrize("fast", [False, True])
def test_exact_classes_for_known_uniforms(monkeypatch, fast):
    """u < unimix: class floor(u / unimix * K); otherwise the inverse CDF of softmax at (u - unimix) / (1 - unimix)."""
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).expand(6, 4)
    u = torch.tensor([0.0, 0.0049, 0.0051, 0.0101, 0.01 + 0.99 * 0.35, 0.01 + 0.99 * 0.65])
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: u.reshape(shape))
    # below 0.01, the uniform part: floor(u / 0.01 * 4) = 0, 1 (1.96), 2 (2.04); above, CDF targets 0.0001, 0.35,
    # 0.65 against the cumulative 0.1, 0.3, 0.6, 1.0 -> classes 0, 2, 3
    assert unimix_sample_index(logits, 0.01, fast=fast).tolist() == [0, 1, 2, 0, 2, 3]


@pytest.mark.parametrize("unimix", [0.0, 0.01, 0.3])
def test_frequencies_follow_the_unimix_law(unimix):
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 0.0, -1.0, -8.0]).expand(200_000, 4)
    freq = torch.bincount(unimix_sample_index(logits, unimix), minlength=4).float() / 200_000
    torch.testing.assert_close(freq, unimix_probs(logits[0], unimix), atol=4e-3, rtol=0)


def test_bfloat16_logits_sample_from_their_float32_softmax():
    logits = torch.randn(16, 4, 7).bfloat16()
    torch.manual_seed(1)
    a = unimix_sample_index(logits, 0.01)
    torch.manual_seed(1)
    assert torch.equal(a, unimix_sample_index(logits.float(), 0.01))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_count_below_is_searchsorted(dtype):
    """The sign-bit count equals searchsorted's left insertion point, ties and out-of-range targets included."""
    torch.manual_seed(0)
    cdf = torch.softmax(torch.randn(300, 7, 32), -1).cumsum(-1).to(dtype)  # (300, 7, 32) nondecreasing
    cdf[0, 0, 3:10] = cdf[0, 0, 3]  # a run of equal entries
    target = torch.rand(300, 7, 1).to(dtype)
    target[0, 0] = cdf[0, 0, 5]  # equal to the run: not below
    target[1, 0], target[1, 1], target[1, 2] = -1.0, 0.0, 2.0  # below everything, zero, above everything
    target[2, 0] = cdf[2, 0, 0]  # equal to the first entry: count 0
    expected = torch.searchsorted(cdf, target)
    assert torch.equal(count_below(cdf, target).long(), expected)
    assert expected[0, 0].item() == 3 and expected[1, 2].item() == 32 and expected[2, 0].item() == 0


def test_count_below_rejects_integer_input():
    with pytest.raises(TypeError, match="count_below needs float"):
        count_below(torch.arange(4), torch.tensor([2]))


def test_count_below_overwrite_gives_the_same_counts_in_place():
    torch.manual_seed(0)
    cdf = torch.softmax(torch.randn(50, 16), -1).cumsum(-1)
    target = torch.rand(50, 1)
    expected = torch.searchsorted(cdf, target)
    buffer = cdf.clone()
    assert torch.equal(count_below(buffer, target, overwrite=True).long(), expected)
    assert not torch.equal(buffer, cdf)  # overwritten: the work was done in its memory
    with pytest.raises(TypeError, match="one dtype with overwrite"):
        count_below(cdf.double(), target, overwrite=True)


@pytest.mark.parametrize("unimix", [0.0, 0.01])
def test_kernel_and_readable_samplers_give_the_same_draws_and_gradients(unimix):
    """fast=True (sign-bit search, one straight-through node) against fast=False (searchsorted, ``one_hot + probs
    - sg(probs)`` under autograd): the same one-hot draws, the same gradient (float64)."""
    torch.manual_seed(0)
    logits = torch.randn(64, 8, 5, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(64, 8, 5, dtype=torch.float64)
    out = []
    for fast in (True, False):
        torch.manual_seed(3)
        sample = unimix_sample(logits, unimix, fast=fast)
        (grad,) = torch.autograd.grad((sample * weights).sum(), logits)
        out.append((sample.detach(), grad))
    assert out[0][0].dtype == torch.float64 and torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-12, atol=1e-14)
