"""Determinism: the same seed gives the same run, bit for bit (wall-time fields aside); another seed another run."""

from helpers.runs import read_jsonl, train, without_timing


def test_two_seeded_runs_give_identical_losses(tmp_path):
    runs = [train(tmp_path, f"run{i}", "seed=3", "train.steps=120") for i in range(2)]
    a, b = (read_jsonl(r / "metrics.jsonl") for r in runs)
    assert any("loss/model" in m for m in a)
    assert without_timing(a) == without_timing(b)
    assert (runs[0] / "scores.jsonl").read_text() == (runs[1] / "scores.jsonl").read_text()


def test_different_seeds_differ(tmp_path):
    a = read_jsonl(train(tmp_path, "s1", "seed=1", "train.steps=120") / "metrics.jsonl")
    b = read_jsonl(train(tmp_path, "s2", "seed=2", "train.steps=120") / "metrics.jsonl")
    assert [m.get("loss/model") for m in a] != [m.get("loss/model") for m in b]
