"""Readers: both official formats and reverie runs into one tidy table; errors name the problem."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from conftest import binned_run, current_run, make_run, write_official

from reverie.scores import readers, references
from reverie.scores.readers import COLUMNS, ScoreFormatError, canonical_task, read_official


def test_current_format_rows_frames_and_agent_steps(reference_dir):
    table = read_official(reference_dir / "dreamerv3" / "atari100k-dreamerv3.json.gz")
    assert list(table.columns) == COLUMNS
    assert len(table) == 5 + 3 + 2 + 2
    assert set(table["suite"]) == {"atari100k"} and set(table["method"]) == {"dreamerv3"}
    pong0 = table[(table["task"] == "atari_pong") & (table["seed"] == 0)]
    assert pong0["frames"].tolist() == [380_000, 390_000, 395_000, 400_000, 400_004]
    assert pong0["agent_steps"].tolist() == [95_000, 97_500, 98_750, 100_000, 100_001]  # frames / 4
    assert pong0["return"].tolist() == [-21, 10, 12, 14, 21]
    assert (table["bin_width"] == 0).all()
    assert table["seed"].dtype == np.int64


def test_2023_format_string_seeds_bins_and_nan_dropped(reference_dir):
    table = read_official(reference_dir / "dreamerv3-2023" / "atari100k_dreamerv3.json.gz", method="dreamerv3-2023")
    assert set(table["seed"]) == {0, 1} and table["seed"].dtype == np.int64
    assert (table["bin_width"] == 10_000).all()
    assert set(table["method"]) == {"dreamerv3-2023"}
    assert len(table) == 4 * 40 - 1  # 40 bins per run, one NaN bin dropped
    box1 = table[(table["task"] == "atari_boxing") & (table["seed"] == 1)]
    assert 390_000 not in box1["frames"].tolist()
    assert box1["frames"].max() == 400_000 and box1["agent_steps"].max() == 100_000


def test_suite_and_task_aliases_of_2023_dmc_files(tmp_path):
    path = write_official(tmp_path / "dmcproprio_dreamerv3.json.gz",
                          [binned_run("dmc_cup_catch", 0, [100.0, 200.0, 300.0])])
    table = read_official(path)
    assert set(table["suite"]) == {"dmc_proprio"}
    assert set(table["task"]) == {"dmc_ball_in_cup_catch"}
    assert table["agent_steps"].tolist() == [5_000, 10_000, 15_000]  # DMC action repeat 2


def test_null_returns_of_current_binned_files_are_dropped(tmp_path):
    path = write_official(tmp_path / "atari57-dreamerv3.json.gz",
                          [current_run("atari_pong", 0, [0.0, 400_000.0, 800_000.0], [None, 1.0, 2.0])])
    table = read_official(path)
    assert table["frames"].tolist() == [400_000, 800_000]
    assert (table["bin_width"] == 400_000).all()


@pytest.mark.parametrize("content, match", [
    (b"not json", "not a \\(gzipped\\) JSON score file"),
    (b'{"task": "atari_pong"}', "expected a JSON list of runs"),
    (b'[{"task": "atari_pong", "method": "m", "seed": 0, "xs": [1, 2]}]', "lacks keys"),
    (b'[{"task": "atari_pong", "method": "m", "seed": 0, "xs": [1, 2], "ys": [1]}]', "2 xs but 1 ys"),
    (b'[{"task": "atari_pong", "method": "m", "seed": "a", "xs": [1], "ys": [1]}]', "not an integer"),
])
def test_wrong_format_is_a_clear_error(tmp_path, content, match):
    path = tmp_path / "atari100k-x.json.gz"
    path.write_bytes(gzip.compress(content))
    with pytest.raises(ScoreFormatError, match=match):
        read_official(path)


def test_missing_files_and_unknown_reference(tmp_path, reference_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_official(tmp_path / "nope.json.gz")
    with pytest.raises(FileNotFoundError, match="no score file for reference 'dreamerv3' on suite 'dmc_vision'.*"
                                                "references with a file for dmc_vision there: none"):
        references.reference_path("dmc_vision", "dreamerv3", reference_dir)
    with pytest.raises(FileNotFoundError, match="no score file for reference 'dreamerv9' on suite 'atari100k'.*"
                                                "there: dreamerv3, dreamerv3-2023"):
        references.reference_path("atari100k", "dreamerv9", reference_dir)
    assert references.reference_path("atari100k", "dreamerv3-2023", reference_dir).name == "atari100k_dreamerv3.json.gz"


@pytest.mark.parametrize("name, suite, expected", [
    ("ALE/MsPacman-v5", "atari100k", "atari_ms_pacman"),
    ("UpNDown", "atari100k", "atari_up_n_down"),
    ("KungFuMaster", "atari57", "atari_kung_fu_master"),
    ("pong", "atari100k", "atari_pong"),
    ("atari_pong", "atari100k", "atari_pong"),
    ("cup_catch", "dmc_vision", "dmc_ball_in_cup_catch"),
    ("CartPole-v1", "generic", "CartPole-v1"),
])
def test_canonical_task(name, suite, expected):
    assert canonical_task(name, suite) == expected


def test_reverie_run_frames_are_steps_times_repeat(tmp_path):
    run = make_run(tmp_path, "r", [(1000, 5.0), (2000, 7.0)], env_id="ALE/Pong-v5", action_repeat=4, seed=3)
    make_run(tmp_path, "evalrun", [(2000, 9.0)], mode="eval")
    table = readers.read_run(run, suite="atari100k", method="ours")
    assert list(table.columns) == COLUMNS
    assert table["agent_steps"].tolist() == [1000, 2000]
    assert table["frames"].tolist() == [4000, 8000]
    assert set(table["task"]) == {"atari_pong"} and set(table["seed"]) == {3} and set(table["method"]) == {"ours"}
    assert readers.read_run(tmp_path / "evalrun").empty  # mode="train" by default
    assert readers.read_run(tmp_path / "evalrun", mode="eval")["return"].tolist() == [9.0]


def test_record_without_frames_uses_config_repeat(tmp_path):
    run = make_run(tmp_path, "r", [(10, 1.0)], action_repeat=2, frames=False)
    assert readers.read_run(run)["frames"].tolist() == [20]


def test_find_runs_in_folders_and_errors(tmp_path):
    make_run(tmp_path / "set", "a", [(1, 1.0)])
    make_run(tmp_path / "set", "b", [(1, 1.0)])
    assert [p.name for p in readers.find_runs([tmp_path / "set"])] == ["a", "b"]
    assert [p.name for p in readers.find_runs([tmp_path / "set" / "a"])] == ["a"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        readers.find_runs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no scores.jsonl"):
        readers.find_runs([tmp_path / "empty"])


def test_bad_run_files(tmp_path):
    run = make_run(tmp_path, "r", [(1, 1.0)])
    (run / "scores.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    with pytest.raises(ScoreFormatError, match="line 1 is not a reverie episode record"):
        readers.read_run(run)
    (run / "config.yaml").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.yaml"):
        readers.read_run(run)
