"""DreamerV3(onehot_gather=True), the row-gather hot path, gives the losses of the dense path (docs/speed.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.envs.testing import random_batch
from reverie.models.onehot_linear import SplitFeat
from reverie.types import ActionSpec

DEBUG = dict(deter=32, stoch=4, classes=4, units=32, layers=1, horizon=4, precision="float32")  # size=debug


def make_batch(seed: int, image: bool) -> dict[str, np.ndarray]:
    batch = random_batch(8, 4, seed=seed)
    if image:
        batch["image"] = np.random.default_rng(seed).integers(0, 256, (8, 4, 3, 16, 16), dtype=np.uint8)
    return batch


def run(gather: bool, spec: ActionSpec, image: bool, updates: int = 3):
    torch.manual_seed(0)
    shapes = {"vector": (4,)} | ({"image": (3, 16, 16)} if image else {})
    agent = DreamerV3(shapes, spec, onehot_gather=gather, **(DEBUG | {"cnn_depth": 2}))
    metrics = []
    for i in range(updates):
        torch.manual_seed(100 + i)  # the same latent and action draws on both paths
        metrics.append(agent.update(make_batch(i, image)))
    return agent, metrics


@pytest.mark.parametrize("discrete, image", [(True, False), (False, False), (True, True)])
def test_gather_path_gives_the_dense_losses(discrete, image):
    """Three updates (world model, imagination, actor, critic): every loss and metric, then every parameter,
    equal within 1e-5 relative in float32 (the paths differ only in float rounding; parameters also
    within 5e-6 absolute)."""
    spec = ActionSpec(discrete, 2)
    fast, fast_metrics = run(True, spec, image)
    dense, dense_metrics = run(False, spec, image)
    assert fast.wm.rssm.onehot_gather and not dense.wm.rssm.onehot_gather
    for got, want in zip(fast_metrics, dense_metrics):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    for (name, p), q in zip(fast.named_parameters(), dense.parameters()):  # atol: Adam steps near-zero
        torch.testing.assert_close(p, q, rtol=1e-5, atol=5e-6, msg=name)  # weights by ~lr whatever their rounding


def test_heads_see_split_features_only_on_the_gather_path():
    seen = []
    for gather in (True, False):
        torch.manual_seed(0)
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), onehot_gather=gather, **DEBUG)
        head = agent.critic.forward
        agent.critic.forward = lambda x, head=head: seen.append(type(x)) or head(x)
        agent.update(random_batch(8, 4, seed=0))
    assert seen == [SplitFeat, torch.Tensor]  # discrete actions: one critic pass per update


def test_gather_is_the_default_and_compile_traces_the_dense_path(monkeypatch):
    import reverie.agents.dreamer as dreamer

    assert DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **DEBUG).wm.rssm.onehot_gather
    monkeypatch.setattr(dreamer.DreamerV3, "_compile", lambda self: False)  # only the construction is checked
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), compile=True, **DEBUG)
    assert not agent.wm.rssm.onehot_gather
