"""The learning-fidelity harness (bench/fidelity.py): the settings table, the official score conversion and the
refusals. The official runs themselves stay out of the test suite (they take an hour each)."""

import json
import sys
from pathlib import Path

import pytest

# bench/ is a folder of scripts at the repository root, not part of the installed package: import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fidelity import (SETTINGS, MappingError, add_wall, convert_official, main, official_flags,  # noqa: E402
                            resolve_values, reverie_overrides)
from reverie.configs.compose import load_config  # noqa: E402
from reverie.scores.readers import read_run  # noqa: E402
from reverie.scores.suites import infer_suite  # noqa: E402


def flag_values(flags: list[str]) -> dict[str, str]:
    """``--key value`` pairs -> {key: value} (each official flag is followed by its value)."""
    assert len(flags) % 2 == 0
    return dict(zip(flags[::2], flags[1::2]))


def test_one_value_sets_both_sides_2023():
    values = resolve_values("2023", "cpu", ["train_ratio=128"], "cartpole_swingup", 3)
    official = flag_values(official_flags("2023", values))
    # frames 100k at action repeat 2 -> 50k agent steps on both sides; the task in each side's spelling
    assert official["--run.steps"] == "50000" and official["--task"] == "dmc_cartpole_swingup"
    assert official["--seed"] == "3" and official["--run.train_ratio"] == "128"
    # one width sets the RSSM hidden layer and every head of the official code, as `size.units` does in reverie
    for flag in ("--rssm.units", "--reward_head.units", "--cont_head.units", "--actor.units", "--critic.units"):
        assert official[flag] == "128"
    assert official["--encoder.mlp_layers"] == official["--decoder.mlp_layers"] == "1"
    assert official["--configs"] == "dmc_proprio" and official["--envs.parallel"] == "none"
    cfg = load_config(reverie_overrides("2023", values))  # refuses unknown keys: every reverie key exists
    assert cfg.agent.name == "dreamerv3" and cfg.env.task == "cartpole_swingup" and cfg.seed == 3
    assert cfg.train.steps == 50_000 and cfg.agent.train_ratio == 128 and cfg.env.action_repeat == 2
    m = cfg.agent.module
    assert (m.dynamics.deter, m.dynamics.units, m.dynamics.stoch, m.dynamics.classes) == (128, 128, 16, 16)
    assert (m.units, m.layers, m.mlp_units, m.mlp_layers, m.imag_last, m.horizon) == (128, 1, 128, 1, 0, 15)
    assert (m.model_lr, m.actor_lr, m.critic_lr) == (3e-4, 1e-4, 1e-4)
    assert (cfg.agent.batch_size, cfg.agent.batch_length, cfg.env.num_envs, cfg.train.prefill) == (16, 32, 4, 1000)


def test_one_value_sets_both_sides_2025():
    values = resolve_values("2025", "cpu", [], "cartpole_swingup", 0)
    official = flag_values(official_flags("2025", values))
    assert official["--agent.dyn.rssm.deter"] == "512" and official["--agent.dyn.rssm.hidden"] == "64"
    assert official["--agent.opt.lr"] == "4e-05" and official["--run.envs"] == "4"
    cfg = load_config(reverie_overrides("2025", values))
    assert cfg.agent.name == "dreamerv3_2025" and cfg.train.steps == 50_000
    m = cfg.agent.module
    assert (m.dynamics.deter, m.dynamics.hidden, m.dynamics.classes, m.dynamics.blocks) == (512, 64, 4, 8)
    assert (m.units, m.lr, m.imag_last, m.replay_context) == (64, 4e-5, 0, 1) and cfg.agent.replay_online is True
    assert official["--replay_context"] == "1" and official["--replay.online"] == "True"
    # the current official code has no random prefill (its agent acts from the first step): reverie's is 0 too, and
    # no official flag is set for it
    assert cfg.train.prefill == 0 and not any("fill" in flag for flag in official)
    with pytest.raises(MappingError, match="prefill=1000 cannot be mapped onto the official 2025 code"):
        resolve_values("2025", "cpu", ["prefill=1000"], "cartpole_swingup", 0)


def test_every_setting_has_a_value_and_distinct_names():
    for version, settings in SETTINGS.items():
        names = [s.name for s in settings]
        assert len(names) == len(set(names)), version
        values = resolve_values(version, "cpu", [], "walker_walk", 0)
        assert set(values) == set(names)


@pytest.mark.parametrize("sets,message", [
    (["imag_last=8"], "imag_last=8 cannot be mapped onto the official 2023 code"),
    (["frobnicate=1"], "--set frobnicate: no such setting in the 2023 table"),
    (["train_ratio"], "write NAME=VALUE"),
])
def test_refuses_what_it_cannot_map(sets, message):
    with pytest.raises(MappingError, match=message):
        resolve_values("2023", "cpu", sets, "cartpole_swingup", 0)


def test_refusals_before_anything_runs(tmp_path, capsys):
    with pytest.raises(MappingError, match=r"settings without a value: \['seed'\]"):
        resolve_values("2023", "cpu", [], "cartpole_swingup", None)
    values = resolve_values("2023", "cpu", ["frames=1001"], "cartpole_swingup", 0)
    with pytest.raises(MappingError, match="frames=1001 is not a multiple of action_repeat=2"):
        official_flags("2023", values)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--side", "reverie", "--version", "2023", "--task", "cartpole_swingup", "--seed", "0",
              "--set", "imag_last=4", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "cannot be mapped" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written
    with pytest.raises(ValueError, match="--out .* is inside the repository"):
        main(["run", "--side", "reverie", "--version", "2023", "--task", "cartpole_swingup", "--seed", "0",
              "--out", str(Path(__file__).resolve().parents[1] / "fidelity_runs")])


def test_official_scores_become_a_reverie_run(tmp_path):
    """A small log in the official format (the official logger writes ``step`` in env frames: its agent-step counter
    times the env's repeat) -> a run folder that reverie's score reader and suite inference take."""
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    episodes = [(1000, 12.5, 500), (2000, 30.0, 500), (2000, 41.0, 500), (3000, 200.25, 500)]
    (logdir / "scores.jsonl").write_text("".join(json.dumps({"step": f, "episode/score": r}) + "\n"
                                                 for f, r, _ in episodes))
    (logdir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": f, "episode/length": n, "episode/score": r, "train/loss/dyn": 1.0}) + "\n"
        for f, r, n in episodes) + json.dumps({"step": 3000, "fps/policy": 10.0}) + "\n")
    values = resolve_values("2023", "cpu", [], "cartpole_swingup", 2)
    run = tmp_path / "official_2023_cartpole_swingup_s2"
    assert convert_official(logdir, run, "2023", values, ["--seed", "2"]) == 4
    rows = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    assert [(r["step"], r["frames"], r["return"], r["length"], r["mode"]) for r in rows] == [
        (500, 1000, 12.5, 500, "train"), (1000, 2000, 30.0, 500, "train"), (1000, 2000, 41.0, 500, "train"),
        (1500, 3000, 200.25, 500, "train")]
    assert infer_suite([run]) == ("dmc_proprio", "env_metadata.json")
    table = read_run(run, suite="dmc_proprio", method="official", mode="train")
    assert table["frames"].tolist() == [1000.0, 2000.0, 2000.0, 3000.0]
    assert table["agent_steps"].tolist() == [500.0, 1000.0, 1000.0, 1500.0]
    assert table["return"].tolist() == [12.5, 30.0, 41.0, 200.25]
    assert set(table["task"]) == {"dmc_cartpole_swingup"} and set(table["seed"]) == {2}


def test_every_episode_comes_from_the_launchers_file(tmp_path):
    """The official scores.jsonl keeps one value per step: of 2 envs that end at frame 1000 it holds the last one.
    The launcher's episodes.jsonl holds both, and the conversion reads it when it is there."""
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    (logdir / "scores.jsonl").write_text('{"step": 1000, "episode/score": 7.0}\n')
    (logdir / "episodes.jsonl").write_text('{"step": 1000, "episode/score": 5.0, "episode/length": 500}\n'
                                           '{"step": 1000, "episode/score": 7.0, "episode/length": 500, '
                                           '"time": 1764756000.5}\n')
    values = resolve_values("2023", "cpu", [], "cartpole_swingup", 0)
    assert convert_official(logdir, tmp_path / "run", "2023", values, []) == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "scores.jsonl").read_text().splitlines()]
    assert [(r["frames"], r["return"], r["length"]) for r in rows] == [(1000, 5.0, 500), (1000, 7.0, 500)]
    assert "time" not in rows[0] and rows[1]["time"] == 1764756000.5  # the launcher's end time, where it wrote one


def test_conversion_refuses_a_foreign_log(tmp_path):
    (tmp_path / "scores.jsonl").write_text('{"step": 10, "return": 1.0}\n')
    values = resolve_values("2023", "cpu", [], "cartpole_swingup", 0)
    with pytest.raises(ValueError, match="line 1 is not an official score record"):
        convert_official(tmp_path, tmp_path / "run", "2023", values, [])
    with pytest.raises(FileNotFoundError, match="has not finished an episode yet"):
        convert_official(tmp_path / "empty", tmp_path / "run", "2023", values, [])
    # before the official run starts: an empty run folder, so that a search for runs stops there
    assert convert_official(tmp_path / "empty", tmp_path / "run", "2023", values, [], allow_empty=True) == 0
    assert (tmp_path / "run" / "scores.jsonl").read_text() == "" and (tmp_path / "run" / "config.yaml").is_file()


def test_wall_minutes_add_up_over_attempts(tmp_path):
    assert add_wall(tmp_path, 90.0, {"side": "reverie"}) == 1.5
    assert add_wall(tmp_path, 30.0, {"side": "reverie"}) == 2.0
    data = json.loads((tmp_path / "fidelity.json").read_text())
    assert [a["wall_s"] for a in data["attempts"]] == [90.0, 30.0] and data["side"] == "reverie"


def test_cpu_minutes_add_up_over_the_attempts_that_measured_them(tmp_path):
    add_wall(tmp_path, 120.0, {"side": "official"})  # an attempt of an older harness: wall time only
    add_wall(tmp_path, 60.0, {"side": "official"}, cpu_seconds=54.0)
    add_wall(tmp_path, 60.0, {"side": "official"}, cpu_seconds=30.0)
    data = json.loads((tmp_path / "fidelity.json").read_text())
    assert data["wall_minutes"] == 4.0 and data["cpu_minutes"] == 1.4
    assert data["cpu_measured_attempts"] == "2 of 3" and "cpu_s" not in data["attempts"][0]


def test_children_cpu_counts_a_waited_for_child():
    import subprocess

    from bench.fidelity import children_cpu

    before = children_cpu()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"],
                   check=True)
    assert children_cpu() - before >= 0.25


def test_install_exports_the_code_of_the_commit_without_the_score_files(tmp_path, monkeypatch):
    import subprocess

    import bench.fidelity as fidelity

    repo = tmp_path / "origin"
    (repo / "dreamerv3").mkdir(parents=True)
    (repo / "scores").mkdir()
    (repo / "dreamerv3" / "train.py").write_text("print('train')\n")
    (repo / "scores" / "big.json.gz").write_bytes(b"\x00" * 10)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setitem(fidelity.COMMITS, "2023", commit)
    source = fidelity.ensure_source("2023", tmp_path / "src", str(repo))
    assert (source / "dreamerv3" / "train.py").read_text() == "print('train')\n"
    assert not (source / "scores").exists() and (source / ".fidelity_commit").read_text().strip() == commit
    assert fidelity.ensure_source("2023", source, "/nonexistent") == source  # already exported: nothing to fetch


def _fake_run(folder, rows, fidelity, metrics=None, official=False):
    folder.mkdir(parents=True)
    (folder / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "fidelity.json").write_text(json.dumps(fidelity))
    if official:
        (folder / "logdir").mkdir()
    if metrics is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))


def test_report_window_means_intervals_and_the_return_at_equal_wall_time(tmp_path):
    from bench.fidelity import report

    import time as _time

    start = _time.mktime(_time.strptime("2026-12-03 10:00:00", "%Y-%m-%d %H:%M:%S"))
    ended = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(start + 3000))
    for seed, (a, b) in enumerate([(100.0, 200.0), (300.0, 400.0)]):
        # official: episodes at 50k frames (1000 s into its one 3000 s attempt) and at 100k frames (3000 s)
        rows = [{"frames": 50_000, "return": a, "mode": "train", "time": start + 1000},
                {"frames": 100_000, "return": b, "mode": "train", "time": start + 3000}]
        _fake_run(tmp_path / f"official_2023_cartpole_swingup_s{seed}", rows,
                  {"attempts": [{"wall_s": 3000.0, "ended": ended}], "wall_minutes": 50.0}, official=True)
    for seed, ret in enumerate([250.0, 350.0, 150.0]):
        rows = [{"frames": 80_000, "return": 0.0, "mode": "train"}, {"frames": 95_000, "return": ret, "mode": "train"},
                {"frames": 100_000, "return": 999.0, "mode": "eval"}]
        _fake_run(tmp_path / f"reverie_2023_cartpole_swingup_s{seed}", rows,
                  {"attempts": [], "wall_minutes": 16.0 + seed, "cpu_minutes": 15.0 + seed},
                  metrics=[{"frames": 100_000, "wall_s": 960.0 + 60 * seed}])
    text = report(tmp_path, "2023")
    # per run: the training episodes ending in [90k, 110k] frames (eval episodes and earlier ones left out)
    assert "| cartpole_swingup | reverie | 1 | 350.0 | 100,000 | 17.0 | 16.0 |" in text
    assert "| cartpole_swingup | official | 0 | 200.0 | 100,000 | 50.0 | - |" in text
    # per side: mean over seeds with a 95% t interval: reverie 250 +- t(0.975, 2) * 100 / sqrt(3)
    half = 4.302652729911275 * 100.0 / 3 ** 0.5
    assert f"| cartpole_swingup | reverie | 3 | 250.0 [{250 - half:.1f}, {250 + half:.1f}] | 17.0 |" in text
    half = 12.706204736174698 * 2 ** 0.5 * 100.0 / 2 ** 0.5  # windows 200 and 400: std 100 * sqrt(2)
    assert f"| cartpole_swingup | official | 2 | 300.0 [{300 - half:.1f}, {300 + half:.1f}] | 50.0 |" in text
    # at reverie's median wall time (17 min = 1020 s) the official runs had 50k + 50k * 20/2000 = 50,500 frames:
    # their return then is the episode at 50k frames (the one ending in the 10k frames before)
    assert "| cartpole_swingup | 0 | 17.0 | 50,500 | 100.0 |" in text
    assert "| cartpole_swingup | 1 | 17.0 | 50,500 | 300.0 |" in text


def test_the_launchers_episode_lines_carry_length_and_end_time(tmp_path):
    import time as _time

    from bench.fidelity_launcher import _EpisodeLines

    out = _EpisodeLines(str(tmp_path))
    before = _time.time()
    out([(1000, "episode/length", 500), (1000, "episode/score", 5.0), (1000, "episode/score", 7.0)])
    lines = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert [(r["step"], r["episode/score"], r["episode/length"]) for r in lines] == [(1000, 5.0, 500), (1000, 7.0, None)]
    assert all(before - 1 <= r["time"] <= _time.time() + 1 for r in lines)
