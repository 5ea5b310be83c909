"""`reverie eval` and `reverie imagine` on a finished debug run; clear errors on missing or corrupt runs."""

import json
import re
import sys
import types

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from reverie.cli import main
from reverie.loop.evaluate import evaluate
from reverie.state.saved_run import RunError, load_run
from reverie.viz.episodes import EpisodeRecorder
from reverie.viz.imagine import Imagined, imagine, imagined_figure, write_imagined


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=64", "train.eval_episodes=1"]) == 0
    return run_dir


def test_eval_writes_the_returns_table_videos_and_openloop_plots(run_dir, tmp_path, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "3", "--out", str(tmp_path), "--openloop"]) == 0
    printed = capsys.readouterr().out.splitlines()  # a table (was a JSON dict); returns.json keeps the JSON
    table = json.loads((tmp_path / "returns.json").read_text())
    assert len(table["returns"]) == 3 == table["episodes"] and printed[0] == "3 eval episodes, seed 0"
    rows = [line.split() for line in printed if re.fullmatch(r"\s*\d+\s+-?[\d.]+\s+\d+", line)]
    assert rows == [[str(k), f"{ret:.1f}", str(length)]
                    for k, (ret, length) in enumerate(zip(table["returns"], table["lengths"]))]
    mean = next(line.split() for line in printed if line.split()[:1] == ["mean"])
    assert mean == ["mean", f"{table['mean']:.1f}", "+-", f"{table['std']:.1f}"]
    assert table["mean"] == pytest.approx(np.mean(table["returns"])) and table["std"] == pytest.approx(
        np.std(table["returns"]))
    assert (table["min"], table["max"]) == (min(table["returns"]), max(table["returns"]))
    assert table["seed"] == 0 and table["mode"] == "eval" and table["checkpoint"].endswith("checkpoints/best.pt")
    csv = (tmp_path / "returns.csv").read_text().splitlines()
    assert csv[0] == "episode,return,length"
    assert [float(line.split(",")[1]) for line in csv[1:]] == table["returns"]
    for k, length in enumerate(table["lengths"]):
        frames = iio.imread(tmp_path / f"episode_{k:03d}.mp4", index=None)
        assert frames.shape[0] == length + 1 and frames.shape[-1] == 3  # reset frame + one per step
        assert iio.imread(tmp_path / f"episode_{k:03d}_openloop.png").ndim == 3
    assert not list(tmp_path.glob(".*partial*"))  # dropped extra episodes leave no files
    quality = [line for line in printed if line.startswith("open loop, episode ")]  # vector obs: the reward error
    assert [line.split(":")[0] for line in quality] == [f"open loop, episode {k}" for k in range(3)]
    assert all(re.search(r"reward error \d+\.\d{3}$", line) for line in quality)


def test_recording_videos_does_not_change_the_episodes(run_dir, tmp_path):
    run = load_run(run_dir)
    torch.manual_seed(0)
    plain = evaluate(run.agent, run.config["env"], 3, seed=1)
    torch.manual_seed(0)
    recorder = EpisodeRecorder(tmp_path, render=True)
    recorded = evaluate(run.agent, run.config["env"], 3, seed=1, recorder=recorder)
    assert (plain["returns"], plain["lengths"]) == (recorded["returns"], recorded["lengths"])
    assert sorted(p.name for p in recorder.written) == ["episode_000.mp4", "episode_001.mp4", "episode_002.mp4"]


def test_missing_and_corrupt_runs_fail_with_clear_messages(run_dir, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text("seed: 0\n")
    assert main(["eval", str(tmp_path / "empty")]) == 2
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    good = (run_dir / "checkpoints" / "ckpt_0000000064.pt").read_bytes()
    broken = tmp_path / "broken" / "checkpoints"
    broken.mkdir(parents=True)
    (broken / "ckpt_0000000064.pt").write_bytes(good)
    (broken / "ckpt_0000000128.pt").write_bytes(good[: len(good) // 2])  # truncated newest checkpoint
    assert main(["eval", str(broken.parent)]) == 2
    err = capsys.readouterr().err
    assert "ckpt_0000000128.pt is corrupt" in err and "try an older checkpoint" in err and "ckpt_0000000064.pt" in err
    torch.save({"weights": 1}, broken / "ckpt_0000000200.pt")
    with pytest.raises(RunError, match=r"lacks \['agent', 'obs_shapes', 'action_spec', 'config'\]"):
        load_run(broken.parent)
    assert main(["imagine", str(tmp_path / "nope")]) == 2 and "does not exist" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--episodes", "0"]) == 2  # refused before the run loads: nothing described
    assert capsys.readouterr().err == "eval error: --episodes must be >= 1, got 0\n"


def test_wandb_artifact_reference_is_downloaded_and_loaded(run_dir, monkeypatch):
    calls = []

    class Artifact:
        def download(self, root=None):
            return str(run_dir / "checkpoints")

    class Api:
        def artifact(self, name, type=None):
            calls.append((name, type))
            return Artifact()

    module = types.ModuleType("wandb")
    module.Api = Api
    monkeypatch.setitem(sys.modules, "wandb", module)
    run = load_run("wandb:me/reverie/run123-checkpoint:latest")
    assert calls == [("me/reverie/run123-checkpoint:latest", "model")] and run.directory == run_dir
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(RunError, match=r"pip install reverie\[wandb\]"):
        load_run("wandb:me/reverie/run123-checkpoint:latest")


def test_imagine_command_with_policy_random_and_given_actions(run_dir, tmp_path, capsys):
    assert main(["imagine", str(run_dir), "--horizon", "6", "--out", str(tmp_path / "policy")]) == 0
    out = json.loads((tmp_path / "policy" / "imagine.json").read_text())
    assert len(out["reward"]) == 5 + 6 == len(out["cont"]) and np.asarray(out["actions"]).shape == (11, 2)
    assert out["true_steps"] <= 11 and out["true_steps"] > 5  # the real env's answer to the imagined actions
    assert iio.imread(tmp_path / "policy" / "imagine.png").ndim == 3
    np.save(tmp_path / "acts.npy", np.array([1, 1, 0, 0, 1, 1]))
    assert main(["imagine", str(run_dir), "--horizon", "6", "--actions", str(tmp_path / "acts.npy"),
                 "--out", str(tmp_path / "given")]) == 0
    given = np.asarray(json.loads((tmp_path / "given" / "imagine.json").read_text())["actions"])
    # a_{C-1} .. a_{C+H-2} drive the H imagined steps; the spare last one is never executed
    np.testing.assert_array_equal(given[4:], np.eye(2)[[1, 1, 0, 0, 1, 1, 1]])
    assert main(["imagine", str(run_dir), "--actions", "random", "--out", str(tmp_path / "random")]) == 0
    capsys.readouterr()
    np.save(tmp_path / "bad.npy", np.zeros((6, 3)))
    assert main(["imagine", str(run_dir), "--horizon", "6", "--actions", str(tmp_path / "bad.npy")]) == 2
    assert "must be shaped (H, A) = (6, 2)" in capsys.readouterr().err
    assert main(["imagine", str(run_dir), "--context", "80"]) == 2  # debug episodes last at most 50 steps
    assert "use a smaller --context" in capsys.readouterr().err


def test_imagined_video_of_an_image_world_model(tmp_path, tiny_agent):
    from omegaconf import OmegaConf

    from reverie.types import ActionSpec

    env_cfg = OmegaConf.create({"id": "reverie.envs.testing.ImageCountingEnv", "kwargs": {"size": 16, "length": 20},
                                "num_envs": 1})
    agent = tiny_agent({"image": (3, 16, 16)}, actions=2)
    result = imagine(agent, env_cfg, ActionSpec(True, 2), seed=0, context=3, horizon=4)
    np.testing.assert_array_equal(result.obs["image"].shape, (7, 3, 16, 16))
    assert result.truth["image"].shape == (7, 3, 16, 16)  # 3 observed rows, then the env's answer to 4 actions
    assert result.truth["image"][:, 0, 0, 0].tolist() == list(range(7))  # the env's step counter, t = 0..6
    paths = write_imagined(result, tmp_path, scale=2)
    video = iio.imread(tmp_path / "imagine_image.mp4", index=None)
    assert [p.name for p in paths] == ["imagine.json", "imagine.png", "imagine_image.mp4"]
    assert video.shape == (7, 2 * (2 + 16), 2 * 16, 3)  # marker bar + one row, upscaled x2


def test_simulator_version_mismatch_is_reported(run_dir, tmp_path):
    import shutil

    from reverie.state.saved_run import version_mismatches

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    assert version_mismatches(load_run(copy)) == []
    meta = json.loads((copy / "env_metadata.json").read_text())
    meta["versions"]["gymnasium"] = "0.0.1"
    (copy / "env_metadata.json").write_text(json.dumps(meta))
    (mismatch,) = version_mismatches(load_run(copy))
    assert mismatch.startswith("gymnasium: run 0.0.1, installed ")


def test_eval_with_a_planner_and_load_run_overrides(run_dir, tmp_path, capsys):
    """`reverie eval --planner cem --plan ...` acts by planning and records it; load_run checks the choice."""
    from omegaconf import OmegaConf

    from reverie.state.saved_run import set_planner

    args = ["eval", str(run_dir), "--episodes", "1", "--no-video", "--out", str(tmp_path), "--planner", "cem",
            "--plan", "candidates=8", "--plan", "top_k=2", "--plan", "iterations=1", "--plan", "horizon=3"]
    assert main(args) == 0
    acting = json.loads((tmp_path / "returns.json").read_text())["acting"]
    assert acting["planner"] == "cem" and (acting["candidates"], acting["top_k"], acting["horizon"]) == (8, 2, 3)
    run = load_run(run_dir, planner="mppi", plan={"candidates": 8, "top_k": 2})
    assert run.acting["planner"] == "mppi" and run.agent.planner.planner.temperature == 0.5
    assert load_run(run_dir).acting == {"planner": "actor"}
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--plan", "candidates"]) == 2
    assert "--plan takes KEY=VALUE" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--planner", "cem", "--plan", "horizont=3"]) == 2
    assert "unknown planner setting(s) ['horizont']" in capsys.readouterr().err
    with pytest.raises(RunError, match="apply to DreamerV3 runs.*always plans with CEM"):
        set_planner(OmegaConf.create({"name": "planet", "module": {}}), "cem", None)
    older = OmegaConf.create({"name": "dreamerv3", "module": {}})  # a run from before `planner`/`plan` existed
    set_planner(older, "mppi", {"horizon": 5})
    assert OmegaConf.to_container(older.module) == {"planner": "mppi", "plan": {"horizon": 5}}


@pytest.mark.parametrize("plan, message", [
    (["--planner", "cem", "--plan", "horizon=-1"], "planner setting(s): horizon=-1 must be >= 1 (planned steps H)"),
    (["--planner", "mppi", "--plan", "temperature=0"], "temperature=0 must be > 0"),
    (["--planner", "cem", "--plan", "top_k=200"], "top_k=200 is more than candidates + policy_candidates = 128"),
    (["--planner", "cem", "--plan", "horizon=abc"], "horizon='abc' is not a number: must be an integer >= 1"),
    (["--planner", "cem", "--plan", "sample=maybe"], "sample='maybe' must be true or false"),
    (["--plan", "horizon=3"], "planner settings ['horizon'] given, but this run acts with its actor"),
    (["--planner", "actor", "--plan", "horizon=3"], "acts with its actor"),
])
def test_bad_plan_settings_are_refused_before_anything_runs(run_dir, tmp_path, capsys, plan, message):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--no-video", "--out", str(tmp_path / "out"), *plan]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eval error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_imagine_png_shows_every_step_in_labelled_rows():
    """5 context + 30 imagined steps: 4 rows of at most 10 frames (was 12 of the 35 frames squeezed into one strip
    with an unlabelled axis); each row's ticks are its frames' step numbers, context steps in grey."""
    from matplotlib.colors import to_rgba

    from reverie.viz.imagine import Imagined, imagined_figure, imagined_strip

    T = 35
    frames = np.repeat(np.arange(T, dtype=np.uint8)[:, None, None, None] * 7, 3, 1).repeat(8, 2).repeat(8, 3)
    result = Imagined(context=5, horizon=30, obs={"image": frames}, truth={}, actions=np.zeros((T, 2), np.float32),
                      reward=np.zeros(T, np.float32), cont=np.ones(T, np.float32))
    fig = imagined_figure(result)
    rows = fig.axes[:4]
    assert [[label.get_text() for label in ax.get_xticklabels()] for ax in rows] == [
        [str(t) for t in range(lo, min(lo + 10, T))] for lo in (0, 10, 20, 30)]
    assert all(ax.get_xlabel() == "step t" and ax.get_ylabel() == "image" for ax in rows)
    colors = [to_rgba(label.get_color()) for label in rows[0].get_xticklabels()]
    assert colors[:5] == [to_rgba("0.5")] * 5 and colors[5:] == [to_rgba("black")] * 5
    first = rows[0].get_images()[0].get_array()
    np.testing.assert_array_equal(first[0, ::8, 0], np.arange(10) * 7)  # steps 0-9 left to right, one frame each
    last = rows[3].get_images()[0].get_array()
    np.testing.assert_array_equal(last[0, :5 * 8:8, 0], np.arange(30, 35) * 7)
    assert (last[:, 5 * 8:] == 255).all()  # the short last row ends in white, not in repeated frames
    assert fig.axes[4].get_xlabel() == "step t" and fig.axes[4].get_ylabel() == "reward"
    assert imagined_strip(result).ndim == 3


def test_eval_prints_a_line_every_10_s_inside_a_long_episode(run_dir, tmp_path, capsys, monkeypatch):
    """A planner's episode can take minutes: besides a line per episode, eval says how many steps it has taken
    every 10 s (here the clock advances 11 s at every reading, so every step gets a line)."""
    import itertools
    import time as time_module

    from reverie.loop import evaluate as evaluate_module

    clock = itertools.count(0.0, 11.0)
    monkeypatch.setattr(time_module, "monotonic", lambda: next(clock))
    steps_seen = []
    original = evaluate_module.evaluate

    def counting(*args, on_step=None, **kwargs):
        def both(steps):
            steps_seen.append(steps)
            on_step(steps)
        return original(*args, on_step=both, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", counting)
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--no-video", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    length = json.loads((tmp_path / "returns.json").read_text())["lengths"][0]
    assert steps_seen == list(range(1, length + 1))
    lines = [line for line in err.splitlines() if re.fullmatch(r"\[reverie\] eval: \d+ steps \(\d+ s\)", line)]
    assert [int(line.split()[2]) for line in lines] == list(range(1, length + 1))


def test_the_imagine_plot_names_vector_features_where_the_env_names_them():
    T = 6
    obs = {"vector": np.linspace(0, 1, T * 3, dtype=np.float32).reshape(T, 3)}
    result = Imagined(context=2, horizon=4, obs=obs, truth={"vector": obs["vector"][:4]},
                      actions=np.zeros((T, 1), np.float32), reward=np.zeros(T, np.float32), cont=np.ones(T, np.float32),
                      names={"vector": ["position[0]", "position[1]", "velocity"]})
    fig = imagined_figure(result)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:3] == ["position[0]", "position[1]", "velocity"]
    assert any("true" in label for label in labels)
