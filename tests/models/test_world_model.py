import math
from functools import partial

import pytest
import torch

from reverie.models.dynamics import CategoricalRSSM, free_bits, kl_losses
from reverie.models.dynamics.categorical import categorical_kl
from reverie.models.world_model import WorldModel


def rssm(stoch=4, classes=5, kernels="off"):
    """A small categorical dynamics factory (readable path: features are dense tensors)."""
    return partial(CategoricalRSSM, deter=16, stoch=stoch, classes=classes, units=16, kernels=kernels)


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
    wm = WorldModel({"vector": (4,), "extra": (2,)}, 3, rssm(), units=16, layers=1)
    batch = {"vector": torch.randn(T, B, 4), "extra": torch.randn(T, B, 2), "prev_action": torch.zeros(T, B, 3),
             "is_first": torch.zeros(T, B, dtype=torch.bool), "reward": torch.randn(T, B),
             "is_terminal": torch.zeros(T, B, dtype=torch.bool)}
    losses, post, *_ = wm.loss(batch)
    assert set(losses) == set(wm.loss_keys) == {"vector", "extra", "reward", "cont", "dyn", "rep"}
    assert all(v.shape == (T, B) for v in losses.values())
    assert post["deter"].shape == (T, B, 16) and post["stoch"].shape == (T, B, 4, 5)


def test_zero_initialised_reward_head_predicts_exact_zero():
    wm = WorldModel({"vector": (4,)}, 2, rssm(classes=4), units=16, layers=1)
    feat = torch.randn(7, wm.dynamics.feat_dim)
    assert torch.all(wm.reward(feat).mean == 0.0)


def image_batch(T, B, A=2, dict_obs=True):
    torch.manual_seed(0)
    batch = {"image": torch.randint(0, 256, (T, B, 3, 16, 16), dtype=torch.uint8), "prev_action": torch.zeros(T, B, A),
             "is_first": torch.zeros(T, B, dtype=torch.bool), "reward": torch.randn(T, B),
             "is_terminal": torch.zeros(T, B, dtype=torch.bool)}
    if dict_obs:
        batch["vector"] = torch.randn(T, B, 4)
    return batch


def small_image_model(shapes, **kwargs):
    torch.manual_seed(0)
    return WorldModel(shapes, 2, rssm(), units=16, layers=1, cnn_depth=2, **kwargs)


@pytest.mark.parametrize("T,B", [(1, 1), (3, 2)])
def test_multimodal_world_model_loss_shapes_and_keys(T, B):
    wm = small_image_model({"image": (3, 16, 16), "vector": (4,)})
    assert wm.image_keys == ["image"] and wm.vector_keys == ["vector"]
    assert wm.image_encoder.out_dim == 2 * 2 * 16  # depth 2 -> channels [2, 4] -> (4, 4, 4)
    batch = image_batch(T, B)
    embed = wm.encode(batch)
    assert embed.shape == (T, B, 64 + 16)  # cat(cnn (T, B, 64), mlp (T, B, units))
    losses, post, *_ = wm.loss(batch)
    assert set(losses) == set(wm.loss_keys) == {"image", "vector", "reward", "cont", "dyn", "rep"}
    assert all(v.shape == (T, B) for v in losses.values())
    dists = wm.decode(wm.dynamics.features(post))
    assert dists["image"].mode.shape == (T, B, 3, 16, 16) and dists["image"].mode.dtype == torch.uint8
    assert dists["vector"].mode.shape == (T, B, 4)


def test_image_only_world_model_and_image_loss_value():
    wm = small_image_model({"image": (3, 16, 16)})
    assert wm.encoder is None and wm.decoder is None and wm.loss_keys[0] == "image"
    batch = image_batch(2, 3, dict_obs=False)
    losses, post, *_ = wm.loss(batch)
    pred = wm.image_decoder(wm.dynamics.features(post))  # (T, B, 3, 16, 16)
    expected = ((pred - (batch["image"].float() / 255 - 0.5)) ** 2).sum((-3, -2, -1))
    torch.testing.assert_close(losses["image"], expected)


def test_image_keys_are_concatenated_along_channels_and_split_back():
    wm = small_image_model({"a": (3, 8, 8), "b": (1, 8, 8)})
    assert wm.image_encoder.in_shape == (4, 8, 8)
    dists = wm.decode(torch.zeros(5, wm.dynamics.feat_dim))
    assert dists["a"].mode.shape == (5, 3, 8, 8) and dists["b"].mode.shape == (5, 1, 8, 8)
    with pytest.raises(ValueError, match="different sizes"):
        small_image_model({"a": (3, 8, 8), "b": (3, 16, 16)})


def test_world_model_image_loss_trains_the_encoder():
    wm = small_image_model({"image": (3, 16, 16), "vector": (4,)})
    losses, *_ = wm.loss(image_batch(2, 2))
    grads = torch.autograd.grad(losses["image"].mean(), list(wm.image_encoder.parameters()))
    assert all(g.abs().sum() > 0 for g in grads)


def test_uint8_and_float_pixels_encode_identically():
    wm = small_image_model({"image": (3, 16, 16)})
    images = torch.randint(0, 256, (2, 3, 3, 16, 16), dtype=torch.uint8)
    torch.testing.assert_close(wm.encode({"image": images}), wm.encode({"image": images.float()}), rtol=0, atol=0)


def test_bad_observation_shapes_fail_with_a_clear_error():
    with pytest.raises(ValueError, match="neither vectors"):
        WorldModel({"grid": (4, 4)}, 2)
    with pytest.raises(ValueError, match="image side 48"):
        small_image_model({"image": (3, 48, 48)})


@pytest.mark.parametrize("kwargs", [dict(nets="planet"), dict(nets="sheeprl", likelihood="gaussian"),
                                    dict(likelihood="beta"), dict(likelihood="gaussian", image_bits=9),
                                    dict(nets=None), dict(nets={"name": "dreamer"})])
def test_bad_nets_and_likelihood_fail_with_a_clear_error(kwargs):
    """PlaNet's networks come with its Gaussian likelihoods only (the two-hot reward head is DreamerV3's)."""
    with pytest.raises(ValueError, match="WorldModel: (nets must be|need likelihood)"):
        WorldModel({"vector": (3,)}, 2, units=8, layers=1, **kwargs)


def test_kl_losses_values_and_entropies_equal_the_distributions():
    """kl_losses writes the KL out on the unimix log-probabilities: the same numbers as categorical_kl and
    torch.distributions on UnimixCategorical (entropies summed over the S groups)."""
    from reverie.models.distributions import UnimixCategorical, unimix_logits

    torch.manual_seed(0)
    post, prior = torch.randn(3, 2, 4, 5) * 3, torch.randn(3, 2, 4, 5)
    out = kl_losses(post, prior, free_nats=0.0, unimix=0.01)
    expected = categorical_kl(unimix_logits(post, 0.01), unimix_logits(prior, 0.01))
    torch.testing.assert_close(out["dyn"], expected)
    torch.testing.assert_close(out["kl"], expected)
    for key, logits in (("post_entropy", post), ("prior_entropy", prior)):
        dist = torch.distributions.Independent(UnimixCategorical(logits, 0.01), 1)
        torch.testing.assert_close(out[key], dist.entropy())
    assert kl_losses(post, prior, free_nats=1.0)["dyn"].min() >= 1.0


def test_kl_losses_compute_in_float32_from_bfloat16_logits():
    torch.manual_seed(0)
    post, prior = torch.randn(3, 2, 4, 5).bfloat16(), torch.randn(3, 2, 4, 5).bfloat16()
    out = kl_losses(post, prior, free_nats=0.0)
    assert all(v.dtype == torch.float32 for v in out.values())
    torch.testing.assert_close(out["dyn"], kl_losses(post.float(), prior.float(), free_nats=0.0)["dyn"])
