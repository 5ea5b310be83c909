"""reverie.agents.base.adam: the optimiser every agent steps, inside the update's autocast region."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reverie.agents.base import adam
from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec
from helpers.agents import dreamer


def test_forward_after_a_step_in_the_same_autocast_region_reads_the_new_weights():
    """Autocast caches one bf16 copy of each float32 parameter per region; a step inside the region must drop it,
    or the next forward pass computes with the weights of before the step."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    x = torch.randn(5, 8)
    opt = adam(layer.parameters(), lr=0.1, eps=1e-8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = layer(x)
        before.float().square().sum().backward()
        opt.step()
        after = layer(x)
    expected = F.linear(x.bfloat16(), layer.weight.detach().bfloat16(), layer.bias.detach().bfloat16())
    assert not torch.equal(after, before)  # lr 0.1 moves every weight by ~0.1
    assert torch.equal(after, expected)


def test_dreamer_imagines_with_the_world_model_of_after_its_step_in_bfloat16():
    """DreamerV3's update runs in one autocast region: world-model step, then imagination. A layer's bf16 weight
    seen in the rollout must be the stepped one (the reference imagines with the updated world model). ``in_a``
    (the action's input layer) is one that the world-model loss already ran through autocast."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(deter=16, units=16, horizon=3,
                                                                       precision="bfloat16"))
    linear = agent.wm.dynamics.in_a
    x = torch.randn(3, linear.in_features)
    seen = {}
    behavior = agent._behavior

    def check(start, start_cont):  # called after the world-model step, in the update's autocast region
        seen["rollout"] = linear(x)
        seen["fresh"] = F.linear(x.bfloat16(), linear.weight.detach().bfloat16())  # bias-free
        return behavior(start, start_cont)

    agent._behavior = check
    rng = np.random.default_rng(0)
    is_first = np.zeros((6, 3), bool)
    is_first[0] = True
    agent.update({"vector": rng.normal(size=(6, 3, 4)).astype(np.float32),
                  "prev_action": np.eye(2, dtype=np.float32)[rng.integers(2, size=(6, 3))] * ~is_first[..., None],
                  "reward": rng.normal(size=(6, 3)).astype(np.float32), "is_first": is_first,
                  "is_last": np.zeros((6, 3), bool), "is_terminal": np.zeros((6, 3), bool)})
    assert torch.equal(seen["rollout"], seen["fresh"])
