"""PlaNet's own networks (reverie/models/planet_nets.py) against google-research/planet: conv_ha shapes and layers,
the feed-forward heads, the block GRU cell's equations and TensorFlow's default initialisation."""

import math

import pytest
import torch
from torch import nn

from reverie.models.planet_nets import BlockGRUCell, ConvHaDecoder, ConvHaEncoder, FeedForward, glorot_uniform_


def test_conv_ha_encoder_64x64x3_to_1024_and_decoder_back():
    torch.manual_seed(0)
    enc = ConvHaEncoder((3, 64, 64))
    images = torch.randint(0, 256, (2, 5, 3, 64, 64), dtype=torch.uint8)  # (T, B, C, H, W)
    embed = enc(images)
    assert enc.out_dim == 1024 and embed.shape == (2, 5, 1024)
    convs = [m for m in enc.layers if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (32, (4, 4), (2, 2), (0, 0)), (64, (4, 4), (2, 2), (0, 0)), (128, (4, 4), (2, 2), (0, 0)),
        (256, (4, 4), (2, 2), (0, 0))]  # conv_ha.py:30-33: 4x4, stride 2, VALID
    assert sum(isinstance(m, nn.ReLU) for m in enc.layers) == 4
    sizes, x = [], enc.layers[0].weight.new_zeros(1, 3, 64, 64)
    for layer in enc.layers:
        x = layer(x)
        if isinstance(layer, nn.Conv2d):
            sizes.append(x.shape[-1])
    assert sizes == [31, 14, 6, 2]
    assert bool((embed >= 0).all())  # the last layer's ReLU, flattened

    dec = ConvHaDecoder(230, (3, 64, 64))
    mean = dec(torch.randn(2, 5, 230))
    assert mean.shape == (2, 5, 3, 64, 64)
    assert (dec.linear.in_features, dec.linear.out_features) == (230, 1024)  # conv_ha.py:44: dense to 1024, no act
    deconvs = [m for m in dec.layers if isinstance(m, nn.ConvTranspose2d)]
    assert [(d.out_channels, d.kernel_size[0], d.stride[0], d.padding[0]) for d in deconvs] == [
        (128, 5, 2, 0), (64, 5, 2, 0), (32, 6, 2, 0), (3, 6, 2, 0)]  # conv_ha.py:46-49
    assert [type(m).__name__ for m in dec.layers].count("ReLU") == 3  # none on the output
    x, sizes = torch.zeros(1, 1024, 1, 1), []
    for layer in dec.layers:
        x = layer(x)
        if isinstance(layer, nn.ConvTranspose2d):
            sizes.append(x.shape[-1])
    assert sizes == [5, 13, 30, 64]


def test_conv_ha_depth_scales_channels_and_other_sizes_raise():
    enc = ConvHaEncoder((6, 64, 64), depth=4)  # two image keys concatenated along channels
    assert enc.out_dim == 4 * 8 * 2 * 2 and enc(torch.zeros(3, 6, 64, 64, dtype=torch.uint8)).shape == (3, 128)
    assert ConvHaDecoder(10, (6, 64, 64), depth=4)(torch.zeros(3, 10)).shape == (3, 6, 64, 64)
    with pytest.raises(ValueError, match="64x64.*planet_dreamer_nets=true"):
        ConvHaEncoder((3, 32, 32))
    with pytest.raises(ValueError, match="64x64"):
        ConvHaDecoder(10, (3, 16, 16))
    with pytest.raises(ValueError, match=r"expected images \(\.\.\., 3, 64, 64\)"):
        ConvHaEncoder()(torch.zeros(2, 1, 64, 64))


def test_feed_forward_is_the_reference_head_and_tf_initialised():
    torch.manual_seed(0)
    head = FeedForward(230, 1)  # reward head: num_layers 3, num_units 300, relu (configs.py:109-116)
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(230, 300), (300, 300), (300, 300), (300, 1)]
    assert sum(isinstance(m, nn.ReLU) for m in head.modules()) == 3
    assert all(bool((m.bias == 0).all()) for m in linears)
    bound = math.sqrt(6 / (300 + 300))
    w = linears[1].weight
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound  # glorot uniform over (-b, b)
    assert head(torch.zeros(4, 230)).shape == (4, 1)
    assert FeedForward(5, None, units=7, layers=2).out_dim == 7
    with pytest.raises(ValueError, match="act"):
        FeedForward(5, 1, act="swish-ish")


def test_block_gru_cell_equations_and_initial_gate_bias():
    """tf.contrib.rnn.GRUBlockCell: r, u = sigmoid(W_ru [x, h] + b_ru); c = tanh(W_c [x, r * h] + b_c);
    h' = u * h + (1 - u) * c; b_ru starts at 1, b_c at 0."""
    torch.manual_seed(0)
    cell = BlockGRUCell(3, 4).double()
    assert torch.equal(cell.gates.bias, torch.ones(8, dtype=torch.float64)) and bool((cell.candidate.bias == 0).all())
    x, h = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    w_ru, b_ru = cell.gates.weight.T, cell.gates.bias  # (I + D, 2D)
    w_c, b_c = cell.candidate.weight.T, cell.candidate.bias
    ru = torch.sigmoid(torch.cat([x, h], 1) @ w_ru + b_ru)
    r, u = ru[:, :4], ru[:, 4:]
    c = torch.tanh(torch.cat([x, r * h], 1) @ w_c + b_c)
    torch.testing.assert_close(cell(x, h), u * h + (1 - u) * c, rtol=1e-12, atol=1e-12)
    torch_gru = nn.GRUCell(3, 4).double()  # applies r after the product: a different function of the same shapes
    assert torch_gru(x, h).shape == cell(x, h).shape


def test_glorot_uniform_with_the_fans_of_a_split_layer():
    torch.manual_seed(0)
    w = torch.empty(2000, 30)
    glorot_uniform_(w, fan_in=30 + 6, fan_out=2000)  # e.g. Dense(cat(z, a)) split into its z part
    bound = math.sqrt(6 / (36 + 2000))
    assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
