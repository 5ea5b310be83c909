import math

import pytest
import torch

from reverie.models.distributions import (Bernoulli, BoundedNormal, SymlogMSE, TwoHotSymlog, UnimixCategorical,
                                          symexp, symlog, symlog_bins, two_hot)


def test_symlog_exact_values_and_inverse():
    x = torch.tensor([0.0, math.e - 1.0, -(math.e - 1.0), 1e6, -3.5], dtype=torch.float64)
    y = symlog(x)
    assert y[0] == 0.0
    assert y[1].item() == pytest.approx(1.0, abs=1e-12)
    assert y[2].item() == pytest.approx(-1.0, abs=1e-12)
    torch.testing.assert_close(symexp(y), x, rtol=1e-12, atol=1e-12)


def test_bins_are_exactly_symmetric():
    bins = symlog_bins(255)
    assert bins.shape == (255,)
    assert bins[0] == -20.0 and bins[-1] == 20.0 and bins[127] == 0.0
    assert torch.equal(bins, -bins.flip(0))


def test_two_hot_exact_weights():
    bins = torch.tensor([-1.0, 0.0, 1.0, 2.0])
    out = two_hot(torch.tensor([0.25, -5.0, 7.0, 1.0]), bins)
    expected = torch.tensor([[0.0, 0.75, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    torch.testing.assert_close(out, expected)
    inside = torch.tensor([-0.6, 0.0, 0.3, 1.9])
    torch.testing.assert_close((two_hot(inside, bins) * bins).sum(-1), inside)


def test_two_hot_symlog_zero_logits_give_exact_zero_and_uniform_log_prob():
    dist = TwoHotSymlog(torch.zeros(3, 5, 255))
    assert dist.mean.shape == (3, 5)
    assert torch.all(dist.mean == 0.0)  # exact, not approximately
    lp = dist.log_prob(torch.full((3, 5), 12.0))
    torch.testing.assert_close(lp, torch.full((3, 5), -math.log(255.0)))


def test_two_hot_symlog_mean_recovers_a_bin_value():
    bins = symlog_bins(255)
    logits = torch.full((255,), -1e4)
    logits[200] = 0.0
    assert TwoHotSymlog(logits).mean.item() == pytest.approx(symexp(bins[200]).item(), rel=1e-5)


def test_unimix_probabilities_exact():
    logits = torch.log(torch.tensor([0.25, 0.75]))
    probs = UnimixCategorical(logits, unimix=0.01).probs
    torch.testing.assert_close(probs, torch.tensor([0.99 * 0.25 + 0.005, 0.99 * 0.75 + 0.005]))


def test_unimix_straight_through_gradient_equals_probs_gradient():
    torch.manual_seed(0)
    logits = torch.randn(6, 4, requires_grad=True)
    weights = torch.randn(6, 4)
    dist = UnimixCategorical(logits, unimix=0.01)
    sample = dist.rsample()
    assert torch.all(sample.detach().sum(-1) == 1.0) and set(sample.detach().unique().tolist()) <= {0.0, 1.0}
    (g_sample,) = torch.autograd.grad((sample * weights).sum(), logits)
    (g_probs,) = torch.autograd.grad((UnimixCategorical(logits, 0.01).probs * weights).sum(), logits)
    torch.testing.assert_close(g_sample, g_probs)


def test_unimix_sample_frequencies_match_probs():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(200_000, 3)
    freq = UnimixCategorical(logits, unimix=0.0).sample().mean(0)
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.7]), atol=5e-3, rtol=0)


def test_bounded_normal_std_range_and_mode():
    mean_raw = torch.tensor([[0.5, -2.0]])
    low = BoundedNormal(mean_raw, torch.full((1, 2), -1e4))
    high = BoundedNormal(mean_raw, torch.full((1, 2), 1e4))
    torch.testing.assert_close(low.base_dist.stddev, torch.full((1, 2), 0.1))
    torch.testing.assert_close(high.base_dist.stddev, torch.full((1, 2), 1.0))
    torch.testing.assert_close(low.mode, torch.tanh(mean_raw))
    assert low.log_prob(torch.zeros(1, 2)).shape == (1,)  # independent over A


def test_symlog_mse_and_bernoulli():
    dist = SymlogMSE(torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(dist.log_prob(torch.tensor([[math.e - 1.0, 0.0]])), torch.tensor([-1.0]))
    torch.testing.assert_close(dist.mode, torch.tensor([[math.e - 1.0, -(math.e - 1.0)]]))
    cont = Bernoulli(torch.tensor([2.0, -2.0]))
    assert cont.mode.tolist() == [1.0, 0.0]


def test_two_hot_log_prob_equals_dense_two_hot_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 255)
    value = torch.tensor([0.0, 0.3, -2.5, 1e3]).expand(3, 4) * torch.tensor([[1.0], [-1.0], [7.0]])
    dist = TwoHotSymlog(logits)
    dense = (two_hot(symlog(value), dist.bins) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(dist.log_prob(value), dense)
    torch.testing.assert_close(dist.mean, symexp((torch.softmax(logits, -1) * dist.bins).sum(-1)))


@pytest.mark.parametrize("shape", [(7,), (3, 4)])
def test_two_hot_log_prob_gradient_equals_the_dense_cross_entropy_gradient(shape):
    """The gather of two bins gives autograd's gradient of the dense two-hot cross-entropy, for one target and for a
    weighted mix of two (the critic loss)."""
    torch.manual_seed(0)
    logits = torch.randn(*shape, 255, dtype=torch.float64, requires_grad=True)
    ret, slow = torch.randn(*shape) * 30, torch.randn(*shape)
    upstream = torch.randn(*shape, dtype=torch.float64)
    mixed = TwoHotSymlog(logits).log_prob_mix([ret, slow], [1.0, 0.7])
    (grad,) = torch.autograd.grad((mixed * upstream).sum(), logits)
    dense_logits = logits.detach().clone().requires_grad_(True)
    bins = symlog_bins(255).double()
    logp = torch.log_softmax(dense_logits, -1)
    target = two_hot(symlog(ret.double()), bins) + 0.7 * two_hot(symlog(slow.double()), bins)
    dense = (target * logp).sum(-1)
    (expected,) = torch.autograd.grad((dense * upstream).sum(), dense_logits)
    assert mixed.dtype == torch.float64  # float64 logits: float64 throughout
    torch.testing.assert_close(mixed, dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    single = TwoHotSymlog(logits.detach()).log_prob(ret)
    torch.testing.assert_close(single.double(), (two_hot(symlog(ret.double()), bins) * logp.detach()).sum(-1),
                               rtol=1e-6, atol=1e-6)


def test_two_hot_reads_bfloat16_logits_and_returns_their_gradient_dtype():
    logits = torch.randn(5, 255).bfloat16().requires_grad_(True)
    dist = TwoHotSymlog(logits)
    assert dist.mean.dtype == torch.float32
    torch.testing.assert_close(dist.mean, TwoHotSymlog(logits.detach().float()).mean)
    dist.log_prob(torch.tensor([0.0, 1.0, -5.0, 100.0, 3.0])).sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()


def test_two_hot_mean_without_autograd_in_chunks_equals_the_whole(monkeypatch):
    """Without autograd, large logits take the mean chunk by chunk (cache-sized temporaries): the same values."""
    import reverie.models.distributions as module

    torch.manual_seed(0)
    logits = torch.randn(3, 50, 255).bfloat16()
    expected = module.symexp((torch.softmax(logits.float(), -1) * symlog_bins(255)).sum(-1))
    whole = TwoHotSymlog(logits).mean  # 150 rows: one chunk at the default size
    monkeypatch.setattr(module, "_MEAN_CHUNK_ELEMENTS", 255 * 7)  # chunks of 7 rows, the last one short
    chunked = TwoHotSymlog(logits).mean
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked, expected, rtol=1e-5, atol=1e-5)
    assert TwoHotSymlog(torch.zeros(3, 50, 255)).mean.abs().max().item() == 0.0  # still exactly 0 at 0 logits
    grad_logits = logits.float().requires_grad_(True)
    mean = TwoHotSymlog(grad_logits).mean  # with autograd: the differentiable whole-tensor path
    assert mean.requires_grad
    torch.testing.assert_close(mean.detach(), whole, rtol=1e-6, atol=1e-6)


def test_two_hot_given_probs_give_the_same_mean_loss_and_gradient():
    """The critic's shared softmax: probs given to TwoHotSymlog serve mean; the log-likelihood and its gradient are
    the plain ones."""
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 255, requires_grad=True)
    target, slow = torch.randn(4, 6) * 10, torch.randn(4, 6)
    probs = torch.softmax(logits.detach(), -1)
    plain, given = TwoHotSymlog(logits), TwoHotSymlog(logits, probs=probs)
    with torch.no_grad():
        torch.testing.assert_close(given.mean, plain.mean)
    loss_plain = plain.log_prob_mix([target, slow], [1.0, 0.5]).sum()
    loss_given = given.log_prob_mix([target, slow], [1.0, 0.5]).sum()
    torch.testing.assert_close(loss_given, loss_plain, rtol=1e-6, atol=1e-5)  # log(p) is log_softmax up to rounding
    (g_plain,) = torch.autograd.grad(loss_plain, logits)
    (g_given,) = torch.autograd.grad(loss_given, logits)
    torch.testing.assert_close(g_given, g_plain, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="float32 softmax of the logits"):
        TwoHotSymlog(logits, probs=probs.double())


def test_two_hot_given_probs_fall_back_to_log_softmax_for_underflowed_targets():
    """A target bin 100 or 200 nats below the best one: its float32 probability is subnormal or 0, so log(p) would be
    imprecise or -inf; the loss then takes the full log_softmax (finite, the plain path's value)."""
    logits = torch.zeros(2, 255)
    logits[0, 200], logits[1, 200] = 100.0, 200.0  # all mass on a bin near symlog 11.4; the target 0 is bin 127
    probs = torch.softmax(logits, -1)
    assert 0.0 < probs[0, 127].item() < 1e-38 and probs[1, 127].item() == 0.0
    target = torch.zeros(2)
    given = TwoHotSymlog(logits, probs=probs).log_prob(target)
    plain = TwoHotSymlog(logits).log_prob(target)
    torch.testing.assert_close(given, plain)
    torch.testing.assert_close(given, torch.tensor([-100.0, -200.0]))


def test_two_hot_given_probs_zero_weight_bin_with_zero_probability_gives_a_finite_loss():
    """A target exactly on a bin puts weight 0 on its neighbour; that neighbour's probability may be exactly 0 (a logit
    gap past ~104 nats): 0 * log(0) must count as 0, as log_softmax's finite value times 0 does."""
    logits = torch.zeros(1, 255)
    logits[0, 127] = 110.0  # bin 127 is symlog 0; bin 128's probability underflows to 0
    probs = torch.softmax(logits, -1)
    assert probs[0, 128].item() == 0.0
    target = torch.zeros(1)  # exactly on bin 127: weight 1 there, 0 on bin 128
    given = TwoHotSymlog(logits, probs=probs).log_prob(target)
    torch.testing.assert_close(given, TwoHotSymlog(logits).log_prob(target))
    assert given.item() == 0.0


@pytest.mark.parametrize("given", [False, True])
def test_two_hot_minus_inf_logit_next_to_a_target_on_a_bin_gives_no_nan(given):
    """A target exactly on a bin puts weight 0 on its neighbour; with that neighbour's logit -inf (a masked bin) its
    log-probability is -inf and 0 * -inf would be NaN. The loss is the log-probability of the target's bin, and the
    gradient is softmax - one_hot(target bin), 0 at the -inf bin."""
    bins = symlog_bins(5, -2.0, 2.0)  # [-2, -1, 0, 1, 2]
    inf = float("inf")
    logits = torch.tensor([[0.0, 1.0, 1.0, -inf, 0.0],   # target symlog 0 = bin 2; bin 3 (weight 0) is -inf
                           [-inf, -inf, 0.0, -inf, 3.0]],  # target symlog 2 = bin 4 (the top end); bin 3 is -inf
                          requires_grad=True)
    target = symexp(torch.tensor([0.0, 2.0]))
    probs = torch.softmax(logits.detach(), -1) if given else None
    lp = TwoHotSymlog(logits, bins, probs=probs).log_prob(target)
    logp = torch.log_softmax(logits.detach(), -1)
    torch.testing.assert_close(lp, torch.stack([logp[0, 2], logp[1, 4]]))
    assert torch.isfinite(lp).all()
    lp.sum().backward()
    expected = torch.softmax(logits.detach(), -1) - torch.tensor([[0.0, 0, 1, 0, 0], [0.0, 0, 0, 0, 1]])
    torch.testing.assert_close(logits.grad, -expected)


def test_bins_first_built_under_inference_mode_still_train():
    """The default bins are cached per process. Built first inside torch.inference_mode (acting, `reverie eval`
    before any update in the same process), they must still serve a later update: the gradient of the mean
    through a two-hot head (an inference tensor in the cache made this raise)."""
    from reverie.models import distributions as D

    D._BINS.pop((255, torch.device("cpu"), "symlog"), None)
    with torch.inference_mode():
        D.TwoHotSymlog(torch.zeros(3, 255)).mean
    logits = torch.zeros(4, 255, requires_grad=True)
    D.TwoHotSymlog(logits).mean.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
