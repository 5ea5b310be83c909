"""Open-loop predictions: the context part is the posterior reconstruction path, the rest the prior rollout."""

import numpy as np
import pytest
import torch

from reverie.viz import OpenLoop, abs_error, open_loop, prediction_errors, video_grid
from reverie.viz.grid import MARKER


def posterior_reconstruction(agent, batch):
    """The closed-loop path computed directly with the world model API (mode latents)."""
    wm = agent.wm
    with torch.no_grad():
        data = agent.wm.tensors({k: batch[k] for k in (*agent.obs_keys, "prev_action", "is_first")})
        post, _ = wm.dynamics.observe(wm.encode({k: data[k] for k in agent.obs_keys}), data["prev_action"],
                                      data["is_first"], None, sample=False)
        feat = wm.dynamics.features(post)
        return {k: d.mode.numpy() for k, d in wm.decode(feat).items()}, post


def test_context_part_of_the_openloop_video_is_the_posterior_reconstruction(image_agent, image_batch):
    C, H = 4, 16
    result = open_loop(image_agent, image_batch, context=C, sample=False)
    recon, _ = posterior_reconstruction(image_agent, image_batch)
    # The open-loop video's prediction row shows exactly the posterior reconstructions for t < C ...
    truth, pred = result.truth["image"], result.openloop["image"]
    video = video_grid([truth, pred, abs_error(truth, pred)], C)
    T, B = truth.shape[:2]
    assert video.shape == (T, MARKER + 3 * H, B * H, 3)
    for t in range(C):
        for b in range(B):
            tile = video[t, MARKER + H: MARKER + 2 * H, b * H: (b + 1) * H]
            np.testing.assert_array_equal(tile, recon["image"][t, b].transpose(1, 2, 0))
    np.testing.assert_allclose(result.openloop["vector"][:C], recon["vector"][:C], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result.recon["image"], recon["image"])
    # ... and the truth row is the replayed frames.
    np.testing.assert_array_equal(video[:, MARKER: MARKER + H, :H], image_batch["image"][:, 0].transpose(0, 2, 3, 1))


def test_open_loop_part_is_the_prior_rollout_with_replayed_actions(image_agent, image_batch):
    C = 5
    image_batch["is_first"][8, 1] = True  # an episode starts inside the open-loop part of sequence 1
    result = open_loop(image_agent, image_batch, context=C, sample=False)
    wm = image_agent.wm
    _, post = posterior_reconstruction(image_agent, image_batch)
    T, B = image_batch["is_first"].shape
    with torch.no_grad():
        init = wm.dynamics.initial(B)
        state = {k: v[C - 1] for k, v in post.items()}
        for t in range(C, T):
            first = torch.as_tensor(image_batch["is_first"][t], dtype=torch.float32)[:, None]
            state = {k: init[k] * first.view(-1, *[1] * (v.dim() - 1)) +
                     v * (1 - first.view(-1, *[1] * (v.dim() - 1))) for k, v in state.items()}
            action = torch.as_tensor(image_batch["prev_action"][t]) * (1 - first)
            state = wm.dynamics.img_step(state, action, sample=False)
            feat = wm.dynamics.features(state)
            np.testing.assert_array_equal(result.openloop["image"][t], wm.decode(feat)["image"].mode.numpy())
            np.testing.assert_allclose(result.reward["openloop"][t], wm.reward(feat).mean.numpy(), atol=1e-6)
            np.testing.assert_allclose(result.cont["openloop"][t], wm.cont(feat).mean.numpy(), atol=1e-6)
    assert result.reward["true"].shape == (T, B) and (result.cont["true"] == 1.0).all()


def test_seeded_sampling_repeats_and_leaves_the_global_rng_alone(image_agent, image_batch):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = open_loop(image_agent, image_batch, context=3, sample=True, seed=7)
    b = open_loop(image_agent, image_batch, context=3, sample=True, seed=7)
    assert torch.equal(torch.rand(3), expected)  # the report did not advance the training RNG
    np.testing.assert_array_equal(a.openloop["image"], b.openloop["image"])
    c = open_loop(image_agent, image_batch, context=3, sample=True, seed=8)
    assert not np.array_equal(a.openloop["image"], c.openloop["image"])


def test_vector_only_world_model_and_bad_inputs(tiny_agent, make_batch):
    agent = tiny_agent({"vector": (4,)}, actions=2)
    batch = make_batch({"vector": (4,)}, T=6, B=2, actions=2)
    result = open_loop(agent, batch, context=2)
    assert result.vector_keys == ["vector"] and result.image_keys == []
    assert result.openloop["vector"].shape == (6, 2, 4)
    with pytest.raises(ValueError, match=r"context must be in \[1, T - 1\] = \[1, 5\]"):
        open_loop(agent, batch, context=6)
    with pytest.raises(KeyError, match="lacks \\['prev_action'\\]"):
        open_loop(agent, {k: v for k, v in batch.items() if k != "prev_action"})
    with pytest.raises(TypeError, match="no world model"):
        open_loop(object(), batch)


def test_prediction_errors_are_means_over_the_open_loop_part():
    truth = np.zeros((3, 1, 1, 1, 2), np.uint8)
    pred = np.array([255, 255, 0, 51, 102, 0], np.uint8).reshape(3, 1, 1, 1, 2)
    result = OpenLoop(context=1, truth={"image": truth, "vector": np.zeros((3, 1, 1), np.float32)},
                      openloop={"image": pred, "vector": np.array([9, 1, -3], np.float32).reshape(3, 1, 1)},
                      recon={"image": truth, "vector": np.full((3, 1, 1), 0.5, np.float32)}, onestep={},
                      reward={"true": np.zeros((3, 1)), "openloop": np.array([[5.0], [1.0], [-2.0]])})
    errors = prediction_errors(result)
    assert errors["openloop/image_error"] == pytest.approx((0 + 51 + 102 + 0) / 4 / 255)
    assert errors["openloop/vector_error"] == pytest.approx(2.0)
    assert errors["recon/image_error"] == 0.0 and errors["recon/vector_error"] == pytest.approx(0.5)
    assert errors["openloop/reward_error"] == pytest.approx(1.5)
