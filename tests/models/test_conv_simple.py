"""Image encoder and decoder of the current official DreamerV3 (rssm.py Encoder/Decoder, typ simple): stages,
shapes, output range and the block layout of the decoder's first map (bspace)."""

import pytest
import torch

from reverie.models.conv_simple import SimpleConvDecoder, SimpleConvEncoder, simple_stages


def test_encoder_stages_and_shapes():
    enc = SimpleConvEncoder((3, 64, 64), depth=4)
    assert enc.channels == [8, 12, 16, 16] and enc.out_shape == (16, 4, 4) and enc.out_dim == 256
    convs = [m for m in enc.layers if isinstance(m, torch.nn.Conv2d)]
    assert [c.kernel_size for c in convs] == [(5, 5)] * 4 and all(c.stride == (1, 1) for c in convs)
    x = torch.randint(0, 256, (2, 5, 3, 64, 64), dtype=torch.uint8)
    assert enc(x).shape == (2, 5, 256)
    small = SimpleConvEncoder((3, 16, 16), depth=4)  # two stages, the last multipliers: 16 -> 8 -> 4
    assert small.channels == [16, 16] and small.out_shape == (16, 4, 4)
    assert [simple_stages(s, 4) for s in (8, 16, 32, 64, 96)] == [1, 2, 3, 4, 4]
    with pytest.raises(ValueError, match="image side"):
        simple_stages(6, 4)


def test_decoder_shapes_and_range():
    torch.manual_seed(0)
    dec = SimpleConvDecoder(deter=32, stoch=12, out_shape=(3, 64, 64), depth=4, units=8)
    with torch.no_grad():
        out = dec(torch.randn(2, 5, 44))
    assert out.shape == (2, 5, 3, 64, 64) and float(out.min()) > -0.5 and float(out.max()) < 0.5  # sigmoid - 0.5
    with pytest.raises(ValueError, match="bspace"):
        SimpleConvDecoder(deter=30, stoch=12, out_shape=(3, 64, 64), depth=4, units=8)


def test_decoder_first_map_puts_block_g_into_channels_g():
    """sp0 rearranges (g h w c) -> h w (g c): block g of the deterministic layer fills channels g*c .. g*c + c-1."""
    dec = SimpleConvDecoder(deter=16, stoch=4, out_shape=(1, 16, 16), depth=4, units=2, bspace=8)  # map (16, 4, 4)
    c, h, w = 16 // 8, 4, 4
    with torch.no_grad():
        dec.space_deter.weight.zero_()
        dec.space_deter.bias.copy_(torch.arange(8 * h * w * c, dtype=torch.float32))
        for p in dec.space_stoch.parameters():
            p.zero_()
    seen = {}
    dec.space_norm.register_forward_pre_hook(lambda module, args: seen.setdefault("x", args[0]))
    dec(torch.zeros(1, 20))
    x = seen["x"][0]  # (C', h, w)
    for g in range(8):
        for j in range(c):
            want = torch.tensor([[g * h * w * c + (i * w + k) * c + j for k in range(w)] for i in range(h)],
                                dtype=torch.float32)
            assert torch.equal(x[g * c + j], want)


def _conv_dtypes(module: torch.nn.Module, x: torch.Tensor) -> set[torch.dtype]:
    """The dtypes of the outputs of ``module``'s ``Conv2d``/``ConvTranspose2d`` layers on ``x`` under bf16 autocast."""
    seen: set[torch.dtype] = set()
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype)) for m in module.modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        module(x)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("amx", [True, False])
def test_current_agent_convs_follow_autocast_on_amx_and_run_float32_elsewhere(monkeypatch, amx):
    """The 2025 stride-1 stacks keep bf16 autocast where the CPU has AMX (2x faster there); without AMX, and the
    2023 strided stacks always, run float32 on a CPU."""
    from reverie.models import conv_simple
    from reverie.models.conv import ConvDecoder, ConvEncoder
    monkeypatch.setattr(conv_simple, "cpu_has_amx", lambda: amx)  # read when the stacks are built
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    simple = SimpleConvEncoder((3, 16, 16), depth=4, mults=(1, 2))
    decoder = SimpleConvDecoder(deter=16, stoch=8, out_shape=(3, 16, 16), depth=4, mults=(1, 2), units=8, bspace=4)
    expected = {torch.bfloat16} if amx else {torch.float32}
    assert _conv_dtypes(simple, images) == expected
    assert _conv_dtypes(decoder, torch.randn(2, 24)) == expected
    assert _conv_dtypes(ConvEncoder((3, 16, 16), depth=4), images) == {torch.float32}
    assert _conv_dtypes(ConvDecoder(24, (3, 16, 16), depth=4), torch.randn(2, 24)) == {torch.float32}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = decoder(torch.randn(2, 24))
    assert out.shape == (2, 3, 16, 16) and torch.isfinite(out.float()).all()


def test_the_amx_probe_is_not_read_per_call(monkeypatch):
    """The probe runs when a stack is built, not in ``forward`` (there it would read /proc/cpuinfo inside a
    ``torch.compile`` trace and break the graph)."""
    from reverie.models import conv_simple
    calls = []
    monkeypatch.setattr(conv_simple, "cpu_has_amx", lambda: calls.append(1) or True)
    enc = SimpleConvEncoder((3, 16, 16), depth=4, mults=(1, 2))
    built = len(calls)
    enc(torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8))
    assert built == 1 and len(calls) == 1


def test_bf16_convs_stay_within_bf16_rounding_of_float32(monkeypatch):
    """The encoder's embedding under bf16 convs is the float32 one up to bf16 rounding (8 bits of mantissa: a
    relative error of order 2^-8 per product, a few per cent at most after four stages), not a different function."""
    from reverie.models import conv_simple
    monkeypatch.setattr(conv_simple, "cpu_has_amx", lambda: True)
    torch.manual_seed(0)
    enc = SimpleConvEncoder((3, 32, 32), depth=8, mults=(1, 2, 3))
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    exact = enc(images)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = enc(images).float()
    err = (low - exact).norm() / exact.norm()
    assert 1e-4 < err < 5e-2  # rounded (not float32), yet close
