"""Where compare writes: a new folder per call by default, never a silent overwrite of an earlier comparison."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from conftest import make_run

from reverie.scores import output
from reverie.scores.cli import cmd_compare

REPO = Path(__file__).resolve().parents[2]


def _runs(root: Path) -> Path:
    for seed in range(2):
        make_run(root, f"s{seed}", [(90, 1.0 + seed), (100, 3.0 + seed)], seed=seed)
    return root


def test_default_folder_is_new_on_every_call(tmp_path, monkeypatch, capsys):
    runs = _runs(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert cmd_compare([str(runs), "--reps", "20", "--no-plots"]) == 0, capsys.readouterr().err
    folders = sorted((tmp_path / "compare").iterdir())
    assert len(folders) == 2  # the second call did not touch the first one's folder
    for folder in folders:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d{6}_generic_reverie(_2)?", folder.name), folder.name
        assert (folder / "table.md").is_file()
    assert f"wrote compare/{folders[-1].name}/: table.md, run_scores.csv, aggregates.csv" in capsys.readouterr().out


def test_default_dir_appends_a_suffix_when_taken(tmp_path):
    now = dt.datetime(2026, 1, 2, 3, 4, 5)
    first = output.default_dir("atari100k_reverie", tmp_path, now)
    assert first == tmp_path / "2026-01-02_030405_atari100k_reverie"
    first.mkdir()
    second = output.default_dir("atari100k_reverie", tmp_path, now)
    assert second.name == "2026-01-02_030405_atari100k_reverie_2"
    second.mkdir()
    assert output.default_dir("atari100k_reverie", tmp_path, now).name == "2026-01-02_030405_atari100k_reverie_3"
    assert output.default_dir("a b/c", tmp_path, now).name == "2026-01-02_030405_a-b-c"  # one folder, no spaces


def test_used_out_is_refused_then_replaced_with_overwrite(tmp_path, capsys):
    runs, out = _runs(tmp_path / "runs"), tmp_path / "out"
    out.mkdir()
    (out / "table.md").write_text("earlier", encoding="utf-8")
    (out / "difference.png").write_bytes(b"stale")
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert cmd_compare([str(runs), "--out", str(out), "--reps", "20", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} already holds an earlier comparison (difference.png, table.md); nothing was written" in err
    assert "add --overwrite" in err
    assert (out / "table.md").read_text() == "earlier"

    assert cmd_compare([str(runs), "--out", str(out), "--overwrite", "--reps", "20", "--no-plots"]) == 0
    assert "# reverie compare" in (out / "table.md").read_text()
    assert not (out / "difference.png").exists()  # stale output of an earlier call is gone
    assert (out / "notes.txt").read_text() == "mine"  # files compare did not write are left alone


def test_empty_out_is_used_and_bad_combinations_are_errors(tmp_path, capsys):
    runs = _runs(tmp_path / "runs")
    (tmp_path / "empty").mkdir()
    assert cmd_compare([str(runs), "--out", str(tmp_path / "empty"), "--reps", "20", "--no-plots"]) == 0
    assert (tmp_path / "empty" / "table.md").is_file()
    capsys.readouterr()
    assert cmd_compare([str(runs), "--overwrite", "--reps", "20"]) == 2
    assert "--overwrite needs --out DIR" in capsys.readouterr().err
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert cmd_compare([str(runs), "--out", str(tmp_path / "file"), "--reps", "20"]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err


def test_bad_input_creates_no_folder(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "runs", "r", [(100, 1.0)], mode="train")
    monkeypatch.chdir(tmp_path)
    assert cmd_compare([str(tmp_path / "runs"), "--mode", "eval"]) == 2
    assert "no eval episodes in the reverie runs" in capsys.readouterr().err
    assert not (tmp_path / "compare").exists()


@pytest.mark.skipif(not (REPO / ".gitignore").is_file(), reason="not a checkout")
def test_default_folder_is_git_ignored():
    assert "compare/" in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
