"""The scoring suite comes from the runs' env metadata; DMC proprio runs are scored on eval episodes at 100k frames."""

from __future__ import annotations

import struct
from pathlib import Path

import pandas as pd
import pytest
from conftest import binned_run, make_dmc_run, make_run, write_official
from omegaconf import OmegaConf

from reverie.envs.factory import env_metadata
from reverie.scores import suites
from reverie.scores.cli import cmd_compare

ENV_CONFIGS = Path(__file__).resolve().parents[2] / "reverie" / "configs" / "env"


@pytest.mark.parametrize("config, overrides, expected", [
    ("dmc_proprio", {}, "dmc_proprio"),
    ("dmc_vision", {}, "dmc_vision"),
    ("dmc_vision", {"proprio": True}, "dmc_vision"),  # image and vector: the pixel benchmark
    ("atari100k", {}, "atari100k"),
    ("atari", {}, "atari57"),
    ("cartpole", {}, "generic"),
])
def test_score_suite_of_the_shipped_env_configs(config, overrides, expected):
    """Through the metadata training writes (reverie.envs.factory.env_metadata) for each env config."""
    env = OmegaConf.to_container(OmegaConf.load(ENV_CONFIGS / f"{config}.yaml"))
    assert suites.score_suite(env_metadata({**env, **overrides})) == expected


def test_metadata_file_first_then_config(tmp_path):
    with_file = make_run(tmp_path, "a", [(1, 1.0)], metadata={"suite": "dmc", "observations": ["vector"]})
    assert suites.run_metadata(with_file)[1] == "env_metadata.json"
    from_config = make_run(tmp_path, "b", [(1, 1.0)], env={"suite": "dmc", "task": "walker_walk", "image": True,
                                                           "proprio": False, "action_repeat": 2})
    metadata, source = suites.run_metadata(from_config)
    assert source == "config.yaml" and suites.score_suite(metadata) == "dmc_vision"
    assert suites.infer_suite([with_file]) == ("dmc_proprio", "env_metadata.json")


def test_mixed_suites_are_an_error_and_suite_overrides(tmp_path, capsys):
    make_dmc_run(tmp_path / "runs", "dmc", 0, [(100_000, [1.0])])
    make_run(tmp_path / "runs", "cartpole", [(100, 1.0)], mode="eval")
    assert cmd_compare([str(tmp_path / "runs"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "the runs belong to different suites (dmc_proprio: " in err and "; generic: " in err
    assert "pass --suite to score them all under one protocol" in err

    assert cmd_compare([str(tmp_path / "runs" / "dmc"), "--suite", "generic", "--mode", "eval", "--out",
                        str(tmp_path / "o"), "--reps", "20", "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "note: --suite generic overrides the runs' own suite dmc_proprio (from their env_metadata.json)" in \
        captured.err
    assert "suite generic (--suite)" in captured.out


@pytest.fixture
def dmc_reference(tmp_path: Path) -> Path:
    """2023-format DMC proprio file: 10k-frame bins labelled 10k..120k; cartpole_swingup seeds 0 and 1 hold
    300/500/800 and 500/700/900 in the bins 90k/100k/110k, walker_walk is not among our tasks."""
    def ys(a, b, c):
        return [0.0] * 8 + [a, b, c, 0.0]  # bins 10k..80k, 90k, 100k, 110k, 120k

    root = tmp_path / "reference"
    write_official(root / "dreamerv3-2023" / "dmcproprio_dreamerv3.json.gz", [
        binned_run("dmc_cartpole_swingup", 0, ys(300.0, 500.0, 800.0)),
        binned_run("dmc_cartpole_swingup", 1, ys(500.0, 700.0, 900.0)),
        binned_run("dmc_walker_walk", 0, ys(1.0, 1.0, 1.0)),
    ])
    return root


def _dmc_runs(root: Path) -> Path:
    """Seed 0: evaluations at 90k (400, 420) and 100k (500) frames -> 440; seed 1: 90k (600), 100k (640) -> 620.
    Evaluations at 80k and training episodes (9999) inside the window must not count."""
    make_dmc_run(root, "seed0", 0, [(80_000, [100.0, 120.0]), (90_000, [400.0, 420.0]), (100_000, [500.0])],
                 train=[(95_000, 9999.0), (99_000, 9999.0)])
    make_dmc_run(root, "seed1", 1, [(80_000, [50.0]), (90_000, [600.0]), (100_000, [640.0])],
                 train=[(97_000, 9999.0)])
    return root


@pytest.mark.parametrize("window", [[], ["--window", "90000", "110000"]])
def test_dmc_proprio_runs_against_the_official_file(dmc_reference, tmp_path, capsys, window):
    runs, out = _dmc_runs(tmp_path / "runs"), tmp_path / "out"
    code = cmd_compare([str(runs), "--reference", "dreamerv3-2023", "--reference-dir", str(dmc_reference),
                        "--out", str(out), "--reps", "200", *window])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert ("suite dmc_proprio (from the runs' env_metadata.json), window [90000, 110000] environment frames, "
            "eval episodes of our runs") in captured.out
    row = next(line for line in captured.out.splitlines() if line.startswith("| dmc_cartpole_swingup"))
    # ours: (440 + 620) / 2 = 530, CI [440, 620]; official bins 90k and 100k: (400 + 600) / 2 = 500, CI [400, 600]
    assert "530 [440, 620] (2/2)" in row and "500 [400, 600] (2/2)" in row
    assert "0.530" in row and "0.500" in row and "dmc_walker_walk" not in captured.out
    scores = pd.read_csv(out / "run_scores.csv").set_index(["method", "seed"])
    assert scores.loc[("reverie", 0), "return"] == 440.0 and scores.loc[("reverie", 0), "episodes"] == 3
    assert scores.loc[("reverie", 1), "return"] == 620.0
    png = (out / "curves.png").read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # PNG IHDR
    assert len(png) < 150_000 and width < 800 and height < 600  # one small panel


def test_points_reading_of_the_official_file(dmc_reference, tmp_path, capsys):
    """--reading points: each x is an evaluation; [90k, 110k] holds the points 90k, 100k and 110k."""
    code = cmd_compare([str(_dmc_runs(tmp_path / "runs")), "--reference", "dreamerv3-2023", "--reference-dir",
                        str(dmc_reference), "--reading", "points", "--out", str(tmp_path / "out"), "--reps", "200",
                        "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    row = next(line for line in captured.out.splitlines() if line.startswith("| dmc_cartpole_swingup"))
    assert f"{(1600 / 3 + 700) / 2:.0f} [533, 700] (2/2)" in row  # seeds (300+500+800)/3 and (500+700+900)/3
    assert "read as points on a 10000-frame grid: y = an evaluation at x frames (--reading points)" in captured.out


def test_dmc_runs_without_eval_episodes_say_how_to_score_them(dmc_reference, tmp_path, capsys):
    make_dmc_run(tmp_path / "runs", "r", 0, [], train=[(100_000, 5.0)])
    assert cmd_compare([str(tmp_path / "runs"), "--reference-dir", str(dmc_reference), "--out",
                        str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no eval episodes in the reverie runs" in err and "DMC runs are scored by their evaluation episodes" in err
    assert "pass --mode train" in err


def test_suite_accepts_the_2023_file_spelling():
    from reverie.scores.cli import build_parser

    assert build_parser().parse_args(["--suite", "dmcproprio"]).suite == "dmc_proprio"
    assert build_parser().parse_args(["--suite", "dmc_vision"]).suite == "dmc_vision"
