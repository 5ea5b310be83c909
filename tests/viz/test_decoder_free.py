"""The consumers of a world model without decoders (representation r2 or infonce; issue 29): each reads
``wm.decodes`` when it is built and shows latent, reward and continue predictions instead of observations: the
open-loop report (during training: before issue 29 it crashed at the first report), ``reverie eval --openloop``,
``reverie imagine`` and ``reverie play``."""

import json
import math

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from reverie.agents.dreamer import DreamerV3
from reverie.logs.logger import Logger
from reverie.loop.evaluate import evaluate
from reverie.play.session import PlaySession
from reverie.types import ActionSpec
from reverie.viz import open_loop, prediction_errors, report
from reverie.viz.episodes import EpisodeRecorder
from reverie.viz.imagine import imagine, write_imagined
from reverie.viz.openloop import cosine

from helpers.agents import dreamer

SHAPES = {"image": (3, 16, 16), "vector": (2,)}
ENV = {"id": "reverie.envs.testing.ImageCountingEnv", "kwargs": {"length": 8, "size": 16, "dict_obs": True,
                                                                 "obs_dim": 2}, "num_envs": 1}


@pytest.fixture(params=["r2", "infonce"])
def agent(request):
    torch.manual_seed(0)
    return DreamerV3(SHAPES, ActionSpec(True, 2), representation=request.param,
                     **dreamer(deter=16, units=16, horizon=15, cnn_depth=4))


def test_cosine_by_hand():
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])).item() == pytest.approx(1 / math.sqrt(2))
    assert cosine(torch.tensor([[1.0, 2.0]]), torch.tensor([[-2.0, -4.0]])).tolist() == pytest.approx([-1.0])


def test_open_loop_predicts_reward_continue_and_latent_agreement(agent, make_batch):
    batch = make_batch(SHAPES, actions=2)
    C = 4
    result = open_loop(agent, batch, context=C, sample=False)
    assert not result.decoded and result.openloop == result.recon == result.onestep == {}
    assert result.image_keys == result.vector_keys == [] and set(result.truth) == set(SHAPES)
    T, B = batch["is_first"].shape
    assert result.reward["openloop"].shape == result.latent["openloop"].shape == (T, B)
    np.testing.assert_allclose(result.latent["openloop"][:C], 1.0, atol=1e-5)  # the context rows: the posteriors
    wm = agent.wm
    with torch.no_grad():  # the one-step agreement from the world model API: cos(prior_t, posterior_t)
        data = wm.tensors({k: batch[k] for k in (*SHAPES, "prev_action", "is_first")})
        post, prior = wm.dynamics.observe(wm.encode({k: data[k] for k in SHAPES}), data["prev_action"],
                                          data["is_first"], None, sample=False)
        a, b = wm.dynamics.features(prior), wm.dynamics.features(post)
        a, b = (x.dense() if hasattr(x, "dense") else x for x in (a, b))
        want = ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).numpy()
    np.testing.assert_allclose(result.latent["onestep"], want, rtol=1e-5, atol=1e-6)
    errors = prediction_errors(result)
    assert set(errors) == {"openloop/reward_error", "openloop/latent_cosine"}
    assert errors["openloop/latent_cosine"] == pytest.approx(float(result.latent["openloop"][C:].mean()))


def test_report_writes_the_reward_and_latent_plot_alone(agent, make_batch, tmp_path):
    with Logger(tmp_path, backends="none") as logger:
        report(agent, make_batch(SHAPES, actions=2), logger, step=7, sequences=2, context=3)
        pending = logger.pending
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["openloop_reward_7.png"]
    assert not (tmp_path / "videos").exists() or not list((tmp_path / "videos").iterdir())
    assert {"openloop/reward_error", "openloop/latent_cosine"} <= set(pending)
    assert not any(k.endswith(("image_error", "vector_error")) for k in pending)


def test_eval_openloop_writes_the_prediction_plot_instead_of_videos(agent, tmp_path):
    recorder = EpisodeRecorder(tmp_path, render=False, context=3, openloop_agent=agent)
    assert recorder.decoded is False  # read when the recorder is built
    evaluate(agent, OmegaConf.create(ENV), 1, seed=0, recorder=recorder)
    assert [p.name for p in recorder.written] == ["episode_000_openloop.png"]
    assert iio.imread(tmp_path / "episode_000_openloop.png").ndim == 3
    assert not list(tmp_path.glob("*.mp4"))


def test_imagine_writes_rewards_and_continue_without_frames(agent, tmp_path):
    result = imagine(agent, OmegaConf.create(ENV), ActionSpec(True, 2), seed=0, context=3, horizon=4)
    assert result.obs == {} and result.reward.shape == (7,) and result.objective == agent.wm.representation.name
    paths = write_imagined(result, tmp_path)
    assert [p.name for p in paths] == ["imagine.json", "imagine.png"]
    out = json.loads((tmp_path / "imagine.json").read_text())
    assert out["representation"] == agent.wm.representation.name and out["decoded"] == []
    assert len(out["reward"]) == 7 and iio.imread(tmp_path / "imagine.png").ndim == 3


def test_play_shows_the_dream_predictions_and_its_latent_agreement(agent):
    session = PlaySession(agent, OmegaConf.create({k: v for k, v in ENV.items() if k != "num_envs"}),
                          ActionSpec(True, 2), seed=0)
    snap = session.snapshot()
    assert snap["decoded"] is False and snap["representation"] == agent.wm.representation.name
    assert snap["dream"]["images"] == {} and snap["vector_keys"] == [] and set(snap["real"]["images"]) == {"image"}
    start = {k: v.clone() for k, v in session.dream.items()}
    session.step(1)
    session.step(0)
    h = session.snapshot()["history"]
    assert h["dream_obs"] == [{}, {}] and len(h["latent"]) == 2
    feat = agent.wm.dynamics.features
    assert h["latent"][-1] == pytest.approx(float(cosine(feat(session.dream), feat(session.post))[0]), abs=1e-6)
    with torch.no_grad():
        state = start
        for a in (1, 0):
            state = agent.wm.dynamics.img_step(state, torch.eye(2)[[a]], sample=False)
        assert h["pred_reward"][-1] == pytest.approx(float(agent.wm.reward(feat(state)).mean[0]), abs=1e-6)


def test_training_with_reports_runs_without_decoders(tmp_path):
    """Before issue 29 a decoder-free world model crashed the report at its first call, mid-run."""
    from reverie.cli import main

    run_dir = tmp_path / "r2"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=80", "train.eval_episodes=1",
                 "train.report_every=20", "agent.module.representation=r2"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/barlow" in r for r in rows) and any("openloop/latent_cosine" in r for r in rows)
    assert not any("loss/vector" in r for r in rows)
    plots = {p.name.rsplit("_", 1)[0] for p in (run_dir / "plots").iterdir()}
    assert plots == {"openloop_reward"}
