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


def test_an_ablation_compares_every_configuration_with_its_baseline(tmp_path):
    """Baseline (x=1, y=p) at 10/20/30; x=2 better by 100 (110/120/130), y=q worse by 5 (5/15/25): each difference
    is against the baseline, not the best, with the sign of this - baseline."""
    spec = parse_spec({"name": "abl", "base": ["exp=debug"], "seeds": 3, "search": {"algorithm": "ablation"},
                       "space": {"a.x": [1, 2], "a.y": ["p", "q"]}})
    shift = {(1, "p"): 0.0, (2, "p"): 100.0, (1, "q"): -5.0}
    for params in configurations(spec):
        for seed, base in zip(spec.seeds, [10.0, 20.0, 30.0]):
            make_trial(tmp_path, params, seed, base + shift[params["a.x"], params["a.y"]])
    write_summary(spec, tmp_path, plots=False)
    rows = [dict(zip(*[line.split(",") for line in pair])) for pair in
            [((tmp_path / "summary.csv").read_text().splitlines()[0], line)
             for line in (tmp_path / "summary.csv").read_text().splitlines()[1:]]]
    by = {(r["a.x"], r["a.y"]): r for r in rows}
    assert float(by["2", "p"]["vs_baseline_diff"]) == 100.0 and float(by["1", "q"]["vs_baseline_diff"]) == -5.0
    assert by["1", "p"]["vs_baseline_diff"] == ""  # the baseline itself
    text = (tmp_path / "summary.md").read_text()
    assert "this - baseline (IQM)" in text and "Ablation: each configuration changes one key" in text


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


def test_a_pretrain_sweep_summary_names_its_command_and_metric(sweep, tmp_path, capsys):
    """A `command: pretrain` sweep's best.json reruns `reverie pretrain DATA`, summary.md says what the quality metric
    is, no `reverie compare` of env episodes is attempted, and the CLI warns when no trial wrote the metric."""
    from reverie.sweep.cli import cmd_sweep

    _, sweep_dir = sweep
    raw = {**SPEC, "command": "pretrain", "data": str(tmp_path), "metric": "heldout/quality/image_psnr"}
    spec = parse_spec(raw)
    write_summary(spec, sweep_dir)
    best = json.loads((sweep_dir / "best.json").read_text())
    assert best["command"].startswith(f"reverie pretrain {tmp_path} exp=debug agent.train_ratio=")
    assert "prediction quality of the last open-loop report on the held-out data" in (sweep_dir / "summary.md").read_text()
    assert not (sweep_dir / "compare").exists()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    prepare_dir(spec, sweep_dir)
    assert cmd_sweep([str(path), "--dir", str(sweep_dir), "--summary-only"]) == 0
    assert "heldout/quality/image_psnr is in no finished trial's summary.json" in capsys.readouterr().err


def test_the_summary_ranks_by_the_sweeps_metric_not_the_return(tmp_path):
    """A quality sweep's best configuration is the one with the best quality, here the one with the lower return."""
    spec = parse_spec({**SPEC, "metric": "quality/image_psnr"})
    for params in configurations(spec):
        for seed, final in zip(spec.seeds, RETURNS[params["agent.train_ratio"]]):
            run = make_trial(tmp_path, params, seed, final)
            summary = json.loads((run / "summary.json").read_text())
            summary["quality/image_psnr"] = 30.0 - final / 10  # ratio 32: 29, 28, 27; ratio 128: 20, 16, 12
            (run / "summary.json").write_text(json.dumps(summary))
    write_summary(spec, tmp_path, plots=False)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["params"] == {"agent.train_ratio": 32} and best["mean"] == pytest.approx(28.0)


def test_an_error_metric_is_minimised(tmp_path):
    """quality/reward_error (a decoder-free model's one quality): the best configuration has the smallest mean error,
    the summary says lower is better, and the progress line's best so far is the smallest value."""
    from reverie.sweep.progress import SweepProgress
    from reverie.sweep.spec import maximised

    assert not maximised("heldout/quality/reward_error") and maximised("heldout/quality/image_psnr")
    spec = parse_spec({**SPEC, "metric": "heldout/quality/reward_error"})
    for params in configurations(spec):
        for seed, final in zip(spec.seeds, RETURNS[params["agent.train_ratio"]]):
            run = make_trial(tmp_path, params, seed, final)
            summary = json.loads((run / "summary.json").read_text())
            summary["heldout/quality/reward_error"] = final / 100  # ratio 32: mean 0.2; ratio 128: mean 1.4
            (run / "summary.json").write_text(json.dumps(summary))
    write_summary(spec, tmp_path, plots=False)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["params"] == {"agent.train_ratio": 32} and best["mean"] == pytest.approx(0.2)
    assert "lower is better" in (tmp_path / "summary.md").read_text()

    class Trial:  # what SweepProgress reads of a Tune trial
        def __init__(self, value):
            self.trial_id, self.config, self.last_result = str(value), {}, {"m": value, "done": True}

    progress = SweepProgress(total=2, metric="m", maximise=False, stream=open("/dev/null", "w"))
    for value in (0.5, 0.2, 0.9):
        progress.on_trial_complete(0, [], Trial(value))
    assert progress.best[0] == 0.2

