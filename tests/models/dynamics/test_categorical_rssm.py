"""DreamerV3's categorical RSSM (reverie/models/dynamics/categorical.py), its readable path and its kernels."""

import pytest
import torch

from reverie.models.dynamics import CategoricalRSSM, GRUCell
from reverie.models.kernels import install
from reverie.models.kernels.onehot_linear import OneHotFeatures


def make(action_dim=2, embed=6, kernels="off"):
    torch.manual_seed(0)
    rssm = CategoricalRSSM(action_dim, embed, deter=16, stoch=4, classes=5, units=16)
    install(rssm, kernels)  # as an agent does after building its modules
    return rssm


@pytest.mark.parametrize("T,B", [(1, 1), (4, 3), (9, 2)])
def test_observe_and_imagine_shapes(T, B):
    rssm = make()
    post, prior = rssm.observe(torch.randn(T, B, 6), torch.zeros(T, B, 2), torch.zeros(T, B, dtype=torch.bool))
    for s in (post, prior):
        assert s["deter"].shape == (T, B, 16) and s["stoch"].shape == (T, B, 4, 5) and s["logits"].shape == (T, B, 4, 5)
    assert rssm.features(post).shape == (T, B, 16 + 20)
    split = make(kernels="auto").features(post)  # the same dense features, marked one-hot in the tail
    assert type(split) is OneHotFeatures and torch.equal(split, rssm.features(post))
    assert torch.equal(split.parts()[2], post["stoch"].argmax(-1)) and type(split - 1.0) is torch.Tensor
    start = {k: v.flatten(0, 1) for k, v in post.items()}  # (T, B, ...) -> (T*B, ...)
    states, actions = rssm.imagine(lambda s: torch.zeros(s["deter"].shape[0], 2), start, horizon=3)
    assert states["deter"].shape == (4, T * B, 16) and actions.shape == (4, T * B, 2)
    torch.testing.assert_close(states["deter"][0], start["deter"])


def test_is_first_resets_state_regardless_of_history():
    rssm = make()
    T = 6
    embed = torch.randn(T, 2, 6)
    embed[3:, 1] = embed[3:, 0]  # same observations from t=3 on, different before
    action = torch.randn(T, 2, 2)
    action[3:, 1] = action[3:, 0]
    action[:3, 1] = -action[:3, 0]  # different previous actions, including the one fed at t=3
    is_first = torch.zeros(T, 2, dtype=torch.bool)
    is_first[0] = True
    is_first[3] = True
    post, prior = rssm.observe(embed, action, is_first, sample=False)
    assert not torch.equal(post["deter"][2, 0], post["deter"][2, 1])  # histories differ before the reset
    for key in ("deter", "stoch", "logits"):
        torch.testing.assert_close(post[key][3:, 0], post[key][3:, 1], rtol=0, atol=0)
        torch.testing.assert_close(prior[key][3:, 0], prior[key][3:, 1], rtol=0, atol=0)


def test_is_first_matches_a_fresh_start():
    rssm = make()
    embed, action = torch.randn(4, 1, 6), torch.randn(4, 1, 2)
    first = torch.tensor([[False], [False], [True], [False]])
    post, _ = rssm.observe(embed, action, first, sample=False)
    fresh, _ = rssm.observe(embed[2:], torch.zeros_like(action[2:]), torch.tensor([[True], [False]]), sample=False)
    fresh_action = action[2:].clone()
    fresh_action[0] = 0.0
    fresh2, _ = rssm.observe(embed[2:], fresh_action, torch.tensor([[True], [False]]), sample=False)
    # different sequence lengths change matmul blocking, so equal up to float32 rounding
    torch.testing.assert_close(post["deter"][2:], fresh2["deter"], rtol=0, atol=1e-6)
    torch.testing.assert_close(post["deter"][2], fresh["deter"][0], rtol=0, atol=1e-6)


def test_initial_state_is_learned():
    rssm = make()
    init = rssm.initial(3)
    assert init["deter"].shape == (3, 16) and init["stoch"].shape == (3, 4, 5)
    assert torch.all(init["stoch"].sum(-1) == 1.0)
    init["deter"].sum().backward()
    assert rssm.initial_deter.grad is not None


@pytest.mark.parametrize("grad", [False, True])
def test_imagination_with_the_input_layer_by_gathers_equals_the_readable_rollout(grad):
    """kernels: from 256 rows on the fused RSSM's input layer reads the latent by class index; the rollout (deter,
    latents, actions) is the readable one's, draw for draw, and the one-hot gathers ran."""
    import reverie.models.kernels.onehot_linear as onehot_linear

    fast, plain = make(kernels="auto"), make(kernels="off")
    assert type(fast.in_z) is onehot_linear.OneHotLinear and type(plain.in_z) is torch.nn.Linear
    post, _ = plain.observe(torch.randn(2, 130, 6), torch.zeros(2, 130, 2), torch.zeros(2, 130, dtype=torch.bool))
    start = {k: v.flatten(0, 1).detach() for k, v in post.items()}  # 260 rows

    def policy(state):
        action = torch.nn.functional.one_hot(state["stoch"].argmax(-1)[:, 0] % 2, 2).float()
        return action + 0.01 * state["deter"][:, :2]

    calls = []
    forward = onehot_linear._OneHotLinear.forward
    onehot_linear._OneHotLinear.forward = staticmethod(lambda *a: calls.append(1) or forward(*a))
    try:
        with torch.set_grad_enabled(grad):
            torch.manual_seed(5)
            fused, a1 = fast.imagine(policy, start, horizon=6)
            torch.manual_seed(5)
            readable, a2 = plain.imagine(policy, start, horizon=6)
    finally:
        onehot_linear._OneHotLinear.forward = staticmethod(forward)
    assert len(calls) == 6 and torch.equal(a1, a2)
    assert torch.equal(fused["stoch"], readable["stoch"])
    torch.testing.assert_close(fused["deter"], readable["deter"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("given_state", [False, True])
@pytest.mark.parametrize("firsts", [[], [0], [0, 3], [2]])
def test_skipping_the_reset_arithmetic_on_steps_without_is_first_changes_nothing(firsts, given_state):
    """The fused scan (kernels) skips `x * keep + init * first` where no row starts an episode; the readable loop
    resets on every step: the same states and gradients, the learned initial state's included (zero, not None)."""
    results = []
    for kernels in ("auto", "off"):
        rssm = make(kernels=kernels)
        embed = torch.randn(5, 3, 6, generator=torch.Generator().manual_seed(1))
        is_first = torch.zeros(5, 3, dtype=torch.bool)
        for t in firsts:
            is_first[t, t % 3] = True
        state = {"deter": torch.full((3, 16), 0.5), "stoch": torch.eye(5)[torch.zeros(3, 4, dtype=torch.long)]}
        torch.manual_seed(2)
        post, _ = rssm.observe(embed, torch.zeros(5, 3, 2), is_first, state if given_state else None)
        (post["deter"].sum() + (post["stoch"] * torch.arange(5.0)).sum()).backward()
        results.append((post, {k: v.grad for k, v in rssm.named_parameters()}))
    (post_a, grads_a), (post_b, grads_b) = results
    for key in ("deter", "stoch", "logits"):
        assert torch.equal(post_a[key], post_b[key]), key
    assert grads_a.keys() == grads_b.keys()
    for key in grads_a:
        assert (grads_a[key] is None) == (grads_b[key] is None), key
        if grads_a[key] is not None:
            torch.testing.assert_close(grads_a[key], grads_b[key], rtol=1e-5, atol=1e-5, msg=key)  # summation order
    assert grads_a["initial_deter"] is not None


def test_gru_keeps_a_float32_state_under_bf16_autocast():
    """Under bf16 autocast the gates are bf16 but the state is mixed as it is: ``u * c + (1 - u) * h`` (as
    ``lerp(h, c, u)``) with a float32 ``h`` gives a float32 state (not rounded to bf16: measured to learn CartPole
    worse, docs/changelog.md)."""
    torch.manual_seed(0)
    cell = GRUCell(6, 8)
    x, h = torch.randn(5, 6), torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new = cell(x, h)
        parts = cell.norm(cell.linear(torch.cat([x, h], -1)))
    reset, cand, update = parts.chunk(3, -1)
    cand, update = torch.tanh(torch.sigmoid(reset) * cand), torch.sigmoid(update - 1.0)
    assert parts.dtype == torch.bfloat16 and new.dtype == torch.float32
    assert torch.equal(new, torch.lerp(h, cand.float(), update.float()))
    u, c = update.float(), cand.float()
    torch.testing.assert_close(new, u * c + (1.0 - u) * h, rtol=0, atol=1e-6)  # the reference's formula, in float32
    assert not torch.equal(new.bfloat16().float(), new)  # not rounded to bf16


def test_gru_promotes_mixed_input_dtypes_outside_autocast():
    """Outside autocast the concatenation promotes (a float64 cell with a float32 input runs in float64)."""
    torch.manual_seed(0)
    cell = GRUCell(6, 8).double()
    x, h = torch.randn(5, 6), torch.randn(5, 8, dtype=torch.float64)
    out = cell(x, h)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, cell(x.double(), h))


def test_features_of_edited_imagined_states_follow_the_edit():
    """kernels: imagine's states without autograd are views of one buffer; the features read them as they are now,
    also after an edit of a latent group, and a layer gathering from them gives the dense product."""
    from reverie.models.kernels.onehot_linear import OneHotLinear

    fast = make(kernels="auto").double()
    post, _ = fast.observe(torch.randn(2, 150, 6).double(), torch.zeros(2, 150, 2).double(),
                           torch.zeros(2, 150, dtype=torch.bool))
    start = {k: v.flatten(0, 1).detach() for k, v in post.items()}  # 300 rows
    with torch.no_grad():
        states, _ = fast.imagine(lambda s: torch.zeros(s["deter"].shape[0], 2).double(), start, horizon=3)
        states["stoch"][:, :, 0] = torch.nn.functional.one_hot(torch.tensor(4), 5).double()  # edit group 0
        feat = fast.features(states)
        dense = torch.cat([states["deter"], states["stoch"].flatten(-2)], -1)
        layer = OneHotLinear(fast.feat_dim, 7).double()
        assert torch.equal(feat.as_subclass(torch.Tensor), dense)
        torch.testing.assert_close(layer(feat), torch.nn.functional.linear(dense, layer.weight, layer.bias))
