"""LaProp with adaptive gradient clipping and warmup (reverie.agents.optim), the current official DreamerV3 optimiser:
steps and clips computed by hand."""

import math

import pytest
import torch

from reverie.agents.optim import LaProp, agc_clip_


def test_agc_clip_by_hand():
    params = [torch.tensor([3.0, 4.0]), torch.zeros(2), torch.tensor([[1.0, 0.0], [0.0, 0.0]])]
    grads = [torch.tensor([1.8, 2.4]), torch.tensor([0.0, 0.01]), torch.tensor([[0.1, 0.2], [0.0, 0.0]])]
    factor = agc_clip_(params, grads, clip=0.3, pmin=1e-3)
    # 1: ||g|| 3 > 0.3 * ||p|| = 1.5 -> halved; 2: ||p|| 0 -> pmin: limit 0.3 * 1e-3 = 3e-4, ||g|| 0.01 -> x 0.03;
    # 3: ||g|| = sqrt(0.05) = 0.2236 <= 0.3 * 1 -> unchanged
    torch.testing.assert_close(factor, torch.tensor([0.5, 0.03, 1.0]), rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[0], torch.tensor([0.9, 1.2]), rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[1], torch.tensor([0.0, 3e-4]), rtol=1e-5, atol=0)
    torch.testing.assert_close(grads[2], torch.tensor([[0.1, 0.2], [0.0, 0.0]]), rtol=0, atol=0)


def step(opt, p, grad):
    p.grad = torch.tensor(grad, dtype=p.dtype)
    opt.step()
    return p.detach().clone()


def test_laprop_two_steps_by_hand():
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-20
    p = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    opt = LaProp([p], lr=lr, agc=0.3, eps=eps, beta1=b1, beta2=b2, warmup=10)
    # step 1: g = (1.8, 2.4) is clipped by AGC to (0.9, 1.2); v = 0.001 g^2, v_hat = g^2, u = g / |g| = (1, 1);
    # m = 0.1 u, m_hat = u; but the warmup's learning rate at step 1 is lr * 0 / 10 = 0: p stays
    assert torch.equal(step(opt, p, [1.8, 2.4]), torch.tensor([3.0, 4.0], dtype=torch.float64))
    g1 = [0.9, 1.2]
    v1 = [(1 - b2) * g * g for g in g1]
    m1 = [(1 - b1) * 1.0, (1 - b1) * 1.0]
    assert opt.state[p]["step"] == 1
    # the moments keep float64 for float64 parameters (float32 at least)
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], torch.tensor(v1, dtype=torch.float64), rtol=1e-12, atol=0)
    # step 2: g = (0.3, -0.4) (norm 0.5 < 1.5: not clipped); lr_2 = 0.1 * 1 / 10 = 0.01
    g2 = [0.3, -0.4]
    v2 = [b2 * v + (1 - b2) * g * g for v, g in zip(v1, g2)]
    u2 = [g / (math.sqrt(v / (1 - b2 ** 2)) + eps) for g, v in zip(g2, v2)]
    m2 = [b1 * m + (1 - b1) * u for m, u in zip(m1, u2)]
    want = [x - 0.01 * m / (1 - b1 ** 2) for x, m in zip([3.0, 4.0], m2)]
    # written out: u2 = (0.3 / sqrt(0.00089919 / 0.001999), -0.4 / sqrt(0.00159856 / 0.001999)) = (0.44730, -0.44730)
    torch.testing.assert_close(torch.tensor(u2), torch.tensor([0.447303, -0.447303]), rtol=1e-5, atol=0)
    torch.testing.assert_close(step(opt, p, g2), torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)
    # = 3 - 0.01 * (0.09 + 0.0447303) / 0.19, 4 - 0.01 * (0.09 - 0.0447303) / 0.19
    torch.testing.assert_close(p.detach(), torch.tensor([2.9929089, 3.9976174], dtype=torch.float64), rtol=0, atol=1e-7)


def test_laprop_without_warmup_moves_by_lr_at_step_one():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.0]))
    opt = LaProp([p], lr=0.5, agc=0.0, warmup=0)
    # g / sqrt(g^2) = sign(g): the first step moves every coordinate with a gradient by exactly lr
    torch.testing.assert_close(step(opt, p, [1e-6, -30.0, 0.0]), torch.tensor([0.5, -1.5, 0.0]), rtol=0, atol=1e-6)


def test_learning_rate_schedule():
    assert [LaProp.learning_rate(4e-5, 1000, t) for t in (1, 2, 501, 1001, 5000)] == \
        [0.0, 4e-5 * 1 / 1000, 4e-5 * 500 / 1000, 4e-5, 4e-5]
    assert LaProp.learning_rate(4e-5, 0, 1) == 4e-5


def test_laprop_rejects_bad_settings():
    with pytest.raises(ValueError, match="betas"):
        LaProp([torch.nn.Parameter(torch.zeros(1))], beta1=1.0)
    with pytest.raises(ValueError, match="agent.module.laprop"):
        LaProp([torch.nn.Parameter(torch.zeros(1))], form="adam")


def test_original_laprop_two_steps_by_hand():
    """The authors' form (R2-Dreamer's): lr_t = lr * t / warmup enters the momentum; the step divides by the
    momentum of the learning rates. Written out for one coordinate, lr 0.1, warmup 10, no AGC, eps 0."""
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = LaProp([p], lr=0.1, agc=0.0, eps=0.0, beta1=0.9, beta2=0.999, warmup=10, form="original")
    # step 1: lr_1 = 0.01; u = g / sqrt(g^2) = 1; m = 0.1 * 0.01 * 1 = 0.001; c = 0.1 * 0.01 = 0.001: p -= 0.01
    torch.testing.assert_close(step(opt, p, [2.0]), torch.tensor([0.99], dtype=torch.float64), rtol=0, atol=1e-15)
    # step 2: lr_2 = 0.02; v = 0.999 * 4 * 0.001 + 0.001 * 1 = 0.004996, v / (1 - 0.999^2) = 2.4992496...;
    # u = -1 / 1.580901... = -0.632551...; m = 0.9 * 0.001 + 0.1 * 0.02 * u = 0.9e-3 - 1.265103e-3 = -0.365103e-3;
    # c = 0.9 * 0.001 + 0.1 * 0.02 = 0.0029; p -= 0.02 / 0.0029 * m: 0.99 + 0.0025180...
    u = -1.0 / math.sqrt((0.999 * 4 * 0.001 + 0.001) / (1 - 0.999 ** 2))
    want = 0.99 - 0.02 / 0.0029 * (0.9e-3 + 0.1 * 0.02 * u)
    torch.testing.assert_close(step(opt, p, [-1.0]), torch.tensor([want], dtype=torch.float64), rtol=1e-12, atol=0)
    assert want == pytest.approx(0.992518, abs=1e-6)
    assert opt.state[p]["lr_avg"] == pytest.approx(0.0029, rel=1e-12)
