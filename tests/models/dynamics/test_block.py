"""The block-diagonal GRU RSSM of the current official DreamerV3 (danijar/dreamerv3 e3f0224 rssm.py): block linear
layers as block-diagonal dense layers, the GRU step written out densely, shapes, resets and action scaling."""

import math

import pytest
import torch
import torch.nn.functional as F

from reverie.models.block_linear import BlockLinear
from reverie.models.dynamics.block import BlockGRU, BlockRSSM


def rms(x, scale):
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-4) * scale


def dense(layer, x):  # NormDense written out: silu(rms(W x + b))
    linear, norm = layer[0], layer[1]
    return F.silu(rms(x @ linear.weight.T + linear.bias, norm.weight))


def test_block_linear_is_a_block_diagonal_dense_layer():
    torch.manual_seed(0)
    layer = BlockLinear(12, 8, blocks=4)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(5, 3, 12)
    weight = torch.block_diag(*layer.weight.unbind(0))  # (4 x (3, 2)) -> (12, 8)
    torch.testing.assert_close(layer(x), x @ weight + layer.bias, rtol=1e-6, atol=1e-6)
    assert layer(x).shape == (5, 3, 8)
    with pytest.raises(ValueError, match="multiples of blocks"):
        BlockLinear(10, 8, blocks=4)


def test_block_linear_init_uses_the_whole_input_as_fan_in():
    torch.manual_seed(0)
    layer = BlockLinear(4096, 512, blocks=8)  # per block 512 -> 64, fan_in 4096 (official compute_fans)
    w = layer.weight
    assert w.shape == (8, 512, 64) and torch.equal(layer.bias, torch.zeros(512))
    bound = 2 * 1.1368 / math.sqrt(4096)  # the unit normal is truncated at 2
    assert w.abs().max() <= bound
    assert abs(w.std().item() * math.sqrt(4096) - 1.0) < 0.02  # std sqrt(1 / fan_in) (1.1368 x 0.8796 = 1.0)


def gru_reference(core, deter, stoch, action):
    """The official _core (rssm.py:135-159) written out with dense matrices: block-diagonal weights on the
    input arranged per block as [deter block g, x0, x1, x2]."""
    g, D = core.blocks, core.deter
    x = torch.cat([dense(core.in_deter, deter), dense(core.in_stoch, stoch), dense(core.in_action, action)], -1)
    parts = [torch.cat([deter[:, k * D // g:(k + 1) * D // g], x], -1) for k in range(g)]
    h = torch.cat(parts, -1)
    hid, norm = core.hidden[0], core.hidden[1]
    h = F.silu(rms(h @ torch.block_diag(*hid.weight.unbind(0)) + hid.bias, norm.weight))
    gates = h @ torch.block_diag(*core.gates.weight.unbind(0)) + core.gates.bias  # (N, 3D), block k: [r_k, c_k, u_k]
    per = gates.view(-1, g, 3, D // g)
    reset, cand, update = (per[:, :, i].reshape(-1, D) for i in range(3))
    cand = torch.tanh(torch.sigmoid(reset) * cand)
    update = torch.sigmoid(update - 1)
    return update * cand + (1 - update) * deter


@pytest.mark.parametrize("blocks", [1, 4])
def test_block_gru_matches_the_dense_gru_written_out(blocks):
    torch.manual_seed(0)
    core = BlockGRU(deter=16, stoch=6, action_dim=3, hidden=5, blocks=blocks)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.1 * torch.randn_like(p))  # nonzero biases and norm scales
    deter, stoch, action = torch.randn(7, 16).tanh(), torch.randn(7, 6), torch.randn(7, 3)
    out = core(deter, stoch, action)
    assert out.shape == (7, 16)
    torch.testing.assert_close(out, gru_reference(core, deter, stoch, action), rtol=1e-5, atol=1e-6)


def test_one_block_gru_is_a_dense_gru_on_the_concatenation():
    """blocks=1: the block layers are plain dense layers on cat(deter, x0, x1, x2)."""
    torch.manual_seed(1)
    core = BlockGRU(deter=8, stoch=4, action_dim=2, hidden=3, blocks=1)
    assert core.hidden[0].weight.shape == (1, 8 + 3 * 3, 8) and core.gates.weight.shape == (1, 8, 24)
    deter, stoch, action = torch.randn(5, 8).tanh(), torch.randn(5, 4), torch.randn(5, 2)
    x = torch.cat([deter, dense(core.in_deter, deter), dense(core.in_stoch, stoch), dense(core.in_action, action)], -1)
    h = F.silu(rms(x @ core.hidden[0].weight[0] + core.hidden[0].bias, core.hidden[1].weight))
    reset, cand, update = (h @ core.gates.weight[0] + core.gates.bias).chunk(3, -1)
    update = torch.sigmoid(update - 1)
    want = update * torch.tanh(torch.sigmoid(reset) * cand) + (1 - update) * deter
    torch.testing.assert_close(core(deter, stoch, action), want, rtol=1e-5, atol=1e-6)


def test_block_gru_parameter_shapes_per_size():
    """size12m: deter 2048, hidden 256, 32 x 16 latents, 8 blocks: the GRU's block layers see 2048/8 + 3*256."""
    core = BlockGRU(deter=2048, stoch=32 * 16, action_dim=6, hidden=256, blocks=8)
    assert core.hidden[0].weight.shape == (8, 256 + 768, 256)
    assert core.gates.weight.shape == (8, 256, 768)
    assert core.in_stoch[0].weight.shape == (256, 512)
    with pytest.raises(ValueError, match="multiple of blocks"):
        BlockGRU(deter=100, stoch=4, action_dim=1, hidden=4, blocks=8)


def small_rssm(**kw):
    torch.manual_seed(0)
    return BlockRSSM(action_dim=2, embed_dim=5, deter=16, hidden=8, stoch=3, classes=4, blocks=4, **kw)


def test_observe_and_imagine_shapes():
    rssm = small_rssm()
    T, B = 6, 3
    embed, action = torch.randn(T, B, 5), torch.randn(T, B, 2)
    is_first = torch.zeros(T, B, dtype=torch.bool)
    post, prior = rssm.observe(embed, action, is_first)
    assert post["deter"].shape == (T, B, 16) and post["stoch"].shape == (T, B, 3, 4)
    assert post["logits"].shape == prior["logits"].shape == (T, B, 3, 4)
    assert torch.equal(post["stoch"].sum(-1), torch.ones(T, B, 3))  # one-hot
    assert rssm.features(post).shape == (T, B, 16 + 12) and rssm.feat_dim == 28
    start = {k: v.flatten(0, 1) for k, v in post.items()}  # (T, B, ...) -> (T*B, ...)
    states, actions = rssm.imagine(lambda s: torch.tanh(s["deter"][:, :2]), start, horizon=4)
    assert states["deter"].shape == (5, T * B, 16) and states["stoch"].shape == (5, T * B, 3, 4)
    assert actions.shape == (5, T * B, 2)
    assert torch.equal(states["deter"][0], start["deter"])
    losses, info = rssm.loss(post, prior)
    assert set(losses) == {"dyn", "rep"} and losses["dyn"].shape == (T, B) and bool((losses["dyn"] >= 1).all())
    assert set(info) == {"kl", "prior_entropy", "post_entropy"}


def test_is_first_resets_to_the_zero_state():
    rssm = small_rssm()
    embed, action = torch.randn(4, 2, 5), torch.randn(4, 2, 2)
    is_first = torch.tensor([[True, False], [False, False], [False, True], [False, False]])
    state = {"deter": torch.randn(2, 16), "stoch": torch.eye(4)[torch.randint(4, (2, 3))],
             "logits": torch.zeros(2, 3, 4)}
    a, _ = rssm.observe(embed, action, is_first, state, sample=False)
    b, _ = rssm.observe(embed, action, is_first, None, sample=False)
    # column 0 starts with is_first: the given state and the first action are dropped
    torch.testing.assert_close(a["deter"][:, 0], b["deter"][:, 0], rtol=0, atol=0)
    assert not torch.allclose(a["deter"][:2, 1], b["deter"][:2, 1])  # column 1 uses the given state until row 2
    # from row 2 on, column 1 restarted from zeros with a zero action: the same as a fresh observe from row 2
    c, _ = rssm.observe(embed[2:, 1:], action[2:, 1:], is_first[2:, 1:], None, sample=False)
    torch.testing.assert_close(a["deter"][2:, 1:], c["deter"], rtol=0, atol=1e-6)  # batch 2 vs 1: matmul rounding
    init = rssm.initial(3)
    assert all(bool((v == 0).all()) for v in init.values()) and init["deter"].shape == (3, 16)


def test_actions_enter_scaled_into_the_unit_box():
    rssm = small_rssm()
    state = {k: v[0] for k, v in rssm.observe(torch.randn(1, 2, 5), torch.zeros(1, 2, 2),
                                              torch.ones(1, 2, dtype=torch.bool))[0].items()}
    with torch.no_grad():
        inside = rssm.img_step(state, torch.tensor([[0.5, -1.0], [1.0, 1.0]]), sample=False)
        outside = rssm.img_step(state, torch.tensor([[0.5, -3.0], [7.0, 1.5]]), sample=False)
        other = rssm.img_step(state, torch.tensor([[0.5, -0.5], [1.0, 1.0]]), sample=False)
    torch.testing.assert_close(inside["deter"], outside["deter"], rtol=0, atol=0)
    assert not torch.allclose(inside["deter"][0], other["deter"][0])
