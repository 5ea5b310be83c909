"""Tests for reverie.logs.logger.Logger (jsonl, TensorBoard, videos, wandb wiring) and
reverie.loop.progress.Progress."""

from __future__ import annotations

import io
import json
import sys
import types

import imageio.v2 as imageio
import numpy as np
import pytest
import torch
from rich.console import Console

from reverie.logs.logger import SUPPORTED_BACKENDS, Logger, filmstrip
from reverie.loop.progress import Progress


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------- scalars and metrics.jsonl


def test_write_gives_interval_means_and_clears(tmp_path):
    with Logger(tmp_path, backends="none") as logger:
        logger.scalar("a", 1)
        logger.scalar("a", 3)
        logger.scalar("b", 5.0)
        assert logger.pending == {"a": 2.0, "b": 5.0}
        assert logger.write(10) == {"step": 10, "a": 2.0, "b": 5.0}
        assert logger.pending == {}
        # Nothing accumulated: only the step.
        assert logger.write(20) == {"step": 20}
        # A new interval does not remember the old values.
        logger.scalar("a", 7)
        assert logger.write(30) == {"step": 30, "a": 7.0}
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 10, "a": 2.0, "b": 5.0},
        {"step": 20},
        {"step": 30, "a": 7.0},
    ]
    assert (tmp_path / "scores.jsonl").read_text() == ""
    assert not (tmp_path / "tb").exists()


def test_scalars_prefix_extra_and_value_types(tmp_path):
    with Logger(tmp_path, backends=[]) as logger:
        logger.scalars({"loss": torch.tensor(1.5), "kl": np.float32(0.25)}, prefix="wm/")
        logger.scalars({"loss": np.array([2.5])}, prefix="wm/")
        record = logger.write(4, extra={"updates": np.int64(12), "fps": 7})
    assert record == {"step": 4, "wm/loss": 2.0, "wm/kl": 0.25, "updates": 12, "fps": 7}
    line = (tmp_path / "metrics.jsonl").read_text()
    assert line == '{"step": 4, "wm/loss": 2.0, "wm/kl": 0.25, "updates": 12, "fps": 7}\n'


def test_bad_values_and_names_raise_clear_errors(tmp_path):
    with Logger(tmp_path, backends="none") as logger:
        with pytest.raises(TypeError, match=r"'x' must be a single number.*shape \(3,\).*mean\(\)"):
            logger.scalar("x", np.zeros(3))
        with pytest.raises(TypeError, match="'x' must be a number"):
            logger.scalar("x", "fast")
        with pytest.raises(ValueError, match="'step' is reserved"):
            logger.scalar("step", 1)
        logger.scalar("fps", 1)
        with pytest.raises(ValueError, match="extra key 'fps' was also accumulated"):
            logger.write(1, extra={"fps": 2})
        with pytest.raises(TypeError, match="step must be an integer"):
            logger.write(1.5)
    with pytest.raises(RuntimeError, match="is closed"):
        logger.scalar("a", 1)
    logger.close()  # idempotent


def test_nan_survives_the_round_trip(tmp_path):
    with Logger(tmp_path, backends="none") as logger:
        logger.scalar("loss", float("nan"))
        logger.write(1)
    (record,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert record["step"] == 1 and np.isnan(record["loss"])


def test_a_new_logger_appends_to_existing_files(tmp_path):
    for step in (1, 2):
        with Logger(tmp_path, backends="none") as logger:
            logger.scalar("a", step)
            logger.write(step)
            logger.episode(step, 4 * step, 1.0, 3)
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]
    assert [r["step"] for r in read_jsonl(tmp_path / "scores.jsonl")] == [1, 2]


# ---------------------------------------------------------------------- scores.jsonl


def test_episode_appends_scores_immediately(tmp_path):
    logger = Logger(tmp_path, backends="none")
    record = logger.episode(step=100, frames=400, ret=np.float32(21.5), length=np.int64(100), mode="train")
    assert record == {"step": 100, "frames": 400, "return": 21.5, "length": 100, "mode": "train"}
    # Flushed before close: a crashed run keeps its scores.
    assert read_jsonl(tmp_path / "scores.jsonl") == [record]
    logger.episode(step=150, frames=600, ret=-3, length=50, mode="eval")
    logger.close()
    assert read_jsonl(tmp_path / "scores.jsonl") == [
        {"step": 100, "frames": 400, "return": 21.5, "length": 100, "mode": "train"},
        {"step": 150, "frames": 600, "return": -3.0, "length": 50, "mode": "eval"},
    ]
    with Logger(tmp_path, backends="none") as logger:
        with pytest.raises(ValueError, match="mode must be a name like 'train' or 'eval'"):
            logger.episode(1, 1, 0.0, 1, mode="eval/x")


# ---------------------------------------------------------------------- backends


def test_unknown_backend_lists_supported_ones(tmp_path):
    with pytest.raises(ValueError) as error:
        Logger(tmp_path, backends=("tensorboard", "mlflow"))
    message = str(error.value)
    assert "'mlflow'" in message
    for name in SUPPORTED_BACKENDS:
        assert name in message


def test_tensorboard_event_file_holds_the_logged_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(tmp_path, config={"agent": {"name": "dreamerv3"}, "seed": 0}) as logger:
        logger.scalar("loss", 1.0)
        logger.scalar("loss", 2.0)
        logger.write(100)
        logger.scalar("loss", 4.0)
        logger.write(200, extra={"fps": 50.0})
        logger.episode(150, 600, 12.5, 30, mode="eval")
        logger.video("eval/policy", np.full((4, 16, 16, 3), 128, np.uint8), step=200)
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(100, 1.5), (200, 4.0)]
    assert [(e.step, e.value) for e in events.Scalars("fps")] == [(200, 50.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/episode_return")] == [(150, 12.5)]
    assert [(e.step, e.value) for e in events.Scalars("eval/episode_length")] == [(150, 30.0)]
    (gif,) = events.Images("eval/policy")  # the clip as an animated GIF (what add_video writes)
    assert (gif.step, gif.width, gif.height) == (200, 16, 16)
    assert gif.encoded_image_string[:6] == b"GIF89a"  # (4 equal frames: the GIF holds one, 4x as long)
    (image,) = events.Images("eval/policy/filmstrip")
    assert (image.step, image.width, image.height) == (200, 4 * 16, 16)  # filmstrip of the 4 frames
    assert "config/text_summary" in events.Tags()["tensors"]


def test_wandb_missing_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match=r"pip install reverie\[wandb\]"):
        Logger(tmp_path, backends=["wandb"])


class FakeRun:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.id = kwargs.get("id", "run123")
        self.project = kwargs.get("project")
        self.entity = None
        self.logged, self.defined, self.finished = [], [], False

    def define_metric(self, name, step_metric=None):
        self.defined.append((name, step_metric))

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        self.finished = True

    def log_artifact(self, artifact, aliases=None):
        self.artifacts = getattr(self, "artifacts", []) + [(artifact, aliases)]


def fake_wandb_module(runs):
    module = types.ModuleType("wandb")

    def init(**kwargs):
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    class Video:
        def __init__(self, data, fps=4, format=None):
            self.data, self.fps, self.format = data, fps, format

    class Image:
        def __init__(self, data):
            self.data = data

    class Artifact:
        def __init__(self, name, type, metadata=None):
            self.name, self.type, self.metadata, self.files = name, type, metadata, []

        def add_file(self, path, name=None):
            self.files.append((path, name))

    module.init, module.Video, module.Image, module.Artifact = init, Video, Image, Artifact
    return module


def test_wandb_backend_logs_against_env_steps_and_stores_the_run_id(tmp_path, monkeypatch):
    runs = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb_module(runs))
    config = {"seed": 3}
    with Logger(tmp_path, backends=["wandb"], config=config,
                wandb_kwargs={"project": "reverie", "mode": "offline"}) as logger:
        assert logger.wandb_run_id == "run123"
        logger.scalar("loss", 1.0)
        logger.scalar("loss", 3.0)
        logger.write(10)
        logger.episode(12, 48, 5.0, 12)
        path = logger.video("policy", np.zeros((2, 8, 8, 3), np.uint8), step=12, fps=15)
    (run,) = runs
    assert run.kwargs == {"project": "reverie", "mode": "offline", "dir": str(tmp_path), "config": config}
    assert run.defined == [("env_step", None), ("*", "env_step")]
    assert run.logged[:2] == [
        {"loss": 2.0, "env_step": 10},
        {"train/episode_return": 5.0, "train/episode_length": 12.0, "env_step": 12},
    ]
    video = run.logged[2]["policy"]
    assert (video.data, video.fps, video.format, run.logged[2]["env_step"]) == (str(path), 15, "mp4", 12)
    assert run.finished
    assert json.loads((tmp_path / "wandb.json").read_text())["id"] == "run123"
    # A logger reopened in the same run directory resumes the same wandb run.
    run.id = "unused"
    (tmp_path / "wandb.json").write_text(json.dumps({"id": "abc"}))
    with Logger(tmp_path, backends="wandb", wandb_kwargs={"mode": "offline"}):
        pass
    assert runs[1].kwargs["id"] == "abc" and runs[1].kwargs["resume"] == "allow"


# ---------------------------------------------------------------------- videos


@pytest.mark.parametrize(
    "shape, read_shape",
    [
        ((7, 64, 48, 3), (64, 48, 3)),
        ((5, 3, 5, 3), (4, 6, 3)),  # odd sizes are padded by one edge pixel
        ((3, 1, 1, 3), (2, 2, 3)),  # tiny
        ((6, 3, 10, 12), (10, 12, 3)),  # channel-first (T, 3, H, W), the observation layout
        ((2, 8, 8), (8, 8, 3)),  # grayscale
    ],
)
def test_video_is_written_and_readable(tmp_path, shape, read_shape):
    frames = np.full(shape, 200, np.uint8)
    with Logger(tmp_path, backends="none") as logger:
        path = logger.video("eval/policy", frames, step=1000, fps=10)
    assert path == tmp_path / "videos" / "eval_policy_1000.mp4"
    read = imageio.mimread(path, format="FFMPEG")
    assert len(read) == shape[0]
    assert read[0].shape == read_shape
    assert abs(float(np.mean(read)) - 200.0) < 4.0  # lossy codec, but the content is there


def test_video_content_survives_encoding(tmp_path):
    frames = np.zeros((3, 32, 32, 3), np.uint8)
    frames[1, :, :, 0] = 255  # frame 1 is red
    with Logger(tmp_path, backends="none") as logger:
        path = logger.video("clip", frames, step=0)
    read = np.stack(imageio.mimread(path, format="FFMPEG")).astype(float)
    assert read[0].max() < 10 and read[2].max() < 10
    assert read[1, ..., 0].mean() > 240 and read[1, ..., 1].mean() < 15


def test_a_list_of_frames_gives_the_same_video_as_the_stacked_array(tmp_path):
    """A long evaluation episode arrives as a list of frames (never stacked: issue 41's memory peak); the mp4,
    GIF and filmstrip equal those of the same frames as one (T, H, W, 3) array, channel-first frames included."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (5, 17, 24, 3), dtype=np.uint8)  # odd height: padded
    decoded = []
    for name, clip in (("array", frames), ("list", list(frames)), ("chw", [f.transpose(2, 0, 1) for f in frames])):
        with Logger(tmp_path / name, backends="none") as logger:
            path = logger.video("clip", clip, step=0)
        decoded.append(np.stack(imageio.mimread(path, format="FFMPEG")))
    np.testing.assert_array_equal(decoded[0], decoded[1])
    np.testing.assert_array_equal(decoded[0], decoded[2])
    from reverie.logs.video import filmstrip, gif_bytes

    assert gif_bytes(frames) == gif_bytes(list(frames))
    np.testing.assert_array_equal(filmstrip(frames), filmstrip(list(frames)))
    with Logger(tmp_path / "bad", backends="none") as logger:
        with pytest.raises(ValueError, match="one shape"):
            logger.video("x", [frames[0], frames[0][:8]], step=0)
        with pytest.raises(ValueError, match="empty list"):
            logger.video("x", [], step=0)


def test_video_rejects_bad_frames(tmp_path):
    with Logger(tmp_path, backends="none") as logger:
        with pytest.raises(TypeError, match=r"must be uint8.*astype\(np.uint8\)"):
            logger.video("x", np.zeros((2, 8, 8, 3), np.float32), step=0)
        with pytest.raises(ValueError, match=r"\(T, H, W, 3\).*got \(2, 8, 8, 4\)"):
            logger.video("x", np.zeros((2, 8, 8, 4), np.uint8), step=0)
        with pytest.raises(ValueError, match="T >= 1"):
            logger.video("x", np.zeros((0, 8, 8, 3), np.uint8), step=0)


def test_gif_has_every_frame_with_colours_near_the_originals():
    from reverie.logs.logger import gif_bytes

    frames = np.zeros((5, 6, 8, 3), np.uint8)
    frames[1, 0, 0] = 255  # consecutive equal frames would be merged into one longer frame
    frames[3, 0, 0] = 255
    frames[2] = (255, 0, 0)
    frames[4] = (120, 200, 40)
    read = np.stack(imageio.mimread(gif_bytes(frames, fps=5), format="GIF"))[..., :3].astype(int)
    assert read.shape == (5, 6, 8, 3)
    assert (read[0] == 0).all() and (read[2] == (255, 0, 0)).all() and (read[1, 0, 0] == 255).all()
    assert np.abs(read[4] - (120, 200, 40)).max() <= 26  # the fixed 6x7x6 cube: half a step is <= 25.5


def test_image_writes_a_png_and_logs_it(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    picture = np.zeros((10, 12, 3), np.uint8)
    picture[:, :6] = 255
    with Logger(tmp_path) as logger:
        path = logger.image("openloop/reward", picture, step=30)
        with pytest.raises(TypeError, match="uint8"):
            logger.image("x", picture.astype(np.float32), step=1)
    assert path == tmp_path / "plots" / "openloop_reward_30.png"
    np.testing.assert_array_equal(imageio.imread(path), picture)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (image,) = events.Images("openloop/reward")
    assert (image.step, image.width, image.height) == (30, 12, 10)


def test_wandb_gets_the_newest_checkpoint_as_an_artifact_on_close(tmp_path, monkeypatch):
    from reverie.state.checkpoint import save_checkpoint

    runs = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb_module(runs))
    save_checkpoint(tmp_path / "checkpoints", 100, {"x": 1})
    save_checkpoint(tmp_path / "checkpoints", 250, {"x": 2})
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    with Logger(tmp_path, backends=["wandb"], wandb_kwargs={"mode": "offline"}) as logger:
        path = logger.image("plot", np.zeros((4, 4, 3), np.uint8), step=5)
    (run,) = runs
    assert run.logged[-1]["plot"].data == str(path)
    ((artifact, aliases),) = run.artifacts
    assert (artifact.name, artifact.type, artifact.metadata, aliases) == (
        "run123-checkpoint", "model", {"env_step": 250}, ["latest", "step_250"])
    assert [name for _, name in artifact.files] == ["ckpt_0000000250.pt", "config.yaml"]
    assert run.finished


def test_filmstrip_takes_evenly_spaced_frames():
    video = np.arange(20, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 3, 3), np.uint8)
    strip = filmstrip(video, count=3)
    assert strip.shape == (2, 9, 3)
    assert strip[0, ::3, 0].tolist() == [0, 10, 19]  # frames 0, 9.5 -> 10, 19


# ---------------------------------------------------------------------- progress


def test_progress_without_a_terminal_prints_plain_lines_and_the_final_bar():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=150)
    with Progress(100, console=console, plain_interval_s=0.0) as progress:
        progress.update(50, {"updates": 10})
        progress.update(100, {"updates": 20, "last_return": 7.25})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # two plain lines + rich's final render at close
    assert lines[0].startswith("train 50/100 (50%) | - steps/s | - updates/s | return - | 0:00:0")
    assert lines[1].startswith("train 100/100 (100%) | ")
    assert "updates/s | return 7.2 | " in lines[1]  # 7.25 formatted with one decimal
    assert "100/100" in lines[2] and "ret 7.2" in lines[2]


def test_progress_does_not_spam_and_can_be_disabled():
    out = io.StringIO()
    with Progress(1000, console=Console(file=out, force_terminal=False)) as progress:  # 60 s interval
        for step in range(1, 1001):
            progress.update(step, {"updates": step // 2})
    assert len(out.getvalue().splitlines()) == 1  # only the final line
    out = io.StringIO()
    with Progress(10, enabled=False, console=Console(file=out)) as progress:
        progress.update(5, {"last_return": 1.0})
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="total_steps > 0"):
        Progress(0)


def test_progress_rates_are_per_second():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(100, console=Console(file=out, force_terminal=False), plain_interval_s=None,
                        clock=lambda: now[0])
    progress.update(10, {"updates": 4})
    assert progress.rates() == (None, None)  # one sample is no rate
    now[0] = 2.0
    progress.update(30, {"updates": 9})
    assert progress.rates() == (10.0, 2.5)
    now[0] = 4.0
    progress.update(50, {"last_return": float("nan")})  # updates unknown: the last count is kept; NaN: no episode yet
    assert progress.rates() == (10.0, 1.25)
    # 4 s into the learning phase (no prefill: one phase): too early for an estimate (ETA_WARMUP_S = 30 s)
    assert progress.status_line() == ("train 50/100 (50%) | 10 steps/s | 1.2 updates/s | return - | 0:00:04 | "
                                      "eta estimating")
    # Only the last RATE_WINDOW_S (30 s) count: a sudden speed-up shows within the window.
    now[0] = 64.0
    progress.update(650, {"updates": 9})
    assert progress.rates() == (10.0, 0.0)  # samples older than 30 s dropped, the last two kept
    now[0] = 65.0
    progress.update(750, {"updates": 9})
    assert progress.rates() == (100.0, 0.0)  # only t=64 and t=65 are within 30 s of now
    progress.close()
    assert out.getvalue().count("\n") == 1


def test_the_estimate_waits_for_its_warm_up_then_follows_the_last_minutes():
    """Issue 47: a run that starts slow (10 steps in its first 60 s, e.g. a busy core) and then runs at 10 steps/s
    must not keep the slow start in its estimate: after ETA_WINDOW_S (300 s) of the fast speed the estimate is the
    fast one's. Before ETA_WARMUP_S (30 s) it says "estimating"."""
    now = [0.0]
    progress = Progress(100_000, console=Console(file=io.StringIO(), force_terminal=False), plain_interval_s=None,
                        clock=lambda: now[0])
    now[0] = 20.0
    progress.update(5)
    assert progress.remaining() == ("eta", None) and progress.status_line().endswith("| eta estimating")
    now[0] = 60.0
    progress.update(10)  # 10 steps in 60 s: 99,990 more would take 599,940 s
    assert progress.remaining() == ("eta", 599_940.0)
    for t in range(70, 371, 10):  # then 10 steps/s for 5 minutes
        now[0] = float(t)
        progress.update(10 + 100 * (t - 60) // 10)
    steps = 10 + 100 * 31
    label, left = progress.remaining()  # the window holds only the fast 300 s: (100,000 - 3,110) / 10 steps/s
    assert label == "eta" and left == pytest.approx((100_000 - steps) / 10.0)
    progress.close()


def test_remaining_time_comes_from_the_phase_the_run_is_in():
    """Issue 20: prefill runs at 100 steps/s, learning at 2 steps/s; the estimate never mixes the two, and the
    first update (60 s of compiling) is shown as a status and left out of the learning speed."""
    from reverie.loop.progress import remaining_s

    assert remaining_s(300, 1000, (10.0, 100), 20.0) == 35.0  # 200 steps in 10 s (20/s) -> 700 more in 35 s
    assert remaining_s(100, 1000, (10.0, 100), 20.0) is None  # no step yet in this phase
    assert remaining_s(1200, 1000, (0.0, 0), 1.0) == 0.0
    now = [0.0]
    out = io.StringIO()
    progress = Progress(10_000, console=Console(file=out, force_terminal=False), plain_interval_s=None,
                        clock=lambda: now[0], prefill=1000)
    now[0] = 5.0
    progress.update(500)
    assert progress.remaining() == ("prefill eta", 5.0)  # 500 steps in 5 s: the prefill's last 500 take 5 s
    now[0] = 10.0
    progress.update(1000)  # prefill done: the learning phase starts here
    progress.status("first update (compiling/allocating)...")
    assert progress.status_line().endswith("| first update (compiling/allocating)...")
    assert "first update (compiling/allocating)..." in progress.line(80)
    now[0] = 70.0
    progress.status(None)  # the first update took 60 s; the estimate counts from now
    assert progress.remaining() == ("eta", None)
    now[0] = 120.0
    progress.update(1100)  # 100 steps in 50 s -> the other 8,900 take 4,450 s
    assert progress.remaining() == ("eta", 4450.0)
    assert progress.status_line().endswith("| eta 1:14:10")
    progress.close()
    assert "first update (compiling/allocating)..." in out.getvalue()  # printed once without a terminal


@pytest.mark.parametrize("steps, total, ret, rate", [(4096, 30_000, 21.0, 812.0), (29_999_999, 30_000_000, -1419.7,
                                                                                   99_999.0)])
def test_progress_line_fits_80_columns_with_total_and_elapsed(steps, total, ret, rate):
    from reverie.loop.progress import format_line

    now = [0.0]
    progress = Progress(total, console=Console(file=io.StringIO(), force_terminal=False, width=80),
                        plain_interval_s=None, clock=lambda: now[0])
    progress.update(0, {"updates": 0})
    now[0] = 450_000.0  # 125 hours
    progress.update(steps, {"updates": 12_345, "last_return": ret})
    for width in (79, 80, 60, 40):
        line = progress.line(width)
        assert len(line) <= width and f"{steps:,}/{total:,}" in line and "125:00:00" in line, (width, line)
    assert "ret" in progress.line(79) and "eta" in progress.line(79)
    fields = [("eta", "eta 0:01:07"), ("steps/s", "812 steps/s"), ("ret", "ret 21.0"), ("bar", ""),
              ("upd/s", "25.3 upd/s"), ("label", "train")]
    assert format_line(79, "4,096/30,000", "0:00:05", fields, 0.5) == (  # label dropped, bar 14
        "━━━━━━━╺━━━━━━ 4,096/30,000 812 steps/s 25.3 upd/s ret 21.0 0:00:05 eta 0:01:07")
    assert format_line(32, "4,096/30,000", "0:00:05", fields, 0.5) == "4,096/30,000 0:00:05 eta 0:01:07"
    progress.close()


def test_tensorboard_purge_step_hides_the_rows_a_resumed_run_logs_again(tmp_path):
    """A run stopped after its checkpoint at 100 logged 200 and 300; resumed (purge_step 101) it logs 200 again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(tmp_path) as logger:
        for step, value in ((100, 1.0), (200, 2.0), (300, 3.0)):
            logger.scalar("loss", value)
            logger.write(step)
    with Logger(tmp_path, purge_step=101) as logger:
        logger.scalar("loss", 20.0)
        logger.write(200)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(100, 1.0), (200, 20.0)]


def test_an_offline_bar_counts_updates_not_env_steps():
    """Issue 47: reverie pretrain takes no env step: its rate reads updates/s, with no second updates rate."""
    now = [0.0]
    progress = Progress(1000, console=Console(file=io.StringIO(), force_terminal=False), plain_interval_s=None,
                        clock=lambda: now[0], description="pretrain", unit="updates")
    progress.update(0, {"updates": 0})
    now[0] = 4.0
    progress.update(10, {"updates": 10})
    line = progress.status_line()
    assert line.startswith("pretrain 10/1,000 (1%) | 2.5 updates/s | return - | 0:00:04 | ")
    assert "steps/s" not in line and "steps/s" not in progress.line(120) and "2.5 upd/s" in progress.line(120)
    progress.close()
