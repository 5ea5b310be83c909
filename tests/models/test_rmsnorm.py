"""RMSNorm of the current official DreamerV3 (embodied/jax/nets.py Norm, impl rms): exact values, float32 compute,
channel form."""

import math

import torch

from reverie.models.rmsnorm import ChannelRMSNorm, RMSNorm


def test_rmsnorm_values_by_hand():
    norm = RMSNorm(4)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    # mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5; eps 1e-4; zeros stay zeros
    r = 1.0 / math.sqrt(7.5 + 1e-4)
    want = torch.tensor([[1.0 * r, 4.0 * r, 1.5 * r, -4.0 * r], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(norm(x), want, rtol=1e-6, atol=0)
    assert norm.eps == 1e-4 and torch.equal(RMSNorm(3).weight, torch.ones(3))


def test_rmsnorm_small_inputs_meet_the_epsilon():
    x = torch.tensor([[1e-3, -1e-3]])
    # mean(x^2) = 1e-6 << eps: the output is x / sqrt(1e-6 + 1e-4), not the unit-RMS x / 1e-3
    torch.testing.assert_close(RMSNorm(2)(x), x / math.sqrt(1e-6 + 1e-4), rtol=1e-6, atol=0)


def test_rmsnorm_computes_in_float32_and_returns_the_input_dtype():
    x = torch.tensor([[300.0, 1.0, 2.0, 3.0]]).bfloat16()
    y = RMSNorm(4)(x)
    assert y.dtype == torch.bfloat16
    want = (x.float() / torch.sqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-4)).bfloat16()
    assert torch.equal(y, want)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert RMSNorm(4)(x.float()).dtype == torch.float32  # autocast does not move it to 16 bits


def test_channel_rmsnorm_normalises_channels_per_pixel():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    norm = ChannelRMSNorm(3)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
    want = x / torch.sqrt((x ** 2).mean(1, keepdim=True) + 1e-4) * torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    torch.testing.assert_close(norm(x), want, rtol=1e-6, atol=1e-7)
