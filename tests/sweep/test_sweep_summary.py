"""Sweep summary from trial directories (written here by hand, no training): per-configuration statistics, the
best configuration, comparisons, restart checks and the files written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from reverie.sweep import SweepSpecError, configurations, parse_spec
from reverie.sweep.runner import prepare_dir
from reverie.sweep.summary import config_table, trial_table, write_summary
from reverie.sweep.trial import STOPPED, trial_dir

SPEC = {"name": "s", "base": ["exp=debug"], "seeds": 3, "space": {"agent.train_ratio": [32, 128]}}
RETURNS = {32: [10.0, 20.0, 30.0], 128: [100.0, 140.0, 180.0]}


def make_trial(sweep_dir: Path, params: dict, seed: int, final: float, steps: int = 200) -> Path:
    """A finished reverie run directory: config.yaml, scores.jsonl (two evaluations), summary.json."""
    run = trial_dir(sweep_dir, params, seed)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "env": {"id": "CartPole-v1", "action_repeat": 1}}))
    rows = [{"step": steps // 2, "frames": steps // 2, "return": final / 2, "length": 5, "mode": "eval"},
            {"step": steps, "frames": steps, "return": final - 1, "length": 5, "mode": "eval"},
            {"step": steps, "frames": steps, "return": final + 1, "length": 5, "mode": "eval"}]
    (run / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"env_steps": steps, "updates": 7, "eval_return": final,
                                                  "evals": [], "wall_s": 60.0, "interrupted": False}))
    return run


@pytest.fixture()
def sweep(tmp_path):
    spec = parse_spec(SPEC)
    for params in configurations(spec):
        for seed, final in zip(spec.seeds, RETURNS[params["agent.train_ratio"]]):
            make_trial(tmp_path, params, seed, final)
    return spec, tmp_path


def test_config_table_means_and_order(sweep):
    spec, sweep_dir = sweep
    trials = trial_table(spec, sweep_dir)
    assert len(trials) == 6 and set(trials["status"]) == {"finished"}
    table = config_table(trials, ["agent.train_ratio"], reps=200)
    assert list(table["agent.train_ratio"]) == [128, 32]  # best first
    assert table["mean"].tolist() == [140.0, 20.0] and table["iqm"].tolist() == [140.0, 20.0]
    assert (table["mean_lo"] <= table["mean"]).all() and (table["mean"] <= table["mean_hi"]).all()
    assert table.loc[0, "mean_lo"] >= 100.0 and table.loc[0, "mean_hi"] <= 180.0  # bootstrap of 3 seeds stays inside
    assert table["seeds"].tolist() == [3, 3] and table["wall_s"].tolist() == [180.0, 180.0]


def test_write_summary_files_best_and_comparison(sweep):
    spec, sweep_dir = sweep
    result = write_summary(spec, sweep_dir)
    assert result["finished"] == 6 and result["incomplete"] == 0
    best = json.loads((sweep_dir / "best.json").read_text())
    assert best["params"] == {"agent.train_ratio": 128} and best["mean"] == 140.0 and best["seeds"] == 3
    assert best["command"] == "reverie train exp=debug agent.train_ratio=128"
    rows = (sweep_dir / "summary.csv").read_text().splitlines()
    header = rows[0].split(",")
    other = dict(zip(header, rows[2].split(",")))
    assert float(other["vs_best_diff"]) == 120.0  # IQM of 3 values is their mean: 140 - 20
    # every relabelling of the 6 runs into 3 + 3: only the observed split and its mirror are as extreme (2 / 20)
    assert float(other["vs_best_p_permutation"]) == pytest.approx(0.1)
    text = (sweep_dir / "summary.md").read_text()
    assert "6 trials: 6 finished" in text and "140 [" in text and "Best configuration" in text
    for name in ("params.png", "params.svg", "trials.csv", "compare/table.md", "compare/curves.png",
                 "compare/difference.png"):
        assert (sweep_dir / name).is_file(), name
    assert "IQM difference = 120" in (sweep_dir / "compare" / "table.md").read_text()


def test_missing_and_stopped_trials_are_counted_not_scored(sweep):
    spec, sweep_dir = sweep
    params = {"agent.train_ratio": 128}
    (trial_dir(sweep_dir, params, 2) / "summary.json").unlink()  # e.g. killed before it finished
    stopped = trial_dir(sweep_dir, {"agent.train_ratio": 32}, 0)
    (stopped / "summary.json").rename(stopped / STOPPED)
    trials = trial_table(spec, sweep_dir)
    assert trials["status"].value_counts().to_dict() == {"finished": 4, "incomplete": 1, "stopped": 1}
    table = config_table(trials, ["agent.train_ratio"], reps=200)
    assert table["mean"].tolist() == [120.0, 25.0] and table["seeds"].tolist() == [2, 2]
    assert table["stopped"].tolist() == [0, 1] and np.isfinite(table["mean_hi"]).all()


def test_a_directory_holding_another_sweep_is_refused(tmp_path):
    prepare_dir(parse_spec(SPEC), tmp_path)
    prepare_dir(parse_spec(SPEC), tmp_path)  # the same sweep again: fine (that is how a sweep is continued)
    with pytest.raises(SweepSpecError, match="holds a different sweep"):
        prepare_dir(parse_spec({**SPEC, "seeds": 5}), tmp_path)
