"""``reverie compare`` end to end on synthetic files: tables, numbers, files written, errors."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import make_run, write_official

from reverie.cli import main
from reverie.scores.cli import cmd_compare


ATARI100K_METADATA = {"suite": "atari", "task": "pong", "env_id": "ALE/Pong-v5", "action_repeat": 4,
                      "sticky_action_probability": 0.0, "noops_max": 30}


def test_reference_only_both_formats(reference_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = cmd_compare(["--reference-only", "--suite", "atari100k", "--reference", "dreamerv3", "dreamerv3-2023",
                        "--reference-dir", str(reference_dir), "--out", str(out), "--reps", "100"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = {line.split("|")[1].strip(): line for line in captured.out.splitlines() if line.startswith("| atari_")}
    # current: pong (12 + 17) / 2 = 14.5, boxing 65; 2023: pong 16, boxing 70 from 1 of 2 seeds (no CI from one).
    # The bootstrap CI of a mean over two seeds is [min, max]: resamples are {a, a}, {a, b}, {b, b}.
    assert "14.5 [12.0, 17.0] (2/2)" in lines["atari_pong"] and "16.0 [15.0, 17.0] (2/2)" in lines["atari_pong"]
    assert "65.0 [50.0, 80.0] (2/2)" in lines["atari_boxing"] and " 70.0 (1/2) |" in lines["atari_boxing"]
    assert f"{(14.5 + 20.7) / 35.3:.3f}" in lines["atari_pong"]  # 0.997
    assert "note: no episode ended in frames [390000, 400000] for: dreamerv3-2023/atari_boxing/seed 1" in captured.err
    aggregates = pd.read_csv(out / "aggregates.csv").set_index(["method", "metric"])
    hns = {"pong": [(12 + 20.7) / 35.3, (17 + 20.7) / 35.3], "boxing": [(50 - 0.1) / 12, (80 - 0.1) / 12]}
    assert aggregates.loc[("dreamerv3", "mean"), "value"] == pytest.approx(
        (sum(hns["pong"]) / 2 + sum(hns["boxing"]) / 2) / 2, rel=1e-12)
    assert aggregates.loc[("dreamerv3", "iqm"), "value"] == pytest.approx(
        (hns["pong"][1] + hns["boxing"][0]) / 2, rel=1e-12)  # middle two of four
    assert aggregates.loc[("dreamerv3", "optimality_gap"), "value"] == pytest.approx(
        1 - (hns["pong"][0] + 3) / 4, rel=1e-12)
    for name in ("table.md", "run_scores.csv", "curves.png", "curves.svg", "aggregates.png", "aggregates.svg"):
        assert (out / name).stat().st_size > 0, name
    assert "## Aggregates of the human-normalised score over 2 tasks" in (out / "table.md").read_text()
    assert "Which tasks each mean covers" not in captured.out  # every set is scored on every task
    assert "dreamerv3: `atari100k-dreamerv3.json.gz`, read as episodes" in captured.out
    assert ("dreamerv3-2023: `atari100k_dreamerv3.json.gz`, read as bins of 10000 frames: y = mean return of the "
            "episodes ending in [x, x + 10000) (auto: a regular grid without a score at x = 0") in captured.out
    assert captured.out.rstrip().endswith(f"wrote {out}/: table.md, run_scores.csv, aggregates.csv, curves.png, "
                                          f"curves.svg, aggregates.png, aggregates.svg")


def test_runs_against_reference_on_the_frame_axis(reference_dir, tmp_path, capsys):
    """A reverie Pong run with action repeat 4 is scored on frames and compared with the reference's Pong only."""
    make_run(tmp_path / "runs", "pong0", [(97_500, 0.0), (99_000, 4.0)], env_id="ALE/Pong-v5", action_repeat=4,
             metadata=ATARI100K_METADATA)
    code = cmd_compare([str(tmp_path / "runs"), "--reference-dir", str(reference_dir),
                        "--out", str(tmp_path / "out"), "--reps", "50", "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "| atari_pong" in captured.out and "atari_boxing" not in captured.out
    pong = next(line for line in captured.out.splitlines() if line.startswith("| atari_pong"))
    assert " 2 (1/1) |" in pong and "14.5 [12.0, 17.0] (2/2)" in pong  # ours (0 + 4) / 2 next to dreamerv3
    assert "suite atari100k (from the runs' env_metadata.json)" in captured.out  # inferred, no --suite
    assert "train episodes of our runs" in captured.out
    assert not (tmp_path / "out" / "curves.png").exists()


def test_two_sets_generic_suite_through_reverie_main(tmp_path, capsys):
    for seed, (lo, hi) in enumerate([(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]):
        make_run(tmp_path / "a", f"s{seed}", [(50, 0.0), (95, lo), (100, hi)], seed=seed)
        make_run(tmp_path / "b", f"s{seed}", [(50, 0.0), (95, lo + 3), (100, hi + 3)], seed=seed)
    code = main(["compare", str(tmp_path / "a"), "--baseline", str(tmp_path / "b"), "--name", "new",
                 "--baseline-name", "old", "--out", str(tmp_path / "out"), "--reps", "200"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "window [90, 100] environment frames" in captured.out
    assert "IQM difference = -3, 95% CI [" in captured.out
    assert "permutation test p = 0.1 (exact, 20 relabellings within tasks)" in captured.out
    assert "p = 0.02131" in captured.out  # Welch, worked out in test_score_aggregate
    assert "Optimality gap" not in captured.out  # raw returns: no 'solved' level
    assert (tmp_path / "out" / "difference.png").is_file() and (tmp_path / "out" / "difference.svg").is_file()


@pytest.mark.parametrize("argv, message", [
    ([], "give run directories"),
    (["/nonexistent/run"], "/nonexistent/run does not exist"),
    (["--reference-only", "--suite", "generic"], "--reference-only needs a reference"),
])
def test_errors_exit_2_with_a_message(argv, message, tmp_path, capsys):
    assert cmd_compare(argv + ["--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_unknown_suite_and_foreign_tasks(reference_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cmd_compare(["--reference-only", "--suite", "atari200k"])
    assert exit_info.value.code == 2 and "invalid choice: 'atari200k'" in capsys.readouterr().err
    make_run(tmp_path / "runs", "cp", [(10, 1.0)])
    assert cmd_compare([str(tmp_path / "runs"), "--suite", "atari100k", "--reference-dir", str(reference_dir),
                        "--out", str(tmp_path / "o")]) == 2
    assert "the atari100k reference has none of the runs' tasks (atari_cart_pole)" in capsys.readouterr().err


def test_short_run_against_reference_explains_the_window(reference_dir, tmp_path, capsys):
    """A run that never reaches the atari100k window has no score; the error says why and how to compare it."""
    make_run(tmp_path / "runs", "short", [(100, 1.0), (200, 2.0)], env_id="ALE/Pong-v5", action_repeat=4,
             metadata=ATARI100K_METADATA)
    code = cmd_compare([str(tmp_path / "runs"), "--reference-dir", str(reference_dir),
                        "--out", str(tmp_path / "out"), "--reps", "50", "--no-plots"])
    err = capsys.readouterr().err
    assert code == 2
    assert "[390k, 400k] frames" in err and "--reference none" in err


def test_means_say_which_tasks_they_cover(reference_dir, tmp_path, capsys):
    """The issue's case: a reference without a score on one game. The table's mean of the other reference covers
    that game and its aggregate does not; the report says so next to the numbers."""
    write_official(reference_dir / "dreamerv3-2023" / "atari100k_dreamerv3.json.gz", [
        {"task": task, "method": "dreamerv3", "seed": str(seed), "xs": [370_000.0, 380_000.0, 390_000.0],
         "ys": [1.0, 2.0, value]} for task, value in (("atari_pong", 15.0), ("atari_boxing", float("nan")))
        for seed in (0, 1)])
    code = cmd_compare(["--reference-only", "--suite", "atari100k", "--reference", "dreamerv3", "dreamerv3-2023",
                        "--reference-dir", str(reference_dir), "--out", str(tmp_path / "out"), "--reps", "100",
                        "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    pong, boxing = (14.5 + 20.7) / 35.3, (65 - 0.1) / 12
    mean_row = next(line for line in captured.out.splitlines() if line.startswith("| **mean**"))
    assert f"{(pong + boxing) / 2:.3f} (2 tasks)" in mean_row and f"{(15 + 20.7) / 35.3:.3f} (1 task)" in mean_row
    aggregates = pd.read_csv(tmp_path / "out" / "aggregates.csv").set_index(["method", "metric"])
    assert aggregates.loc[("dreamerv3", "mean"), "value"] == pytest.approx(pong, rel=1e-12)  # pong only
    assert ("**Which tasks each mean covers.** The aggregates average the 1 task every set has a score on; left "
            "out: atari_boxing (dreamerv3-2023: no episode in the window).") in captured.out
    assert ("The per-task table's mean and median of dreamerv3 average its 2 tasks with a score, atari_boxing "
            "included, so they differ from dreamerv3's aggregate mean and median.") in captured.out


def test_task_without_baseline_keeps_its_return_and_is_named(tmp_path, capsys):
    make_run(tmp_path / "runs", "pong", [(99_000, 4.0)], metadata=ATARI100K_METADATA, env_id="ALE/Pong-v5",
             action_repeat=4)
    make_run(tmp_path / "runs", "skiing", [(99_000, -9000.0)], metadata=ATARI100K_METADATA,
             env={"suite": "atari", "task": "skiing", "action_repeat": 4}, action_repeat=4)
    code = cmd_compare([str(tmp_path / "runs"), "--reference", "none", "--out", str(tmp_path / "out"),
                        "--reps", "50", "--no-plots"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    skiing = next(line for line in captured.out.splitlines() if line.startswith("| atari_skiing"))
    assert "-9000 (1/1)" in skiing and "nan" in skiing
    assert "note: no random/human baseline for atari_skiing" in captured.err
    assert ("left out: atari_skiing (reverie: no random/human baseline).\nThe per-task table's mean and median rows "
            "average the same 1 task.") in captured.out
    assert f"{(4 + 20.7) / 35.3:.3f} (1 task)" in captured.out


def test_reference_only_without_score_files_names_the_fetch_command(tmp_path, capsys, monkeypatch):
    """Issue 47: before `reverie scores fetch`, --reference-only names the folders looked in and the command."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REVERIE_REFERENCE_SCORES", raising=False)
    assert cmd_compare(["--reference-only", "--suite", "atari100k", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "suite 'atari100k' has none: no reference score folder found" in err
    assert "reverie scores fetch" in err
