"""PlaNet's Gaussian RSSM (reverie/models/dynamics/gaussian.py) and its world model: shapes, resets, KL terms,
overshooting."""

import math
from functools import partial

import pytest
import torch

from reverie.models.conv import scale_image
from reverie.models.distributions import FixedNormal, GaussianImage, reduce_bits
from reverie.models.dynamics import GaussianRSSM, gaussian_kl, overshooting_kl, overshooting_loss
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
    assert set(states) == {"deter", "stoch"} == set(rssm.feature_keys)  # what features reads, not mean/std
    assert states["stoch"].shape == (4, T * B, 5)
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


@pytest.mark.parametrize("kwargs", [dict(min_std=0.0), dict(overshooting=-1), dict(overshooting=1), dict(act="tanh")])
def test_bad_std_overshooting_and_act_raise(kwargs):
    with pytest.raises(ValueError, match="min_std > 0 .*overshooting 0 \\(off\\) or >= 2"):
        GaussianRSSM(2, 6, **kwargs)


def test_gaussian_kl_exact_values():
    lhs = {"mean": torch.tensor([[1.0, 0.0]]), "std": torch.tensor([[2.0, 1.0]])}
    rhs = {"mean": torch.zeros(1, 2), "std": torch.ones(1, 2)}
    expected = 0.5 * (4.0 + 1.0 - 1.0 - math.log(4.0))  # KL(N(1, 2^2) || N(0, 1)); the second dim adds 0
    torch.testing.assert_close(gaussian_kl(lhs, rhs), torch.tensor([expected]))
    torch.testing.assert_close(gaussian_kl(lhs, lhs), torch.zeros(1))


class ShiftDynamics:
    """Toy Gaussian RSSM for hand-computed overshooting: one prior step adds the action to the mean and doubles the
    std (Z = 1)."""

    def img_step(self, state, action, sample=True):
        mean, std = state["mean"] + action, 2.0 * state["std"]
        return {"deter": state["deter"], "stoch": mean, "mean": mean, "std": std}


def kl_1d(m1, s1, m2, s2):
    return math.log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2 * s2**2) - 0.5


def test_overshooting_loss_exact_value_by_hand():
    """T = 3, B = 1, D = 3: distances 2 and 3 (distance 1 is the one-step kl term, not counted again), chains from the
    one-step priors (the first from the state before the batch), the free-nats hinge max(0, KL - F), and the reference's
    mean over all B x T x (D - 1) = 6 (start, distance) entries, chains past the end counting 0."""
    post = {"mean": torch.tensor([[0.0], [1.0], [2.0]])[:, :, None], "std": torch.ones(3, 1, 1)}  # (T, B, Z)
    prior = {"mean": torch.zeros(3, 1, 1), "std": torch.ones(3, 1, 1), "deter": torch.zeros(3, 1, 1)}
    prior["stoch"] = prior["mean"]
    prev_action = torch.tensor([5.0, 1.0, 3.0])[:, None, None]  # (T, B, A=1); a_0 only enters the one-step prior
    is_first = torch.zeros(3, 1, dtype=torch.bool)
    # d=2, t=1: prior[0] (0, 1) + a_1 -> (1, 2);  d=2, t=2: prior[1] (0, 1) + a_2 -> (3, 2);
    # d=3, t=2: (1, 2) + a_2 -> (4, 4)
    k21, k22, k32 = kl_1d(1, 1, 1, 2), kl_1d(2, 1, 3, 2), kl_1d(2, 1, 4, 4)
    assert (k21, k22, k32) == pytest.approx((math.log(2) - 0.375, math.log(2) - 0.25, math.log(4) + 5 / 32 - 0.5))
    kl, mask = overshooting_kl(ShiftDynamics(), post, prior, prev_action, is_first, distance=3)
    assert kl.shape == mask.shape == (2, 3, 1)
    torch.testing.assert_close(kl[:, :, 0], torch.tensor([[0.0, k21, k22], [0.0, 0.0, k32]]))
    torch.testing.assert_close(mask[:, :, 0], torch.tensor([[0.0, 1, 1], [0, 0, 1]]))
    loss = overshooting_loss(ShiftDynamics(), post, prior, prev_action, is_first, distance=3, free_nats=0.0)
    torch.testing.assert_close(loss[:, 0], torch.tensor([0.0, k21 / 2, (k22 + k32) / 2]))
    torch.testing.assert_close(loss.mean(), torch.tensor((k21 + k22 + k32) / 6))
    hinged = overshooting_loss(ShiftDynamics(), post, prior, prev_action, is_first, distance=3, free_nats=0.35)
    torch.testing.assert_close(hinged.mean(), torch.tensor((0.0 + (k22 - 0.35) + (k32 - 0.35)) / 6))  # k21 < 0.35
    is_first[2] = True  # a chain may start at a reset (its first step) but not cross one later: only d=2, t=1 stays
    reset = overshooting_loss(ShiftDynamics(), post, prior, prev_action, is_first, distance=3, free_nats=0.0)
    torch.testing.assert_close(reset.mean(), torch.tensor(k21 / 6))
    with pytest.raises(ValueError, match="distance 1 is the one-step KL"):
        overshooting_kl(ShiftDynamics(), post, prior, prev_action, is_first, distance=1)


def test_overshooting_never_crosses_is_first_and_stops_posterior_gradient():
    rssm = make()
    embed, action, is_first = sequence(T=6, B=2)
    embed.requires_grad_(True)
    is_first[3, 0] = True
    post, prior = rssm.observe(embed, action, is_first)
    over, mask = overshooting_kl(rssm, post, prior, action, is_first, distance=3)
    # chains start at s = -1..4 (s = -1: the state before the batch); the step to s + 1 may be a reset, later ones not.
    # env 0 resets at t = 3, env 1 only at t = 0
    expected0 = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 1]], dtype=torch.float32)  # d = 2, 3
    expected1 = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.float32)
    assert torch.equal(mask[:, :, 0], expected0) and torch.equal(mask[:, :, 1], expected1)
    assert bool((over[mask == 0] == 0).all()) and bool((over[mask == 1] > 0).all())
    # the target posterior is detached: the observation at t = T-1 enters KL(sg(post_{T-1}) || prior) only through
    # the target, so it gets no gradient; the chain's start (the posterior at t = T-3 for d = 2) does
    grad = torch.autograd.grad(over[0, -1, 1], embed)[0]  # (T, B, E)
    assert torch.equal(grad[-1], torch.zeros_like(grad[-1]))
    assert grad[-3, 1].abs().sum() > 0


def test_overshooting_chains_continue_from_the_one_step_priors_the_first_from_the_zero_state():
    """Chain ``i`` (from ``s = i - 1``) reaches ``t = i + 1`` at d = 2 by one prior step
    from observe's one-step prior at
    ``i`` (its drawn latent) with ``a_{i+1}``; the chain from ``s = -1`` starts at the zero state before the batch, as
    the reference's chunks do (its one-step prior at t = 0 is the zero state stepped with a_0)."""
    rssm = make()
    embed, action, is_first = sequence(T=4, B=2)
    is_first[:] = False
    post, prior = rssm.observe(embed, action, is_first)
    over, mask = overshooting_kl(rssm, post, prior, action, is_first, distance=2)
    step = rssm.img_step({k: v[:3].flatten(0, 1) for k, v in prior.items()}, action[1:].flatten(0, 1))  # (3*B, ...)
    expected = gaussian_kl({k: post[k][1:].flatten(0, 1) for k in ("mean", "std")}, step).unflatten(0, (3, 2))
    torch.testing.assert_close(over[0, 1:], expected)  # mean and std of a step do not depend on its own draw
    assert torch.equal(mask[0], torch.tensor([[0.0, 0.0], [1, 1], [1, 1], [1, 1]]))
    first = rssm.img_step(rssm.initial(2), action[0], sample=False)
    torch.testing.assert_close(first["mean"], prior["mean"][0])
    torch.testing.assert_close(first["std"], prior["std"][0])


def test_reduce_bits_and_fixed_normal_exact_values():
    x = torch.tensor([0, 7, 8, 255], dtype=torch.uint8)
    # bin centres (0.5, 0.5, 1.5, 31.5) / 32 - 0.5 after scale_image: the reference's preprocess at its noise's mean
    centres = reduce_bits(x, 5, noise=False)
    torch.testing.assert_close(centres, torch.tensor([4.0, 4.0, 12.0, 252.0]) * 255 / 256)
    torch.testing.assert_close(scale_image(centres), torch.tensor([0.5, 0.5, 1.5, 31.5]) / 32 - 0.5)
    noisy = scale_image(reduce_bits(x, 5, noise=True))
    base = torch.tensor([0.0, 0.0, 1.0, 31.0]) / 32 - 0.5
    assert bool(((noisy >= base - 1e-7) & (noisy < base + 1 / 32)).all())  # [-0.5, 0.5): U[0, 1/32) above the bin
    torch.testing.assert_close(reduce_bits(x.double(), 8, noise=False), (x.double() + 0.5) * 255 / 256)
    with pytest.raises(ValueError, match="image_bits"):
        reduce_bits(x, 0)
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(FixedNormal(torch.zeros(3, 2)).log_prob(torch.zeros(3, 2)),
                               torch.full((3,), -2 * half_log_2pi))
    torch.testing.assert_close(FixedNormal(torch.zeros(4), 2.0, event_dims=0).log_prob(torch.full((4,), 2.0)),
                               torch.full((4,), -0.5 - math.log(2.0) - half_log_2pi))
    image = GaussianImage(torch.zeros(1, 1, 2, 2))  # prediction 0 in scaled space = pixel value 127.5
    torch.testing.assert_close(image.log_prob(torch.full((1, 1, 2, 2), 127.5)), torch.tensor([-4 * half_log_2pi]))


@pytest.mark.parametrize("obs_shapes,nets", [({"vector": (4,)}, "planet"),
                                             ({"image": (3, 16, 16), "vector": (2,)}, "dreamer"),
                                             ({"image": (3, 64, 64), "vector": (2,)}, "planet")])
@pytest.mark.parametrize("overshooting", [0, 3])
def test_gaussian_world_model_loss_keys_and_gradients(obs_shapes, nets, overshooting):
    torch.manual_seed(0)
    dynamics = partial(GaussianRSSM, deter=16, stoch=5, units=16, free_nats=3.0, overshooting=overshooting)
    wm = WorldModel(obs_shapes, 2, dynamics, units=16, layers=1, cnn_depth=4, likelihood="gaussian", image_bits=5,
                    nets=nets, head_units=16, head_layers=2)
    T, B = 6, 2
    batch = {k: (torch.randint(0, 256, (T, B, *s), dtype=torch.uint8) if len(s) == 3 else torch.randn(T, B, *s))
             for k, s in obs_shapes.items()}
    batch |= {"prev_action": torch.randn(T, B, 2), "reward": torch.randn(T, B),
              "is_terminal": torch.zeros(T, B, dtype=torch.bool),
              "is_first": torch.zeros(T, B, dtype=torch.bool)}
    batch["is_first"][0] = True
    torch.manual_seed(1)
    losses, post, _, info = wm.loss(batch)
    expected = {*obs_shapes, "reward", "cont", "kl", "global_kl"} | ({"overshooting"} if overshooting else set())
    assert set(losses) == set(wm.loss_keys) == expected
    assert all(v.shape == (T, B) and torch.isfinite(v).all() for v in losses.values())
    torch.manual_seed(1)  # the same draws again: dequantisation noise, then the latents
    embed = wm.encode(wm.preprocess(batch, noise=True))
    post_again, prior = wm.dynamics.observe(embed, batch["prev_action"], batch["is_first"])
    torch.testing.assert_close(post_again["mean"], post["mean"])
    kl = gaussian_kl(post, prior)
    torch.testing.assert_close(losses["kl"], (kl - 3.0).clamp(min=0.0))  # the reference's max(0, KL - free_nats)
    sum(v.mean() for v in losses.values()).backward()
    assert all(p.grad is not None for p in wm.dynamics.parameters())
    assert isinstance(wm.reward(wm.dynamics.features(post)), FixedNormal)
    if "image" in obs_shapes:
        assert wm.decode(wm.dynamics.features(post))["image"].mode.dtype == torch.uint8
