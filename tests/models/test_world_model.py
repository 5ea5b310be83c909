import math

import pytest
import torch

from reverie.models.world_model import WorldModel, categorical_kl, free_bits, kl_losses


def test_free_bits_exact():
    kl = torch.tensor([[0.5, 3.0]])
    assert free_bits(kl, 1.0).mean().item() == 2.0


def test_free_bits_blocks_gradient_below_threshold():
    kl = torch.tensor([0.5, 3.0], requires_grad=True)
    free_bits(kl, 1.0).sum().backward()
    assert kl.grad.tolist() == [0.0, 1.0]


def test_categorical_kl_exact():
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))  # (1, S=1, K=2)
    q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert categorical_kl(p, q).item() == pytest.approx(expected, abs=1e-6)
    two_groups = torch.cat([p, p], 1), torch.cat([q, q], 1)  # summed over S
    assert categorical_kl(*two_groups).item() == pytest.approx(2 * expected, abs=1e-6)


def test_kl_stop_gradient_directions():
    torch.manual_seed(0)
    post = torch.randn(3, 2, 4, 5, requires_grad=True)
    prior = torch.randn(3, 2, 4, 5, requires_grad=True)
    out = kl_losses(post, prior, free_nats=0.0)
    g_post, g_prior = torch.autograd.grad(out["dyn"].sum(), (post, prior), allow_unused=True)
    assert g_post is None and g_prior is not None and g_prior.abs().sum() > 0  # dyn trains the prior only
    g_post, g_prior = torch.autograd.grad(out["rep"].sum(), (post, prior), allow_unused=True)
    assert g_prior is None and g_post is not None and g_post.abs().sum() > 0  # rep trains the posterior only
    torch.testing.assert_close(out["dyn"], out["rep"])  # same value, different gradients


@pytest.mark.parametrize("T,B", [(1, 1), (5, 3), (8, 2)])
def test_world_model_loss_shapes(T, B):
    wm = WorldModel({"vector": (4,), "extra": (2,)}, 3, deter=16, stoch=4, classes=5, units=16, layers=1)
    batch = {"vector": torch.randn(T, B, 4), "extra": torch.randn(T, B, 2), "prev_action": torch.zeros(T, B, 3),
             "is_first": torch.zeros(T, B, dtype=torch.bool), "reward": torch.randn(T, B),
             "is_terminal": torch.zeros(T, B, dtype=torch.bool)}
    losses, post, _ = wm.loss(batch)
    assert set(losses) == set(wm.loss_keys) == {"vector", "extra", "reward", "cont", "dyn", "rep"}
    assert all(v.shape == (T, B) for v in losses.values())
    assert post["deter"].shape == (T, B, 16) and post["stoch"].shape == (T, B, 4, 5)


def test_zero_initialised_reward_head_predicts_exact_zero():
    wm = WorldModel({"vector": (4,)}, 2, deter=16, stoch=4, classes=4, units=16, layers=1)
    feat = torch.randn(7, wm.rssm.feat_dim)
    assert torch.all(wm.reward(feat).mean == 0.0)


def test_image_observations_are_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="CNN encoder"):
        WorldModel({"image": (3, 64, 64)}, 2)
