"""The representation objectives (reverie/models/representation.py): their values on cases computed by hand and
against a plain loop implementation, where their gradients go (R2-Dreamer: the projector and, through the posterior,
the dynamics and the encoder; never the encoder through the target embedding), what stays of the world model (the
reward and continue heads and the KL terms are the same losses), the settings' checks, and checkpoints written
before the decoders belonged to the objective."""

import math
from functools import partial

import numpy as np
import pytest
import torch

from reverie.models.dynamics import CategoricalRSSM
from reverie.models.representation import (BarlowTwins, InfoNCE, Reconstruction, barlow_twins, check_objectives,
                                           info_nce)
from reverie.models.world_model import NoDecoder, WorldModel
from reverie.models.world_model_2025 import world_model_2025


def rssm():
    return partial(CategoricalRSSM, deter=16, stoch=4, classes=5, units=16, kernels="off")


def batch(T=6, B=5, seed=0, image=False):
    g = torch.Generator().manual_seed(seed)
    out = {"vector": torch.randn(T, B, 4, generator=g), "prev_action": torch.zeros(T, B, 3),
           "is_first": torch.zeros(T, B, dtype=torch.bool), "reward": torch.randn(T, B, generator=g),
           "is_terminal": torch.zeros(T, B, dtype=torch.bool)}
    out["is_first"][0] = True
    if image:
        out["image"] = torch.randint(0, 256, (T, B, 3, 16, 16), generator=g, dtype=torch.uint8)
    return out


# ------------------------------------------------------------------------------------------- values by hand
def test_barlow_twins_on_two_rows_by_hand():
    """N = 2 rows, E = 2: every standardised column is (-1/sqrt 2, 1/sqrt 2) (std with N - 1 = 1: sqrt 2), so each
    c_ij = (z_0i z_0j + z_1i z_1j) / 2 = +-0.5."""
    x = torch.tensor([[0.0, 0.0], [2.0, 2.0]])  # both columns increase
    loss, invariance, redundancy = barlow_twins(x, x, lambd=0.1)
    # c = [[.5, .5], [.5, .5]]: invariance 2 (0.5 - 1)^2 = 0.5, redundancy 2 * 0.25 = 0.5
    assert invariance.item() == pytest.approx(0.5, rel=1e-6) and redundancy.item() == pytest.approx(0.5, rel=1e-6)
    assert loss.item() == pytest.approx(0.5 + 0.1 * 0.5, rel=1e-6)
    y = torch.tensor([[2.0, 0.0], [0.0, 2.0]])  # column 0 decreases: c = [[-.5, .5], [-.5, .5]]
    loss, invariance, redundancy = barlow_twins(x, y, lambd=0.1)
    assert invariance.item() == pytest.approx(1.5 ** 2 + 0.5 ** 2, rel=1e-6)  # (-0.5 - 1)^2 + (0.5 - 1)^2
    assert redundancy.item() == pytest.approx(0.5, rel=1e-6)
    assert loss.item() == pytest.approx(2.5 + 0.05, rel=1e-6)


def plain_barlow(x1: np.ndarray, x2: np.ndarray, lambd: float, eps: float = 1e-8) -> float:
    """The reference's formula (r2dreamer dreamer.py:391-398) as loops over the entries, in float64."""
    n, e = x1.shape
    z1 = (x1 - x1.mean(0)) / (x1.std(0, ddof=1) + eps)
    z2 = (x2 - x2.mean(0)) / (x2.std(0, ddof=1) + eps)
    total = 0.0
    for i in range(e):
        for j in range(e):
            c = sum(z1[k, i] * z2[k, j] for k in range(n)) / n
            total += (c - 1.0) ** 2 if i == j else lambd * c ** 2
    return total


def test_barlow_twins_equals_the_reference_formula_written_as_loops():
    rng = np.random.default_rng(3)
    x1, x2 = rng.normal(size=(7, 5)), rng.normal(size=(7, 5)) + rng.normal(size=(1, 5))
    loss, _, _ = barlow_twins(torch.tensor(x1), torch.tensor(x2), lambd=5e-4)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(plain_barlow(x1, x2, 5e-4), rel=1e-12)
    loss32, _, _ = barlow_twins(torch.tensor(x1, dtype=torch.float32), torch.tensor(x2, dtype=torch.float32), 5e-4)
    assert loss32.item() == pytest.approx(plain_barlow(x1, x2, 5e-4), rel=1e-5)


def test_under_bf16_autocast_the_invariance_term_keeps_float32_accuracy():
    """R2-Dreamer's formula reads the invariance term off the diagonal of ``z1^T z2 / N``, a matrix product that bf16
    autocast computes in bf16 (8 significant bits): near c_ii = 1, where a trained model sits, ``(c_ii - 1)^2`` is
    then mostly rounding. :func:`barlow_twins` computes the diagonal as an elementwise sum in float32; its error
    against float64 must be far below the formula's in bf16 (the counter-check: that formula, as written)."""
    rng = np.random.default_rng(0)
    x1 = rng.normal(size=(512, 64))
    x2 = x1 + 0.05 * rng.normal(size=(512, 64))  # c_ii ~ 0.9988: the invariance is 6.6e-4
    _, truth, _ = barlow_twins(torch.tensor(x1), torch.tensor(x2), 5e-4)  # float64
    a, b = torch.tensor(x1, dtype=torch.float32), torch.tensor(x2, dtype=torch.float32)
    with torch.autocast("cpu", torch.bfloat16):
        _, ours, _ = barlow_twins(a, b, 5e-4)
        z1, z2 = (a - a.mean(0)) / (a.std(0) + 1e-8), (b - b.mean(0)) / (b.std(0) + 1e-8)
        c = z1.T @ z2 / len(a)  # the reference's cross-correlation (dreamer.py:394), here in bf16
        formula = (c.diagonal().float() - 1.0).pow(2).sum()
    assert c.dtype == torch.bfloat16 and ours.dtype == torch.float32
    ours_error, formula_error = abs(ours.item() - truth.item()), abs(formula.item() - truth.item())
    assert ours_error < 1e-3 * truth.item()
    assert formula_error > 0.3 * truth.item()  # bf16 rounding of c_ii (steps of 2^-8 near 1) against 1 - c_ii ~ 3e-3


def test_info_nce_by_hand():
    eye = torch.eye(2)
    loss, accuracy = info_nce(eye, eye)  # logits = I: each row's own pair scores 1, the other 0
    torch.testing.assert_close(loss, torch.full((2,), math.log(1 + math.exp(-1))))
    assert accuracy.item() == 1.0
    loss, accuracy = info_nce(eye, eye.flip(0))  # each row's own pair scores 0, the other 1
    torch.testing.assert_close(loss, torch.full((2,), math.log(1 + math.e)))
    assert accuracy.item() == 0.0


def test_objective_modules_compute_their_formula_from_the_projected_features():
    torch.manual_seed(0)
    T, B, F, E = 3, 4, 6, 5
    feat, embed = torch.randn(T, B, F), torch.randn(T, B, E)
    r2 = BarlowTwins(F, E, lambd=0.2)
    losses, info = r2.loss(feat, embed, {})
    want, inv, red = barlow_twins(feat.flatten(0, 1) @ r2.projector.weight.T, embed.flatten(0, 1), 0.2)
    assert losses["barlow"].shape == (T, B)
    torch.testing.assert_close(losses["barlow"], want.expand(T, B))  # one batch statistic in every row
    torch.testing.assert_close(info["r2/invariance"], inv)
    torch.testing.assert_close(info["r2/redundancy"], red)
    assert r2.projector.bias is None  # Linear(F, E, bias=False), networks.py:383
    nce = InfoNCE(F, E)
    losses, _ = nce.loss(feat, embed, {})
    want, _ = info_nce(feat.flatten(0, 1) @ nce.projector.weight.T, embed.flatten(0, 1))
    torch.testing.assert_close(losses["infonce"], want.view(T, B))  # row t*B + b of the flat batch is (t, b)


def test_projector_init_is_the_fan_in_truncated_normal():
    torch.manual_seed(0)
    w = BarlowTwins(400, 300).projector.weight  # std sqrt(1 / fan_in), |w| <= 2 * 1.1368 / sqrt(fan_in)
    assert w.std().item() == pytest.approx(1 / math.sqrt(400), rel=0.02)
    assert w.abs().max().item() <= 2 * 1.1368 / math.sqrt(400) + 1e-7


# ------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("objective", [BarlowTwins, InfoNCE])
def test_the_target_embedding_gets_no_gradient(objective):
    """dreamer.py:389, 404 (`embed.detach()`, "this detach is important"): the loss depends on the embedding's
    value but sends it no gradient; the features and the projector get one."""
    torch.manual_seed(0)
    feat = torch.randn(4, 3, 6, requires_grad=True)
    embed = torch.randn(4, 3, 5, requires_grad=True)
    module = objective(6, 5)
    (key,) = module.loss_keys
    loss = module.loss(feat, embed, {})[0][key].mean()
    loss.backward()
    assert embed.grad is None
    assert feat.grad.abs().sum() > 0 and module.projector.weight.grad.abs().sum() > 0
    other = module.loss(feat.detach(), embed.detach() + torch.randn(4, 3, 5), {})[0][key].mean()
    assert other.item() != pytest.approx(loss.item())  # it is a function of the embedding all the same


def grads(loss, modules):
    out = {}
    for name, module in modules.items():
        g = torch.autograd.grad(loss, list(module.parameters()), retain_graph=True, allow_unused=True)
        out[name] = sum(float(x.abs().sum()) for x in g if x is not None)
    return out


@pytest.mark.parametrize("representation", ["r2", "infonce"])
def test_the_objective_trains_projector_dynamics_and_encoder_through_the_posterior_only(representation):
    torch.manual_seed(0)
    wm = WorldModel({"vector": (4,), "image": (3, 16, 16)}, 3, rssm(), units=16, layers=1, cnn_depth=2,
                    kernels="off", representation=representation)
    data = batch(image=True)
    losses, *_ = wm.loss(data)
    key = wm.representation.loss_keys[0]
    modules = {"encoder": wm.encoder, "image encoder": wm.image_encoder, "dynamics": wm.dynamics,
               "projector": wm.representation, "reward": wm.reward_head, "cont": wm.cont_head}
    g = grads(losses[key].mean(), modules)
    assert g["encoder"] > 0 and g["image encoder"] > 0 and g["dynamics"] > 0 and g["projector"] > 0
    assert g["reward"] == 0 and g["cont"] == 0  # the heads learn from their own losses only
    # the encoders' whole gradient goes through the posterior: with the posterior's input cut, none is left
    embed = wm.encode(data)
    post, _ = wm.dynamics.observe(embed.detach(), data["prev_action"], data["is_first"])
    cut = wm.representation.loss(wm.dynamics.features(post), embed, data)[0][key].mean()
    g = grads(cut, modules)
    assert g["encoder"] == 0 and g["image encoder"] == 0 and g["dynamics"] > 0


@pytest.mark.parametrize("model", ["2023", "2025"])
@pytest.mark.parametrize("representation", ["r2", "infonce"])
def test_heads_and_kl_terms_are_the_same_losses_whatever_the_objective(model, representation):
    """Only the objective's losses change: with the same encoder, dynamics and heads, and the same latent draws,
    reward, cont, dyn and rep equal the reconstruction model's (r2dreamer dreamer.py:369-374, 429-432)."""
    def build(rep):
        torch.manual_seed(0)
        if model == "2023":
            return WorldModel({"vector": (4,)}, 3, rssm(), units=16, layers=1, kernels="off", representation=rep)
        return world_model_2025({"vector": (4,)}, 3, dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4,
                                                         kernels="off"), units=8, kernels="off", representation=rep)

    recon, other = build("reconstruction"), build(representation)
    shared = {k: v for k, v in recon.state_dict().items() if not k.startswith("representation.")}
    missing, unexpected = other.load_state_dict(shared, strict=False)
    assert not unexpected and all(k.startswith("representation.") for k in missing)
    data = batch()
    torch.manual_seed(1)
    a = recon.loss(data)[0]
    torch.manual_seed(1)
    b = other.loss(data)[0]
    assert set(a) - set(b) == {"vector"} and set(b) - set(a) == set(other.representation.loss_keys)
    for key in ("reward", "cont", "dyn", "rep"):
        torch.testing.assert_close(a[key], b[key], msg=key)


# ------------------------------------------------------------------------------------------- the piece
def test_world_models_with_each_objective():
    for rep, keys, decodes in (("reconstruction", {"image", "vector"}, True), ("r2", {"barlow"}, False),
                               ("infonce", {"infonce"}, False)):
        wm = WorldModel({"vector": (4,), "image": (3, 16, 16)}, 3, rssm(), units=16, layers=1, cnn_depth=2,
                        kernels="off", representation=rep)
        assert set(wm.loss_keys) == keys | {"reward", "cont", "dyn", "rep"} and wm.decodes is decodes
        assert (wm.decoder is None) is (not decodes) and (wm.image_decoder is None) is (not decodes)
        losses, *_ = wm.loss(batch(image=True))
        assert set(losses) == set(wm.loss_keys) and all(v.shape == (6, 5) for v in losses.values())
        if not decodes:
            assert not any("decoder" in n for n, _ in wm.named_parameters())  # no decoder is built at all
            with pytest.raises(NoDecoder, match=f"objective is '{rep}'.*representation=reconstruction"):
                wm.decode(torch.zeros(2, wm.dynamics.feat_dim))


def test_settings_are_checked_in_every_block():
    assert check_objectives("r2", None, "X") == {"lambd": 5e-4, "eps": 1e-8}
    assert check_objectives("r2", {"r2": {"lambd": 1e-3}}, "X")["lambd"] == 1e-3
    assert check_objectives("reconstruction", {"r2": {"lambd": 1e-3}}, "X") == {}
    with pytest.raises(ValueError, match="representation must be one of reconstruction, r2, infonce, got 'r3'"):
        check_objectives("r3", None, "X")
    with pytest.raises(ValueError, match="objectives.r2 has no setting lamda; its settings are lambd, eps"):
        check_objectives("reconstruction", {"r2": {"lamda": 1.0}}, "X")  # not chosen, still checked
    with pytest.raises(ValueError, match="objectives.dreamerpro is no objective"):
        check_objectives("r2", {"dreamerpro": {}}, "X")
    with pytest.raises(ValueError, match="lambd >= 0"):
        WorldModel({"vector": (4,)}, 3, rssm(), units=16, layers=1, representation="r2",
                   objectives={"r2": {"lambd": -1.0}})
    assert isinstance(WorldModel({"vector": (4,)}, 3, rssm(), units=16, layers=1).representation, Reconstruction)


# ------------------------------------------------------------------------------------------- checkpoints
def legacy(state: dict, prefix: str = "") -> dict:
    """A state dict as written before issue 29: the decoders at ``image_decoder.*`` / ``decoder.*``."""
    old = prefix + "representation."
    return {(prefix + k[len(old):] if k.startswith(old) else k): v for k, v in state.items()}


@pytest.mark.parametrize("model", ["2023", "2025"])
def test_checkpoints_from_before_the_objective_load(model):
    def build(seed):
        torch.manual_seed(seed)
        shapes = {"vector": (4,), "image": (3, 16, 16)}
        if model == "2023":
            return WorldModel(shapes, 3, rssm(), units=16, layers=1, cnn_depth=2)
        return world_model_2025(shapes, 3, dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4), units=8,
                                cnn_depth=2, cnn={"min_res": 4})

    saved, fresh = build(0), build(1)
    old = legacy(saved.state_dict())
    assert any(k.startswith("image_decoder.") for k in old) and any(k.startswith("decoder.") for k in old)
    fresh.load_state_dict(old)  # strict
    for (name, p), q in zip(fresh.named_parameters(), saved.parameters()):
        assert torch.equal(p, q), name
    # the parameters keep the order they had (saved optimiser states are by position): decoders after the
    # dynamics, before the heads
    tops = list(dict.fromkeys(n.split(".")[0] if not n.startswith("representation.") else n.split(".")[1]
                              for n, _ in saved.named_parameters()))
    assert tops == ["image_encoder", "encoder", "dynamics", "image_decoder", "decoder", "reward_head", "cont_head"]


def test_an_agent_checkpoint_from_before_the_objective_loads_with_its_optimiser():
    from reverie.agents.dreamer import DreamerV3
    from reverie.types import ActionSpec
    from helpers.agents import dreamer

    def build(seed):
        torch.manual_seed(seed)
        return DreamerV3({"vector": (4,)}, ActionSpec(True, 3), **dreamer())

    saved = build(0)
    state = saved.state_dict()
    state["modules"] = legacy(state["modules"], "wm.")
    fresh = build(1)
    fresh.load_state_dict(state)
    for (name, p), q in zip(fresh.named_parameters(), saved.parameters()):
        assert torch.equal(p, q), name
