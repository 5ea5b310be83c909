"""PlaNet's Gaussian RSSM (reverie/models/dynamics/gaussian.py) and its world model: shapes, resets, KL terms,
overshooting."""

import math
from functools import partial

import pytest
import torch

from reverie.models.distributions import FixedNormal, GaussianImage, reduce_bits
from reverie.models.dynamics import GaussianRSSM, gaussian_kl, overshooting_kl
from reverie.models.world_model import WorldModel


def make(action_dim=2, embed=6, min_std=0.1):
    torch.manual_seed(0)
    return GaussianRSSM(action_dim, embed, deter=16, stoch=5, units=16, min_std=min_std)


def sequence(T=7, B=3, A=2, E=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    is_first = torch.zeros(T, B, dtype=torch.bool)
    is_first[0] = True
    return torch.randn(T, B, E, generator=g), torch.randn(T, B, A, generator=g), is_first


@pytest.mark.parametrize("T,B", [(1, 1), (4, 3), (9, 2)])
def test_gaussian_observe_and_imagine_shapes(T, B):
    rssm = make()
    embed, action, is_first = sequence(T, B)
    post, prior = rssm.observe(embed, action, is_first)
    assert rssm.state_keys == ("deter", "stoch", "mean", "std")
    for s in (post, prior):
        assert s["deter"].shape == (T, B, 16) and all(s[k].shape == (T, B, 5) for k in ("stoch", "mean", "std"))
        assert bool((s["std"] > 0.1).all())  # softplus(.) + min_std
    assert rssm.features(post).shape == (T, B, 16 + 5) and rssm.feat_dim == 21
    assert rssm.dist(post).event_shape == (5,)
    start = {k: v.flatten(0, 1) for k, v in post.items()}  # (T, B, ...) -> (T*B, ...)
    states, actions = rssm.imagine(lambda s: torch.zeros(s["deter"].shape[0], 2), start, horizon=3)
    assert set(states) == set(rssm.state_keys) and states["stoch"].shape == (4, T * B, 5)
    torch.testing.assert_close(states["deter"][0], start["deter"])


def test_gaussian_is_first_resets_to_the_zero_state():
    rssm = make()
    embed, action, is_first = sequence(T=6, B=2)
    embed[3:, 1] = embed[3:, 0]
    action[3:, 1] = action[3:, 0]
    is_first[3] = True
    post, _ = rssm.observe(embed, action, is_first, sample=False)
    torch.testing.assert_close(post["deter"][3:, 0], post["deter"][3:, 1])
    fresh, _ = rssm.observe(embed[3:, :1], action[3:, :1], is_first[3:, :1], sample=False)
    torch.testing.assert_close(post["mean"][3:, :1], fresh["mean"])


def test_bad_std_and_overshooting_raise():
    with pytest.raises(ValueError, match="min_std > 0"):
        GaussianRSSM(2, 6, min_std=0.0)
    with pytest.raises(ValueError, match="overshooting >= 0"):
        GaussianRSSM(2, 6, overshooting=-1)


def test_gaussian_kl_exact_values():
    lhs = {"mean": torch.tensor([[1.0, 0.0]]), "std": torch.tensor([[2.0, 1.0]])}
    rhs = {"mean": torch.zeros(1, 2), "std": torch.ones(1, 2)}
    expected = 0.5 * (4.0 + 1.0 - 1.0 - math.log(4.0))  # KL(N(1, 2^2) || N(0, 1)); the second dim adds 0
    torch.testing.assert_close(gaussian_kl(lhs, rhs), torch.tensor([expected]))
    torch.testing.assert_close(gaussian_kl(lhs, lhs), torch.zeros(1))


def test_overshooting_distance_one_equals_the_standard_kl():
    """Value and prior-side gradient of the d=1 overshooting KL equal the one-step KL of observe (t >= 1)."""
    rssm = make()
    embed, action, is_first = sequence(T=8, B=3)
    post, prior = rssm.observe(embed, action, is_first)
    standard = gaussian_kl({k: post[k].detach() for k in ("mean", "std")}, prior)  # (T, B)
    over, mask = overshooting_kl(rssm, post, action, is_first, distance=1)
    assert over.shape == mask.shape == (1, 8, 3)
    assert torch.equal(mask[0, 0], torch.zeros(3)) and torch.equal(mask[0, 1:], torch.ones(7, 3))
    torch.testing.assert_close(over[0, 1:], standard[1:])
    params = list(rssm.prior_net.parameters())
    g_standard = torch.autograd.grad(standard[1:].sum(), params, retain_graph=True)
    g_over = torch.autograd.grad(over[0].sum(), params)
    for a, b in zip(g_standard, g_over):
        torch.testing.assert_close(a, b)


def test_overshooting_never_crosses_is_first_and_stops_posterior_gradient():
    rssm = make()
    embed, action, is_first = sequence(T=6, B=2)
    embed.requires_grad_(True)
    is_first[3, 0] = True
    post, _ = rssm.observe(embed, action, is_first)
    over, mask = overshooting_kl(rssm, post, action, is_first, distance=3)
    # env 0: starts before t=3 cannot reach t >= 3; env 1 has no reset after t=0
    expected0 = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    expected1 = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    assert torch.equal(mask[:, :, 0], expected0) and torch.equal(mask[:, :, 1], expected1)
    assert bool((over[mask == 0] == 0).all()) and bool((over[mask == 1] > 0).all())
    # the target posterior is detached: the observation at t = T-1 enters KL(sg(post_{T-1}) || prior) only through
    # the target, so it gets no gradient; the chain's start (t = T-2) does
    grad = torch.autograd.grad(over[0, -1, 1], embed)[0]  # (T, B, E)
    assert torch.equal(grad[-1], torch.zeros_like(grad[-1]))
    assert grad[-2, 1].abs().sum() > 0


def test_reduce_bits_and_fixed_normal_exact_values():
    x = torch.tensor([0, 7, 8, 255], dtype=torch.uint8)
    torch.testing.assert_close(reduce_bits(x, 5, noise=False), torch.tensor([4.0, 4.0, 12.0, 252.0]))
    noisy = reduce_bits(x, 5, noise=True)
    base = torch.tensor([0.0, 0.0, 8.0, 248.0])
    assert bool(((noisy >= base) & (noisy < base + 8)).all())
    torch.testing.assert_close(reduce_bits(x, 8, noise=False), x.float())
    with pytest.raises(ValueError, match="image_bits"):
        reduce_bits(x, 0)
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(FixedNormal(torch.zeros(3, 2)).log_prob(torch.zeros(3, 2)), torch.full((3,), -2 * half_log_2pi))
    torch.testing.assert_close(FixedNormal(torch.zeros(4), 2.0, event_dims=0).log_prob(torch.full((4,), 2.0)),
                               torch.full((4,), -0.5 - math.log(2.0) - half_log_2pi))
    image = GaussianImage(torch.zeros(1, 1, 2, 2))  # prediction 0 in scaled space = pixel value 127.5
    torch.testing.assert_close(image.log_prob(torch.full((1, 1, 2, 2), 127.5)), torch.tensor([-4 * half_log_2pi]))


@pytest.mark.parametrize("obs_shapes", [{"vector": (4,)}, {"image": (3, 16, 16), "vector": (2,)}])
@pytest.mark.parametrize("overshooting", [0, 3])
def test_gaussian_world_model_loss_keys_and_gradients(obs_shapes, overshooting):
    torch.manual_seed(0)
    dynamics = partial(GaussianRSSM, deter=16, stoch=5, units=16, free_nats=3.0, overshooting=overshooting)
    wm = WorldModel(obs_shapes, 2, dynamics, units=16, layers=1, cnn_depth=4, likelihood="gaussian", image_bits=5)
    T, B = 6, 2
    batch = {k: (torch.randint(0, 256, (T, B, *s), dtype=torch.uint8) if len(s) == 3 else torch.randn(T, B, *s))
             for k, s in obs_shapes.items()}
    batch |= {"prev_action": torch.randn(T, B, 2), "reward": torch.randn(T, B), "is_terminal": torch.zeros(T, B, dtype=torch.bool),
              "is_first": torch.zeros(T, B, dtype=torch.bool)}
    batch["is_first"][0] = True
    losses, post, info = wm.loss(batch)
    expected = {*obs_shapes, "reward", "cont", "kl", "global_kl"} | ({"overshooting"} if overshooting else set())
    assert set(losses) == set(wm.loss_keys) == expected
    assert all(v.shape == (T, B) and torch.isfinite(v).all() for v in losses.values())
    assert bool((losses["kl"] >= 3.0).all())  # free nats
    sum(v.mean() for v in losses.values()).backward()
    assert all(p.grad is not None for p in wm.dynamics.parameters())
    assert isinstance(wm.reward(wm.dynamics.features(post)), FixedNormal)
    if "image" in obs_shapes:
        assert wm.decode(wm.dynamics.features(post))["image"].mode.dtype == torch.uint8
