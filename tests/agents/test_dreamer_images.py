"""DreamerV3 with image and vector observations: one scaling path for training, acting and evaluation."""

import numpy as np
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec
from helpers.agents import dreamer

TINY = dreamer(deter=16, units=16, horizon=3, cnn_depth=2)
SHAPES = {"image": (3, 16, 16), "vector": (4,)}


def image_batch(T=4, B=2, A=2, seed=0):
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    return {"image": rng.integers(0, 256, (T, B, 3, 16, 16), dtype=np.uint8),
            "vector": rng.normal(size=(T, B, 4)).astype(np.float32),
            "prev_action": np.eye(A, dtype=np.float32)[rng.integers(A, size=(T, B))] * ~is_first[..., None],
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}


def test_uint8_images_reach_the_encoder_identically_when_training_acting_and_evaluating():
    torch.manual_seed(0)
    agent = DreamerV3(SHAPES, ActionSpec(True, 2), **TINY)
    seen = []
    agent.wm.image_encoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    data = image_batch()
    metrics = agent.update(data)
    assert np.isfinite(metrics["loss/image"]) and np.isfinite(metrics["loss/vector"])
    obs = {"image": data["image"][1], "vector": data["vector"][1], "is_first": np.ones(2, bool)}  # (N=2, ...)
    agent.act(obs, None, "explore")
    agent.act(obs, None, "eval")
    train_in, explore_in, eval_in = seen
    assert train_in.dtype == explore_in.dtype == eval_in.dtype == torch.uint8
    assert train_in.shape == (4, 2, 3, 16, 16) and explore_in.shape == eval_in.shape == (1, 2, 3, 16, 16)
    assert torch.equal(train_in[1], explore_in[0]) and torch.equal(explore_in, eval_in)


def test_image_agent_state_dict_round_trip():
    torch.manual_seed(0)
    agent = DreamerV3(SHAPES, ActionSpec(False, 2), **TINY, cnn={"kernel": 4, "stride": 2, "padding": 1})
    agent.update(image_batch())
    other = DreamerV3(SHAPES, ActionSpec(False, 2), **TINY)
    other.load_state_dict(agent.state_dict())
    obs = {"image": np.full((1, 3, 16, 16), 7, np.uint8), "vector": np.ones((1, 4), np.float32),
           "is_first": np.ones(1, bool)}
    torch.manual_seed(1)
    mine = agent.act(obs, None, "eval")[0]
    torch.manual_seed(1)
    assert np.array_equal(mine, other.act(obs, None, "eval")[0])
