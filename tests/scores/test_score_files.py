"""Any score file in the official format, under its own method name; bins or points on a grid, said and chosen."""

from __future__ import annotations

import pytest
from conftest import binned_run, current_run, write_official

from reverie.scores import readers, references
from reverie.scores.cli import cmd_compare
from reverie.scores.readers import ScoreFormatError, choose_reading, read_score_file


def grid_run(task: str, seed: int, ys: list, method: str = "drqv2", start: float = 0.0) -> dict:
    """A published evaluation-point file: integer seed, xs = start, start + 20k, ..."""
    return {"task": task, "method": method, "seed": seed, "xs": [start + 20_000 * i for i in range(len(ys))],
            "ys": ys}


@pytest.mark.parametrize("runs, kind, step", [
    ([current_run("atari_pong", 0, [4_112, 6_692, 9_080], [1.0, 2.0, 3.0])], "episodes", 0.0),
    ([binned_run("atari_pong", 0, [1.0, 2.0, 3.0])], "bins", 10_000.0),  # 10k, 20k, 30k: no x = 0
    ([grid_run("dmc_walker_walk", 0, [30.0, 200.0, 400.0])], "points", 20_000.0),  # a score at x = 0
    ([grid_run("atari_pong", 0, [None, 1.0, 2.0])], "bins", 20_000.0),  # null at 0 (current atari57): bins
])
def test_auto_reading(runs, kind, step):
    reading = choose_reading(runs)
    assert (reading.kind, reading.step) == (kind, step)
    assert reading.why.startswith("auto: ")


def test_chosen_reading_and_errors():
    grid = [grid_run("dmc_walker_walk", 0, [30.0, 200.0, 400.0])]
    assert choose_reading(grid, "bins") == readers.Reading("bins", 20_000.0, "--reading bins")
    assert choose_reading([binned_run("atari_pong", 0, [1.0, 2.0, 3.0])], "points").kind == "points"
    episodes = [current_run("atari_pong", 0, [4_112, 6_692, 9_080], [1.0, 2.0, 3.0])]
    with pytest.raises(ScoreFormatError, match="--reading bins needs xs on one regular grid"):
        choose_reading(episodes, "bins", "x.json.gz")
    assert choose_reading(episodes, "points").kind == "episodes"
    with pytest.raises(ValueError, match="unknown reading 'mean'"):
        choose_reading(grid, "mean")


def test_points_and_bins_tables(tmp_path):
    path = write_official(tmp_path / "dmc_vision-drqv2.json.gz", [grid_run("dmc_walker_walk", 0, [30.0, 200.0, 400.0])])
    points, reading = read_score_file(path)
    assert reading.kind == "points" and set(points["method"]) == {"drqv2"}  # the file's own method name
    assert points["frames"].tolist() == [0, 20_000, 40_000] and (points["bin_width"] == 0).all()
    assert points["agent_steps"].tolist() == [0, 10_000, 20_000]  # DMC action repeat 2
    bins, _ = read_score_file(path, reading="bins")
    assert (bins["bin_width"] == 20_000).all()


@pytest.fixture
def user_files(reference_dir):
    """Files a user downloaded next to the official ones: DrQ-v2 on DMC vision (points every 20k frames) and PPO on
    Atari100k (episodes), each under its own method name."""
    write_official(reference_dir / "dreamerv3" / "dmc_vision-drqv2.json.gz", [
        grid_run("dmc_walker_walk", 0, [30.0, 200.0, 400.0, 600.0]),
        grid_run("dmc_walker_walk", 1, [20.0, 100.0, 300.0, 500.0])])
    write_official(reference_dir / "atari100k-ppo_fixhp.json.gz", [
        current_run("atari_pong", s, [391_000, 399_000], [r, r + 2.0], method="ppo_fixhp") for s, r in ((0, -20.0),
                                                                                                        (1, -18.0))])
    return reference_dir


def test_compare_reads_another_methods_file_by_name(user_files, tmp_path, capsys):
    out = tmp_path / "out"
    code = cmd_compare(["--reference-only", "--suite", "dmc_vision", "--reference", "drqv2", "--reference-dir",
                        str(user_files), "--window", "20000", "40000", "--out", str(out), "--reps", "100",
                        "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert ("- drqv2: `dmc_vision-drqv2.json.gz`, read as points on a 20000-frame grid: y = an evaluation at x "
            "frames (auto: a regular grid with a score at x = 0") in captured.out
    row = next(line for line in captured.out.splitlines() if line.startswith("| dmc_walker_walk"))
    assert "250 [200, 300] (2/2)" in row  # points 20k and 40k: seeds (200 + 400) / 2 and (100 + 300) / 2

    code = cmd_compare(["--reference-only", "--suite", "dmc_vision", "--reference", "drqv2", "--reference-dir",
                        str(user_files), "--window", "20000", "40000", "--reading", "bins", "--out",
                        str(tmp_path / "bins"), "--reps", "100", "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    row = next(line for line in captured.out.splitlines() if line.startswith("| dmc_walker_walk"))
    assert "150 [100, 200] (2/2)" in row  # only bin [20k, 40k) overlaps [20k, 40k] by a positive length
    assert "read as bins of 20000 frames" in captured.out and "(--reading bins)" in captured.out


def test_named_and_path_references_next_to_dreamerv3(user_files, tmp_path, capsys):
    code = cmd_compare(["--reference-only", "--suite", "atari100k", "--reference", "dreamerv3", "ppo_fixhp",
                        str(user_files / "atari100k-ppo_fixhp.json.gz"),
                        "--reference-dir", str(user_files), "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 2  # the same file twice: two sets labelled ppo_fixhp
    assert "two score sets are both labelled 'ppo_fixhp'" in capsys.readouterr().err
    code = cmd_compare(["--reference-only", "--suite", "atari100k", "--reference", "dreamerv3", "ppo_fixhp",
                        "--reference-dir", str(user_files), "--out", str(tmp_path / "o"), "--reps", "100",
                        "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ppo_fixhp return" in captured.out
    pong = next(line for line in captured.out.splitlines() if line.startswith("| atari_pong"))
    assert "-18.0 [-19.0, -17.0] (2/2)" in pong  # seeds (-20 - 18) / 2 = -19 and (-18 - 16) / 2 = -17
    assert "- ppo_fixhp: `atari100k-ppo_fixhp.json.gz`, read as episodes" in captured.out


def test_reference_lookup(user_files, tmp_path):
    assert references.available("atari100k", user_files) == ["dreamerv3", "dreamerv3-2023", "ppo_fixhp"]
    assert references.available("dmc_vision", user_files) == ["drqv2"]
    assert references.reference_path("dmc_vision", "drqv2", user_files).parent.name == "dreamerv3"
    # a 2023-spelled file next to it (a folder `reverie scores fetch` filled): the current spelling wins
    write_official(user_files / "mine" / "dmcvision_drqv2.json.gz", [grid_run("dmc_walker_walk", 0, [1.0, 2.0, 3.0])])
    assert references.reference_path("dmc_vision", "drqv2", user_files).parent.name == "dreamerv3"
    write_official(user_files / "mine" / "dmc_vision-drqv2.json.gz", [grid_run("dmc_walker_walk", 0, [1.0, 2.0, 3.0])])
    with pytest.raises(ValueError, match="reference 'drqv2' on suite 'dmc_vision' matches 3 files"):
        references.reference_path("dmc_vision", "drqv2", user_files)
    with pytest.raises(FileNotFoundError, match="score file .*nope.json.gz does not exist"):
        references.reference_path("atari100k", str(tmp_path / "nope.json.gz"), user_files)
    assert references.label("dreamerv3-2023") == "dreamerv3-2023" and references.label("ppo_fixhp") is None


def test_a_file_of_another_suite_is_refused(user_files, tmp_path, capsys):
    code = cmd_compare(["--reference-only", "--suite", "atari100k", "--reference",
                        str(user_files / "dreamerv3" / "dmc_vision-drqv2.json.gz"), "--out", str(tmp_path / "o")])
    assert code == 2
    assert "is for suite dmc_vision, but this comparison is on suite atari100k" in capsys.readouterr().err
