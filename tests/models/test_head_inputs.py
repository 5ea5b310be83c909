"""``head_inputs``: a head reads ``cat(h, z)``, ``h`` alone or ``z`` alone (STORM: reward and termination from ``h``,
the image from ``z``; issue 44). Checked by gradients: a head that reads one part has exactly zero gradient with
respect to the other, and the default (the counter-check) has a non-zero one with respect to both."""

import functools

import pytest
import torch

from reverie.models.dynamics import TransformerDynamics
from reverie.models.world_model import FeaturePart, WorldModel

D, S, K = 16, 4, 4


def _model(**head_inputs):
    torch.manual_seed(0)
    dynamics = functools.partial(TransformerDynamics, deter=D, stoch=S, classes=K, heads=2, context=4)
    wm = WorldModel({"image": (3, 16, 16), "vector": (3,)}, 2, dynamics=dynamics, units=8, cnn_depth=4,
                    mlp_units=8, mlp_layers=1, cnn={"min_res": 4}, head_inputs=head_inputs)
    with torch.no_grad():  # the reward head's last layer starts at zero (out_scale 0): give every weight a value
        for p in wm.parameters():
            p.normal_(0.0, 0.5)
    return wm


def _grads(out: torch.Tensor, feat: torch.Tensor) -> tuple[float, float]:
    """Largest |d out.sum() / d feat| over the deter columns and over the stoch columns."""
    (g,) = torch.autograd.grad(out.sum(), feat)
    return g[..., :D].abs().max().item(), g[..., D:].abs().max().item()


def test_each_head_reads_only_its_part():
    wm = _model(decoder="z", reward="h", cont="h")
    feat = torch.randn(3, D + S * K, requires_grad=True)
    reward_h, reward_z = _grads(wm.reward_head(feat), feat)
    cont_h, cont_z = _grads(wm.cont_head(feat), feat)
    image_h, image_z = _grads(wm.image_decoder(feat), feat)
    vector_h, vector_z = _grads(wm.decoder(feat), feat)
    assert reward_z == cont_z == image_h == vector_h == 0.0
    assert min(reward_h, cont_h, image_z, vector_z) > 0.0
    assert isinstance(wm.reward_head, FeaturePart) and (wm.reward_head.start, wm.reward_head.stop) == (0, D)
    assert (wm.image_decoder.start, wm.image_decoder.stop) == (D, D + S * K)


def test_the_default_heads_read_both_parts():
    wm = _model()
    feat = torch.randn(3, D + S * K, requires_grad=True)
    for out in (wm.reward_head(feat), wm.cont_head(feat), wm.image_decoder(feat), wm.decoder(feat)):
        h, z = _grads(out, feat)
        assert h > 0.0 and z > 0.0
    assert not any(isinstance(m, FeaturePart) for m in wm.modules())  # the default model is built as before


def test_bad_head_inputs_are_refused_naming_the_entry():
    with pytest.raises(ValueError, match="head_inputs maps .*; bad: reward: 'hidden'$"):
        _model(reward="hidden")
    with pytest.raises(ValueError, match="bad: value: 'h'$"):
        _model(value="h", reward="h")
    with pytest.raises(ValueError, match=r"bad: 'h' \(not a mapping\)"):
        WorldModel({"vector": (3,)}, 2, units=8, layers=1, head_inputs="h")


def test_a_loss_runs_with_partial_heads():
    wm = _model(decoder="z", reward="h", cont="h")
    T, B = 3, 2
    batch = {"image": torch.randint(0, 256, (T, B, 3, 16, 16), dtype=torch.uint8), "vector": torch.randn(T, B, 3),
             "prev_action": torch.zeros(T, B, 2), "reward": torch.zeros(T, B),
             "is_first": torch.zeros(T, B, dtype=torch.bool), "is_terminal": torch.zeros(T, B)}
    losses, *_ = wm.loss(batch)
    assert set(losses) == {"image", "vector", "reward", "cont", "dyn", "rep"}
    assert all(v.shape == (T, B) and torch.isfinite(v).all() for v in losses.values())
