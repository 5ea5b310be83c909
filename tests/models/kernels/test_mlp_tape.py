"""MLPTape: an MLP's per-step forward passes without autograd, differentiated over all steps at once."""

import pytest
import torch

from reverie.models.kernels.mlp_tape import MLPTape
from reverie.models.networks import MLP
from reverie.models.kernels.onehot_linear import SplitFeat, take_split_features

STEPS, N, D, S, K = 4, 6, 5, 3, 4


def features(dtype, split):
    torch.manual_seed(1)
    deter = torch.randn(STEPS + 1, N, D, dtype=dtype)
    index = torch.randint(0, K, (STEPS + 1, N, S))
    feat = SplitFeat(deter, None, index, K)
    return [feat[t] if split else feat[t].dense() for t in range(STEPS + 1)]


def stacked(steps):
    if isinstance(steps[0], SplitFeat):
        return SplitFeat(torch.stack([x.deter for x in steps]), None, torch.stack([x.index for x in steps]), K)
    return torch.stack(steps)


def grads_of(loss, mlp):
    return torch.autograd.grad(loss, list(mlp.parameters()))


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_replay_equals_a_fresh_forward_pass_and_its_gradients_in_float64(split, layers):
    torch.manual_seed(0)
    mlp = take_split_features(MLP(D + S * K, 3, units=8, layers=layers)).double()  # as install makes it
    torch.nn.init.normal_(mlp.out.weight)  # not the zero init of some heads: every gradient is nonzero
    for p in mlp.parameters():  # LayerNorm affine off its (1, 0) init, so its gradients matter
        p.data.add_(0.1 * torch.randn_like(p))
    steps = features(torch.float64, split)
    tape = MLPTape(mlp, STEPS)
    recorded = [tape(x) for x in steps]  # STEPS + 1 passes, as a rollout of horizon STEPS makes
    for x, out in zip(steps, recorded):
        torch.testing.assert_close(out, mlp(x), rtol=0, atol=0)
    weight = torch.randn(STEPS, N, 3, dtype=torch.float64)
    inputs = stacked(steps[:STEPS])
    replayed = tape.replay(inputs)  # (STEPS, N, 3), the first STEPS passes
    fresh = mlp(inputs.dense() if split else inputs)
    torch.testing.assert_close(replayed, fresh)
    got = grads_of((replayed.tanh() * weight).sum(), mlp)
    want = grads_of((fresh.tanh() * weight).sum(), mlp)
    for (name, _), g, w in zip(mlp.named_parameters(), got, want):
        assert float(w.abs().max()) > 0, name
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=name)


def test_replay_in_bfloat16_autocast_matches_autograd():
    torch.manual_seed(0)
    mlp = take_split_features(MLP(D + S * K, 3, units=16, layers=2))
    torch.nn.init.normal_(mlp.out.weight)
    steps = features(torch.bfloat16, True)
    tape = MLPTape(mlp, STEPS)
    weight = torch.randn(STEPS, N, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        recorded = [tape(x) for x in steps]
        replayed = tape.replay(stacked(steps[:STEPS]))
        fresh = torch.stack([mlp(x) for x in steps[:STEPS]])
        assert replayed.dtype == torch.bfloat16 and torch.equal(replayed, fresh)
        assert torch.equal(replayed, torch.stack(recorded[:STEPS]))
        got = grads_of((replayed.float().tanh() * weight).sum(), mlp)
        want = grads_of((fresh.float().tanh() * weight).sum(), mlp)
    for (name, _), g, w in zip(mlp.named_parameters(), got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2 * float(w.abs().max()), msg=name)


def test_replay_asks_for_recorded_steps_only_and_supported_mlps():
    mlp = MLP(4, 2, units=8, layers=1)
    tape = MLPTape(mlp, 2)
    tape(torch.randn(3, 4))
    with pytest.raises(ValueError, match="1 of 2 calls recorded"):
        tape.replay(torch.randn(2, 3, 4))
    tape(torch.randn(3, 4))
    with pytest.raises(ValueError, match="inputs of 3 steps"):
        tape.replay(torch.randn(3, 3, 4))
    with pytest.raises(TypeError, match="output layer"):
        MLPTape(MLP(4, None, units=8, layers=1), 2)


def test_replay_refuses_parameters_changed_in_place_and_a_cleared_tape():
    """As autograd's saved-tensor check: an optimiser step between the rollout and the backward pass would
    otherwise mix the old activations with the new weights without a word."""
    mlp = MLP(4, 2, units=8, layers=1)
    tape = MLPTape(mlp, 1)
    tape(torch.randn(3, 4))
    out = tape.replay(torch.randn(1, 3, 4))
    with torch.no_grad():
        mlp.out.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()
    tape = MLPTape(mlp, 1)
    tape(torch.randn(3, 4))
    out = tape.replay(torch.randn(1, 3, 4))
    tape.clear()
    with pytest.raises(RuntimeError, match="after clear"):
        out.sum().backward()
