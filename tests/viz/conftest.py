"""Shared fixtures of the viz tests: a tiny untrained DreamerV3 and replay-like batches."""

import numpy as np
import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec

from helpers.agents import dreamer


def tiny_agent(obs_shapes, actions=3, seed=0):
    torch.manual_seed(seed)
    return DreamerV3(obs_shapes, ActionSpec(True, actions), **dreamer(deter=16, units=16, horizon=15, cnn_depth=4))


def make_batch(obs_shapes, T=12, B=3, actions=3, seed=0):
    """A replay-like batch (T, B, ...): random pixels/vectors, one-hot prev_action, is_first at t = 0."""
    rng = np.random.default_rng(seed)
    batch = {}
    for key, shape in obs_shapes.items():
        if len(shape) == 3:
            batch[key] = rng.integers(0, 256, (T, B, *shape), dtype=np.uint8)
        else:
            batch[key] = rng.normal(size=(T, B, *shape)).astype(np.float32)
    batch["prev_action"] = np.eye(actions, dtype=np.float32)[rng.integers(0, actions, (T, B))]
    batch["is_first"] = np.zeros((T, B), bool)
    batch["is_first"][0] = True
    batch["prev_action"][0] = 0.0
    batch["reward"] = rng.normal(size=(T, B)).astype(np.float32)
    batch["is_terminal"] = np.zeros((T, B), bool)
    return batch


@pytest.fixture
def image_agent():
    return tiny_agent({"image": (3, 16, 16), "vector": (2,)})


@pytest.fixture
def image_batch():
    return make_batch({"image": (3, 16, 16), "vector": (2,)})


@pytest.fixture(name="tiny_agent")
def tiny_agent_factory():
    return tiny_agent


@pytest.fixture(name="make_batch")
def make_batch_factory():
    return make_batch
