"""The open-loop report: files, TensorBoard entries, scalars, and no effect on training's RNG streams."""

import json

import imageio.v3 as iio
import numpy as np
import pytest

from reverie.logs.logger import Logger
from reverie.replay import Replay
from reverie.viz import report
from reverie.viz.grid import MARKER


def test_report_writes_videos_plots_and_scalars(tmp_path, image_agent, image_batch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(tmp_path, backends=["tensorboard"]) as logger:
        result = report(image_agent, image_batch, logger, step=40, sequences=2, context=3)
        pending = logger.pending
    T = len(image_batch["is_first"])
    assert result.context == 3
    video = iio.imread(tmp_path / "videos" / "openloop_image_40.mp4", index=None)
    assert video.shape == (T, MARKER + 3 * 16, 2 * 16, 3)  # T frames; truth / prediction / error; 2 sequences
    closed = iio.imread(tmp_path / "videos" / "closedloop_image_40.mp4", index=None)
    assert closed.shape == (T, 3 * 16, 2 * 16, 3)
    for name in ("openloop_reward_40.png", "openloop_vector_40.png"):
        image = iio.imread(tmp_path / "plots" / name)
        assert image.ndim == 3 and image.shape[2] == 3 and image.std() > 0
    assert {"openloop/image_error", "openloop/vector_error", "recon/image_error", "openloop/reward_error",
            "viz/report_s"} <= set(pending)
    # prediction quality per open-loop step k = 1..T-C (reverie.viz.quality), and its plot
    assert {f"quality/image_{m}_k{k}" for m in ("psnr", "ssim") for k in range(1, T - 3 + 1)} <= set(pending)
    assert f"quality/image_psnr_k{T - 3 + 1}" not in pending
    assert {"quality/image_psnr_recon", "quality/image_ssim_onestep", "quality/reward_error"} <= set(pending)
    assert iio.imread(tmp_path / "plots" / "quality_image_40.png").std() > 0
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (gif,) = events.Images("openloop/image")
    assert gif.encoded_image_string[:6] == b"GIF89a"
    assert len(iio.imread(gif.encoded_image_string, index=None, extension=".gif")) == T
    assert {"openloop/image/filmstrip", "openloop/reward", "openloop/vector"} <= set(events.Tags()["images"])


def test_report_from_replay_leaves_the_replay_sampling_stream_unchanged(tmp_path, tiny_agent):
    import gymnasium as gym

    agent = tiny_agent({"vector": (3,)}, actions=2)
    space = gym.spaces.Dict({"vector": gym.spaces.Box(-1, 1, (3,), np.float32)})
    replays = [Replay(200, 1, Replay.spec_for(space, 2), seed=5) for _ in range(2)]
    rng = np.random.default_rng(0)
    for t in range(50):
        row = {"vector": rng.normal(size=(1, 3)).astype(np.float32), "reward": np.zeros(1, np.float32),
               "is_first": np.array([t == 0]), "is_last": np.zeros(1, bool), "is_terminal": np.zeros(1, bool),
               "action": np.eye(2, dtype=np.float32)[[t % 2]]}
        for replay in replays:
            replay.add(row)
    with Logger(tmp_path, backends="none") as logger:
        assert report(agent, replays[0], logger, step=10, length=8, sequences=2) is not None
        with pytest.raises(ValueError, match="pass length"):
            report(agent, replays[0], logger, step=10)
        with pytest.warns(UserWarning, match="report skipped"):
            assert report(agent, replays[0], logger, step=10, length=500) is None
    a, b = replays[0].sample(4, 8), replays[1].sample(4, 8)
    np.testing.assert_array_equal(a["vector"], b["vector"])  # the report's draw did not shift training batches
    assert (tmp_path / "plots" / "openloop_vector_10.png").is_file()


def test_training_with_reports_writes_them_and_trains_identically(tmp_path):
    from reverie.cli import main

    def run(name, every):
        run_dir = tmp_path / name
        assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=120", "train.eval_episodes=1",
                     f"train.report_every={every}"]) == 0
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return run_dir, rows

    on, rows_on = run("on", 50)
    _, rows_off = run("off", 0)
    losses = [[r.get("loss/model") for r in rows] for rows in (rows_on, rows_off)]
    assert losses[0] == losses[1] and any(v is not None for v in losses[0])
    assert any("openloop/vector_error" in r for r in rows_on)
    plots = sorted(p.name for p in (on / "plots").iterdir())
    updates = rows_on[-1]["updates"]
    reports = updates // 50 + (updates % 50 != 0)  # every 50 updates, and at the end unless that just had one
    assert len(plots) == 2 * reports  # a reward and a vector plot per report
    # the summary holds the last report's own quality (vector obs: the reward error; rows hold interval means)
    summary = json.loads((on / "summary.json").read_text())
    assert 0.0 <= summary["quality/reward_error"] < float("inf") and "quality/reward_error_k1" not in summary
    assert not any(k.startswith("quality/") for k in json.loads((tmp_path / "off" / "summary.json").read_text()))
