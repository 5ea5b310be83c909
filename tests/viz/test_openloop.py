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


def test_the_episode_recorder_aligns_observations_and_previous_actions(tiny_agent, tmp_path, monkeypatch):
    """Issue 47: the posterior trace of `reverie eval --openloop` reads the world model on the batch the recorder
    builds from an episode. A hand-made 4-step episode: obs_t = [t, 10 t], actions a_0 = 1, a_1 = 2, a_2 = 0 (one-hot
    of 3); the batch must hold obs_t at row t and prev_action_t = a_{t-1} (zeros at t = 0, the reset), so that the
    posterior at t has seen exactly obs_0..obs_t and a_0..a_{t-1}. The legend names what each line saw."""
    import reverie.viz.episodes as episodes

    seen = {}

    def capture(agent, batch, context=5, sample=True, seed=0):
        seen.update(batch)
        raise StopIteration  # the batch is all this test needs

    monkeypatch.setattr(episodes, "open_loop", capture)
    recorder = episodes.EpisodeRecorder(tmp_path, render=False, openloop_agent=tiny_agent({"vector": (2,)}))
    actions = [1, 2, 0]
    for t in range(4):
        row = {"vector": np.array([[t, 10.0 * t]], np.float32), "reward": np.array([float(t)], np.float32),
               "is_first": np.array([t == 0]), "is_last": np.array([t == 3]), "is_terminal": np.array([False])}
        recorder.observe(row, None)
        if t < 3:
            recorder.act(np.eye(3, dtype=np.float32)[[actions[t]]])
    with pytest.raises(StopIteration):
        recorder.finish(0, 0)
    np.testing.assert_array_equal(seen["vector"][:, 0], [[t, 10.0 * t] for t in range(4)])
    np.testing.assert_array_equal(seen["prev_action"][:, 0], [[0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]])
    np.testing.assert_array_equal(seen["is_first"][:, 0], [True, False, False, False])
    np.testing.assert_array_equal(seen["reward"][:, 0], [0.0, 1.0, 2.0, 3.0])


def test_the_vector_plot_legend_says_what_each_line_saw(tiny_agent, make_batch, monkeypatch):
    import importlib

    from reverie.viz.openloop import open_loop

    vp = importlib.import_module("reverie.viz.vector_plot")  # the module (reverie.viz exports the function's name)

    agent = tiny_agent({"vector": (2,)})
    result = open_loop(agent, make_batch({"vector": (2,)}, T=8, B=1), context=3)
    monkeypatch.setattr(vp, "figure_to_array", lambda fig: [t.get_text() for t in fig.axes[0].get_legend().texts])
    assert vp.vector_plot(result, "vector") == ["true", "posterior (decoded; saw obs_t)",
                                                "one-step prior (saw up to obs_t-1)", "open loop (saw obs_0..2)"]
