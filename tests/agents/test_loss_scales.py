"""Every agent's one loss function and its scale table, checked against each other as a set at construction (the
official ``agent.py:237-238`` asserts it): ``rec`` spread over the decoded keys, the objectives not chosen dropped,
a loss without a scale or a scale of no loss refused with the keys and the config key named."""

from functools import partial

import numpy as np
import pytest

from reverie.agents import DreamerV3, DreamerV3_2025, PlaNet
from reverie.agents.dreamer import LOSS_SCALES
from reverie.models.dynamics import GaussianRSSM
from reverie.types import ActionSpec

from helpers.agents import dreamer, planet

SHAPES = {"vector": (4,), "image": (3, 16, 16)}
TINY_2025 = dict(dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4), units=8, cnn_depth=2,
                 cnn={"min_res": 4})


def test_the_2023_table_for_each_objective():
    base = {"reward": 1.0, "cont": 1.0, "dyn": 0.5, "rep": 0.1}
    agent = DreamerV3(SHAPES, ActionSpec(True, 2), **dreamer(cnn_depth=2))
    assert agent.loss_scales == base | {"image": 1.0, "vector": 1.0}
    agent = DreamerV3(SHAPES, ActionSpec(True, 2), representation="r2", **dreamer(cnn_depth=2))
    assert agent.loss_scales == base | {"barlow": 0.05}  # r2dreamer configs/model/_base_.yaml:22
    agent = DreamerV3(SHAPES, ActionSpec(True, 2), representation="infonce", **dreamer(cnn_depth=2))
    assert agent.loss_scales == base | {"infonce": 1.0}
    agent = DreamerV3(SHAPES, ActionSpec(True, 2), loss_scales={"rec": 0.5, "image": 2.0}, **dreamer(cnn_depth=2))
    assert agent.loss_scales == base | {"image": 2.0, "vector": 0.5}  # a decoded key's own entry wins over rec
    assert set(LOSS_SCALES) == {"rec", "barlow", "infonce", "reward", "cont", "dyn", "rep"}


def test_the_2025_table_for_each_objective():
    base = {"reward": 1.0, "cont": 1.0, "dyn": 1.0, "rep": 0.1, "policy": 1.0, "value": 1.0, "repval": 0.3}
    agent = DreamerV3_2025(SHAPES, ActionSpec(False, 2), representation="r2", **TINY_2025)
    assert agent.loss_scales == base | {"barlow": 0.05}
    assert not any("decoder" in name for name, _ in agent.named_parameters())


def test_planet_scales_every_loss_it_has():
    agent = PlaNet({"vector": (4,)}, ActionSpec(True, 2), **planet())
    assert agent.loss_scales == {"vector": 1.0, "reward": 10.0, "cont": 1.0, "kl": 1.0, "global_kl": 0.0}
    agent = PlaNet({"vector": (4,)}, ActionSpec(True, 2), **planet(overshooting=3))
    assert agent.loss_scales["overshooting"] == 1.0


@pytest.mark.parametrize("agent", ["2023", "2025"])
def test_a_scale_of_no_loss_is_refused(agent):
    build = (lambda **kw: DreamerV3(SHAPES, ActionSpec(True, 2), **dreamer(cnn_depth=2), **kw)) if agent == "2023" \
        else (lambda **kw: DreamerV3_2025(SHAPES, ActionSpec(True, 2), **TINY_2025, **kw))
    with pytest.raises(ValueError, match=r"agent.module.loss_scales keys \['bogus'\] are not losses of this agent"):
        build(loss_scales={"bogus": 1.0})
    with pytest.raises(ValueError, match=r"keys \['image'\] are not losses"):  # no decoder: no image loss to scale
        build(loss_scales={"image": 2.0}, representation="r2")


def test_a_loss_without_a_scale_is_refused_with_the_key_to_set():
    """A dynamics with losses of its own names (the Gaussian RSSM's kl, global_kl) under DreamerV3: before issue 29
    they got scale 1 silently."""
    gaussian = dreamer() | {"dynamics": partial(GaussianRSSM, deter=8, stoch=4, units=8)}
    with pytest.raises(ValueError, match=r"no scale for the losses \['kl', 'global_kl'\]: set "
                                         r"agent.module.loss_scales.kl, agent.module.loss_scales.global_kl"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **gaussian)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), loss_scales={"kl": 1.0, "global_kl": 0.0}, **gaussian)
    assert agent.loss_scales == {"vector": 1.0, "reward": 1.0, "cont": 1.0, "kl": 1.0, "global_kl": 0.0}
    with pytest.raises(ValueError, match=r"keys \['dyn'\] are not losses"):  # a given scale of no loss
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), loss_scales={"kl": 1.0, "global_kl": 0.0, "dyn": 0.5},
                  **gaussian)
    with pytest.raises(ValueError, match=r"no scale for the losses \['vector'\]: set agent.module.loss_scales.vector "
                                         r"\(the objective 'reconstruction' reads agent.module.loss_scales.rec\)"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), loss_scales={"rec": None}, **dreamer())


def test_a_loss_function_that_returns_other_keys_than_declared_stops_the_update():
    from reverie.envs.testing import random_batch

    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer())
    agent.wm.dynamics.loss_keys = ("dyn", "rep")
    real = agent.wm.dynamics.loss

    def extra(*args):
        losses, info = real(*args)
        return losses | {"new_term": losses["dyn"]}, info

    agent.wm.dynamics.loss = extra
    with pytest.raises(RuntimeError, match=r"the update's losses are .*'new_term'.*its scales are for"):
        agent.update(random_batch(4, 2, seed=0) | {"is_first": np.ones((4, 2), bool)})
