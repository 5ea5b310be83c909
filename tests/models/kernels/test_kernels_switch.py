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
from reverie.models.kernels import resolve
from reverie.models.kernels.onehot_linear import SplitFeat
from reverie.types import ActionSpec

from helpers.agents import dreamer


@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_the_config_key_reaches_every_kernel(kernels):
    cfg = load_config(["exp=debug", f"agent.module.kernels={kernels}"])
    agent = build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(True, 2))
    on = kernels == "auto"
    assert agent.fast is on and agent.wm.fast is on and (agent.wm.dynamics.kernels is not None) is on


def test_heads_see_split_features_only_with_kernels():
    seen = []
    for kernels in ("auto", "off"):
        torch.manual_seed(0)
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels=kernels))
        head = agent.critic.forward
        agent.critic.forward = lambda x, head=head: seen.append(type(x)) or head(x)
        agent.update(random_batch(8, 4, seed=0))
    assert seen == [SplitFeat, torch.Tensor]  # REINFORCE: one critic pass per update serves values and loss


def test_kernels_are_the_default_and_compile_turns_them_off(monkeypatch):
    assert load_config([]).agent.module.kernels == load_config(["agent=planet"]).agent.module.kernels == "auto"
    for factory in (DreamerV3, CategoricalRSSM):
        assert inspect.signature(factory).parameters["kernels"].default == "auto"
    monkeypatch.setattr(DreamerV3, "_compile", lambda self: False)  # only the construction is checked
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), compile=True, **dreamer())
    assert not agent.fast and agent.wm.dynamics.kernels is None


def test_a_bad_value_is_refused_naming_the_key():
    assert resolve("auto") and not resolve("off")
    with pytest.raises(ValueError, match="agent.module.kernels=auto or off"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels="fast"))
