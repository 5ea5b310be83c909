"""The one switch, ``agent.module.kernels``: where it reaches, its default, its refusal of bad values, and compile
turning it off (compile traces the readable modules)."""

from __future__ import annotations

import inspect

import pytest
import torch

from reverie.agents.build import build_agent
from reverie.agents.dreamer import DreamerV3
from reverie.configs.compose import load_config
from reverie.envs.testing import random_batch
from reverie.models.dynamics import CategoricalRSSM
from reverie.models.kernels import FusedRSSM, OneHotLinear, resolve
from reverie.models.kernels.onehot_linear import OneHotFeatures
from reverie.types import ActionSpec

from helpers.agents import dreamer


@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_the_config_key_reaches_every_kernel(kernels):
    cfg = load_config(["exp=debug", f"agent.module.kernels={kernels}"])
    agent = build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(True, 2))
    on = kernels == "auto"
    assert type(agent.wm.dynamics) is (FusedRSSM if on else CategoricalRSSM)
    assert (type(agent.critic.hidden[0][0]) is OneHotLinear) is on  # a layer reading the features
    assert (OneHotLinear in {type(m) for m in agent.modules()}) is on


def test_heads_see_one_hot_features_only_with_kernels():
    seen = []
    for kernels in ("auto", "off"):
        torch.manual_seed(0)
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels=kernels))
        head = agent.critic.forward
        agent.critic.forward = lambda x, head=head: seen.append(type(x)) or head(x)
        agent.update(random_batch(8, 4, seed=0))
    assert seen == [OneHotFeatures, torch.Tensor]  # REINFORCE: one critic pass per update serves values and loss


def test_features_with_kernels_are_the_readable_tensor():
    """``features()`` of an agent built with kernels is a tensor (a subclass) equal to the readable ``cat``."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels="auto"))
    dynamics = agent.wm.dynamics
    post, _ = dynamics.observe(torch.randn(5, 3, dynamics.embed_dim), torch.zeros(5, 3, 2),
                               torch.zeros(5, 3, dtype=torch.bool))
    feat = dynamics.features(post)
    assert isinstance(feat, torch.Tensor) and type(feat) is OneHotFeatures
    assert torch.equal(feat, torch.cat([post["deter"], post["stoch"].flatten(-2)], -1))
    assert torch.equal(feat, CategoricalRSSM.features(dynamics, post))


def test_kernels_are_the_default_and_compile_turns_them_off(monkeypatch):
    assert load_config([]).agent.module.kernels == load_config(["agent=planet"]).agent.module.kernels == "auto"
    for factory in (DreamerV3, CategoricalRSSM):
        assert inspect.signature(factory).parameters["kernels"].default == "auto"
    monkeypatch.setattr(DreamerV3, "_compile", lambda self: False)  # only the construction is checked
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), compile=True, **dreamer())
    assert type(agent.wm.dynamics) is CategoricalRSSM
    assert {type(m) for m in agent.modules() if isinstance(m, torch.nn.Linear)} == {torch.nn.Linear}


def test_a_bad_value_is_refused_naming_the_key():
    assert resolve("auto") and not resolve("off")
    with pytest.raises(ValueError, match="agent.module.kernels=auto or off"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels="fast"))
