import pytest
import torch

from reverie.models.conv import ChannelNorm, ConvDecoder, ConvEncoder, ImageMSE, conv_plan, scale_image, unscale_image


def test_scale_image_exact_values_and_round_trip():
    x = torch.tensor([0, 255, 51], dtype=torch.uint8)
    y = scale_image(x)
    assert y.dtype == torch.float32
    assert y.tolist() == [-0.5, 0.5, pytest.approx(51 / 255 - 0.5, abs=1e-7)]
    assert torch.equal(scale_image(x.float()), y)  # float pixel values: the same numbers
    every = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(unscale_image(scale_image(every)), every)


def test_reference_channels_and_4x4_output_for_64_and_32():
    assert [p["cout"] for p in conv_plan((3, 64, 64), depth=32)] == [32, 64, 128, 256]
    assert [p["size_out"] for p in conv_plan((3, 64, 64), depth=32)] == [32, 16, 8, 4]
    assert [p["cout"] for p in conv_plan((3, 32, 32), depth=8)] == [8, 16, 32]
    for side, depth, channels in ((64, 4, 32), (32, 4, 16), (16, 2, 4)):
        enc = ConvEncoder((3, side, side), depth=depth)
        images = torch.randint(0, 256, (2, 3, side, side), dtype=torch.uint8)
        assert enc.features(images).shape == (2, channels, 4, 4)  # 4x4 spatial before the flatten
        assert enc.out_shape == (channels, 4, 4) and enc.out_dim == channels * 16


@pytest.mark.parametrize("lead", [(), (5,), (3, 2), (2, 1, 2)])
def test_encoder_and_decoder_shapes_over_leading_dims(lead):
    torch.manual_seed(0)
    enc = ConvEncoder((3, 16, 16), depth=2)
    dec = ConvDecoder(7, (3, 16, 16), depth=2)
    images = torch.randint(0, 256, (*lead, 3, 16, 16), dtype=torch.uint8)
    embed = enc(images)
    assert embed.shape == (*lead, 4 * 4 * 4) and embed.dtype == torch.float32
    pred = dec(torch.randn(*lead, 7))
    assert pred.shape == (*lead, 3, 16, 16)
    dist = ImageMSE(pred)
    assert dist.log_prob(images).shape == lead
    assert dist.mode.shape == (*lead, 3, 16, 16) and dist.mode.dtype == torch.uint8


def test_encoder_flattening_keeps_each_image_separate():
    torch.manual_seed(0)
    enc = ConvEncoder((3, 16, 16), depth=2)
    images = torch.randint(0, 256, (4, 3, 3, 16, 16), dtype=torch.uint8)  # (T, B, C, H, W)
    embed = enc(images)
    torch.testing.assert_close(embed[2, 1], enc(images[2, 1]), rtol=0, atol=1e-6)


def test_decoder_mirrors_the_encoder_at_64():
    dec = ConvDecoder(10, (3, 64, 64), depth=4)
    assert dec.in_shape == (32, 4, 4)
    convs = [m for m in dec.layers if isinstance(m, torch.nn.ConvTranspose2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(32, 16), (16, 8), (8, 4), (4, 3)]
    assert dec(torch.zeros(2, 10)).shape == (2, 3, 64, 64)
    assert convs[-1].bias is not None and all(c.bias is None for c in convs[:-1])  # norm layers need no bias


def test_channel_norm_normalises_over_channels_at_each_pixel():
    norm = ChannelNorm(4, eps=1e-5, elementwise_affine=False)
    x = torch.randn(2, 4, 3, 3) * 5 + 2
    y = norm(x)
    torch.testing.assert_close(y.mean(1), torch.zeros(2, 3, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(1, unbiased=False), torch.ones(2, 3, 3), atol=1e-3, rtol=0)


def test_image_mse_log_prob_is_minus_sum_of_squared_errors():
    pred = torch.zeros(1, 1, 2, 2)  # (B=1, C=1, 2, 2), scaled space
    pred[0, 0, 0, 0] = 0.5
    target = torch.tensor([[[[255, 0], [0, 0]]]], dtype=torch.uint8)
    # errors in the scaled space: 0.5 - 0.5 = 0 and three times 0 - (-0.5) = 0.5 -> 3 * 0.25
    assert ImageMSE(pred).log_prob(target).tolist() == [-0.75]
    assert ImageMSE(pred).mode.tolist() == [[[[255, 128], [128, 128]]]]
    torch.testing.assert_close(ImageMSE(pred).mean, (pred + 0.5) * 255)


def test_image_loss_trains_the_encoder_and_decoder():
    torch.manual_seed(0)
    enc = ConvEncoder((3, 8, 8), depth=2)
    dec = ConvDecoder(enc.out_dim, (3, 8, 8), depth=2)
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    loss = -ImageMSE(dec(enc(images))).log_prob(images).mean()
    loss.backward()
    for module in (enc, dec):
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert all(g.abs().sum() > 0 for g in grads)
    # a few steps of plain gradient descent lower the loss
    opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=1e-2)
    first = loss.item()
    for _ in range(5):
        opt.zero_grad()
        loss = -ImageMSE(dec(enc(images))).log_prob(images).mean()
        loss.backward()
        opt.step()
    assert loss.item() < first


@pytest.mark.parametrize("shape, match", [
    ((3, 48, 48), r"image side 48 .*not a power of two.*64x64"),
    ((3, 4, 4), r"image side 4 .*min_res=4"),
    ((3, 64, 32), r"square, got 64x32"),
    ((64, 64), r"\(C, H, W\)"),
])
def test_bad_image_sizes_fail_naming_the_size_and_the_fix(shape, match):
    with pytest.raises(ValueError, match=match):
        ConvEncoder(shape)


def test_explicit_layers_and_inexact_strides():
    enc = ConvEncoder((1, 24, 24), channels=[4, 8], kernel=[4, 3], stride=[2, 3], padding=[1, 0], norm="none",
                      act="relu")
    assert enc.out_shape == (8, 4, 4)
    dec = ConvDecoder(5, (1, 24, 24), channels=[4, 8], kernel=[4, 3], stride=[2, 3], padding=[1, 0])
    assert dec(torch.zeros(5)).shape == (1, 24, 24)
    with pytest.raises(ValueError, match="layer 0 .*does not divide its 25x25 input"):
        ConvEncoder((1, 25, 25), channels=[4], kernel=4, stride=2, padding=1)
    with pytest.raises(ValueError, match="kernel has 1 entries but there are 2 layers"):
        ConvEncoder((1, 24, 24), channels=[4, 8], kernel=[4])
    with pytest.raises(ValueError, match="norm must be one of"):
        ConvEncoder((3, 8, 8), norm="batch")


def test_encoder_rejects_images_of_the_wrong_size():
    enc = ConvEncoder((3, 8, 8), depth=2)
    with pytest.raises(ValueError, match=r"expected images \(\.\.\., 3, 8, 8\), got shape \(2, 3, 16, 16\)"):
        enc(torch.zeros(2, 3, 16, 16, dtype=torch.uint8))
