"""Sweep files: validation errors, configurations, ids and trial commands (no Ray, no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from reverie.sweep import SweepSpecError, config_id, configurations, parse_spec
from reverie.sweep.cli import cmd_sweep
from reverie.sweep.trial import EvalWatcher, _set_aside_failed_attempt, train_command

GRID = {"base": ["exp=debug"], "space": {"agent.module.dynamics.free_nats": {"grid": [0.5, 1.0]}}, "seeds": 2}


def spec_of(**changes):
    return parse_spec({**GRID, **changes}, default_name="t")


# --- errors ------------------------------------------------------------------------------------------------------

def test_unknown_top_level_key_names_it_and_the_nearest_known_key():
    with pytest.raises(SweepSpecError, match=r"unknown key 'seed' \(did you mean 'seeds'\?\); known keys: name, command, data, base"):
        parse_spec({**GRID, "seed": 3})


@pytest.mark.parametrize("section, value, key", [
    ("search", {"algoritm": "grid"}, "algoritm"),
    ("resources", {"cpu": 1}, "cpu"),
    ("scheduler", {"asha": {"grace": 10}}, "grace"),
])
def test_unknown_nested_key_is_named(section, value, key):
    with pytest.raises(SweepSpecError, match=f"unknown key '{key}'"):
        parse_spec({**GRID, section: value})


def test_unknown_distribution_is_named():
    with pytest.raises(SweepSpecError, match=r"space.agent.module.lam: unknown key 'normal' "
                                             r"\(did you mean 'uniform'\?\); known keys: grid, choice"):
        parse_spec({**GRID, "space": {"agent.module.lam": {"normal": [0.9, 0.99]}}})


@pytest.mark.parametrize("space", [None, {}, {"agent.module.dynamics.free_nats": {"grid": []}},
                                   {"agent.module.dynamics.free_nats": []}])
def test_empty_search_space(space):
    data = {k: v for k, v in GRID.items() if k != "space"}
    if space is not None:
        data["space"] = space
    with pytest.raises(SweepSpecError, match="empty search space"):
        parse_spec(data)


@pytest.mark.parametrize("change, message", [
    ({"space": {"agent.module.lam": {"uniform": [0.99, 0.9]}}}, "need lo < hi"),
    ({"space": {"agent.module.model_lr": {"loguniform": [0, 1e-3]}}}, "must be > 0"),
    ({"space": {"agent.train_ratio": {"randint": [1.5, 8]}}, "search": {"algorithm": "random"}}, "must be integers"),
    ({"space": {"agent.module.lam": {"uniform": [0.9, 0.99]}}, "search": {"algorithm": "grid"}},
     "search.algorithm is grid but agent.module.lam use random"),
    ({"search": {"samples": 3}}, "grid search runs every grid point once"),
    ({"seeds": 0}, "seeds must be a positive integer"),
    ({"seeds": [1, 1]}, "lists a seed twice"),
    ({"base": ["exp=debug", "agent.module.dynamics.free_nats=2"]}, "sets a parameter that 'space' sweeps"),
    ({"base": ["seed=3"]}, "'seed' is set by the sweep"),
    ({"base": ["train.steps=9"], "budget": 5}, "both 'budget' and train.steps in base"),
    ({"resources": {"cpus": 0}}, "resources.cpus must be a positive number"),
    ({"retries": -1}, "retries must be an integer >= 0"),
    ({"metric": "loss"}, "metric 'loss' is not supported"),
    ({"metric": "quality/image_error"}, "prediction quality quality/<key>_psnr | _ssim"),
    ({"scheduler": {"asha": {}}, "search": {"algorithm": "optuna", "samples": 2}}, "Optuna trials run their seeds"),
])
def test_bad_values_are_explained(change, message):
    with pytest.raises(SweepSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec({**GRID, **change})


def test_cli_reports_unknown_key_and_unknown_config_key_without_starting_ray(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**GRID, "sead": 1}))
    assert cmd_sweep([str(bad), "--dir", str(tmp_path / "s")]) == 2
    assert "sweep error:" in capsys.readouterr().err
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({**GRID, "space": {"agent.module.dynamics.free_natz": [0.5, 1.0]}}))
    assert cmd_sweep([str(typo), "--dir", str(tmp_path / "s"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'agent.module.dynamics.free_natz'" in err and "free_nats" in err  # reverie's own config hint
    assert not (tmp_path / "s").exists()


def test_dry_run_lists_every_trial(tmp_path, capsys):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(GRID))
    assert cmd_sweep([str(path), "--dir", str(tmp_path / "s"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("to run") == 4 and "2 configurations x 2 seeds = 4 trials" in out


# --- configurations and ids ----------------------------------------------------------------------------------------

def test_grid_is_the_product_in_file_order_and_budget_sets_train_steps():
    spec = parse_spec({"base": {"exp": "debug"}, "budget": 300, "seeds": [4, 7],
                       "space": {"a.x": [1, 2], "a.y": {"grid": ["p", "q", "r"]}}})
    assert spec.base == ("exp=debug", "train.steps=300") and spec.seeds == (4, 7) and spec.algorithm == "grid"
    assert configurations(spec) == [{"a.x": 1, "a.y": "p"}, {"a.x": 1, "a.y": "q"}, {"a.x": 1, "a.y": "r"},
                                    {"a.x": 2, "a.y": "p"}, {"a.x": 2, "a.y": "q"}, {"a.x": 2, "a.y": "r"}]


def test_an_ablation_is_the_baseline_then_one_key_at_a_time():
    spec = parse_spec({"space": {"a.x": [1, 2, 3], "a.y": {"grid": ["p", "q"]}}, "search": {"algorithm": "ablation"}})
    assert configurations(spec) == [{"a.x": 1, "a.y": "p"}, {"a.x": 2, "a.y": "p"}, {"a.x": 3, "a.y": "p"},
                                    {"a.x": 1, "a.y": "q"}]  # 1 + (3 - 1) + (2 - 1), not the 6 of a grid
    with pytest.raises(SweepSpecError, match="search.algorithm is ablation but a.z use random"):
        parse_spec({"space": {"a.x": [1, 2], "a.z": {"uniform": [0, 1]}}, "search": {"algorithm": "ablation"}})
    with pytest.raises(SweepSpecError, match="an? ablation search runs each of its configurations once"):
        parse_spec({"space": {"a.x": [1, 2]}, "search": {"algorithm": "ablation", "samples": 3}})


def test_random_draws_are_seeded_shared_by_grid_points_and_inside_bounds():
    data = {"space": {"g": [0, 1], "lr": {"loguniform": ["1e-5", 1.0e-3]}, "k": {"randint": [2, 5]},
                      "u": {"uniform": [0.0, 1.0]}, "c": {"choice": ["a", "b"]}},
            "search": {"algorithm": "random", "samples": 50, "seed": 3}}
    configs = configurations(parse_spec(data))
    assert configurations(parse_spec(data)) == configs  # same file -> same configurations (restart finds them)
    assert configs != configurations(parse_spec({**data, "search": {"algorithm": "random", "samples": 50, "seed": 4}}))
    assert len(configs) == 100
    for a, b in zip(configs[::2], configs[1::2]):  # each draw is crossed with both grid points
        assert (a["g"], b["g"]) == (0, 1) and {k: v for k, v in a.items() if k != "g"} == \
            {k: v for k, v in b.items() if k != "g"}
    lr = np.array([c["lr"] for c in configs])
    assert lr.min() >= 1e-5 and lr.max() <= 1e-3 and np.median(np.log10(lr)) == pytest.approx(-4, abs=0.5)
    assert {c["k"] for c in configs} == {2, 3, 4} and {c["c"] for c in configs} == {"a", "b"}
    assert all(0 <= c["u"] <= 1 and c["u"] == float(f"{c['u']:.6g}") for c in configs)


def test_config_id_is_stable_distinct_and_path_safe():
    a = config_id({"agent.module.model_lr": 3e-4, "agent.train_ratio": 64})
    assert a == config_id({"agent.train_ratio": 64, "agent.module.model_lr": 3e-4})
    assert a.startswith("model_lr-0.0003_train_ratio-64_") and "=" not in a and "/" not in a
    assert a != config_id({"agent.module.model_lr": 3e-4, "agent.train_ratio": 128})
    assert config_id({"env.id": "ALE/Pong-v5"}).startswith("id-ALE-Pong-v5_")


def test_train_command_puts_swept_values_after_base_and_quotes_odd_paths():
    cmd = train_command(Path("/s/trials/a b_seed1"), {"agent.train_ratio": 64}, 1, ["exp=debug"], threads=2)
    assert cmd[1:] == ["-m", "reverie", "train", "exp=debug", "agent.train_ratio=64", "seed=1",
                       "run_dir='/s/trials/a b_seed1'", "threads=2"]
    assert train_command(Path("/s/x"), {}, 0, ["threads=1"], threads=2)[-1] == "run_dir=/s/x"


# --- trial runner pieces ---------------------------------------------------------------------------------------------

def test_eval_watcher_reports_each_complete_evaluation_once(tmp_path):
    path = tmp_path / "scores.jsonl"
    watcher = EvalWatcher(path)
    assert watcher.new_evals() == []
    rows = [{"step": 50, "return": 9.0, "mode": "train"}, {"step": 100, "return": 10.0, "mode": "eval"},
            {"step": 100, "return": 20.0, "mode": "eval"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 120, "ret')  # last line half-written
    assert watcher.new_evals() == []  # the step-100 evaluation may still grow
    with open(path, "a") as f:
        f.write('urn": 5.0, "mode": "train"}\n' + json.dumps({"step": 200, "return": 4.0, "mode": "eval"}) + "\n")
    assert watcher.new_evals() == [(100, 15.0)]
    with open(path, "a") as f:
        f.write(json.dumps({"step": 210, "return": 1.0, "mode": "train"}) + "\n")
    assert watcher.new_evals() == [(200, 4.0)]
    assert watcher.new_evals() == []


def test_failed_attempt_without_checkpoint_is_kept_aside_and_one_with_checkpoint_stays(tmp_path):
    run = tmp_path / "trial"
    run.mkdir()
    (run / "scores.jsonl").write_text("x\n")
    _set_aside_failed_attempt(run)
    _set_aside_failed_attempt(run)  # nothing left to move: no empty attempt folder
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == ["attempts", "attempts/1",
                                                                              "attempts/1/scores.jsonl"]
    (run / "train.log").write_text("second\n")
    _set_aside_failed_attempt(run)
    assert (run / "attempts" / "2" / "train.log").read_text() == "second\n"
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "ckpt_100.pt").write_text("c")
    (run / "scores.jsonl").write_text("y\n")
    _set_aside_failed_attempt(run)  # a checkpoint: `reverie train run_dir=<dir>` continues from it
    assert (run / "scores.jsonl").read_text() == "y\n"


def test_log_scale_for_loguniform_and_wide_positive_grids():
    spec = parse_spec({"space": {"a": [1e-4, 1e-2], "b": [0.5, 1.0], "c": {"loguniform": [0.1, 0.2]}},
                       "search": {"algorithm": "random", "samples": 1}})
    assert [p.log_scale for p in spec.params] == [True, False, True]
    assert math.isclose(spec.params[0].values[0], 1e-4)


def test_optuna_search_space_maps_each_distribution_to_a_tune_domain():
    pytest.importorskip("ray.tune")
    from ray.tune.search.sample import Categorical, Float, Integer

    from reverie.sweep.space import tune_domains

    spec = parse_spec({"space": {"g": [1, 2], "c": {"choice": ["a", "b"]}, "u": {"uniform": [0.0, 1.0]},
                                 "l": {"loguniform": [1e-4, 1e-2]}, "r": {"randint": [2, 5]}},
                       "search": {"algorithm": "optuna", "samples": 4}})
    domains = tune_domains(spec)
    assert isinstance(domains["g"], Categorical) and domains["g"].categories == [1, 2]
    assert isinstance(domains["c"], Categorical) and domains["c"].categories == ["a", "b"]
    assert isinstance(domains["u"], Float) and (domains["u"].lower, domains["u"].upper) == (0.0, 1.0)
    assert isinstance(domains["l"].sampler, Float._LogUniform) and domains["l"].lower == 1e-4
    assert isinstance(domains["r"], Integer) and (domains["r"].lower, domains["r"].upper) == (2, 5)
    with pytest.raises(ValueError, match="optuna searches get their configurations from the searcher"):
        configurations(spec)


def test_a_prediction_quality_metric_is_a_sweep_objective():
    for metric in ("quality/image_psnr", "quality/image_ssim_onestep", "quality/vector_psnr_recon"):
        assert parse_spec({**GRID, "metric": metric}).metric == metric


def test_pretrain_trials_learn_from_one_dataset_for_their_budget_of_updates(tmp_path):
    spec = parse_spec({**GRID, "command": "pretrain", "data": str(tmp_path), "budget": 300,
                       "metric": "heldout/quality/image_psnr"})
    assert (spec.command, spec.data, spec.metric) == ("pretrain", str(tmp_path), "heldout/quality/image_psnr")
    assert spec.base[-1] == "pretrain.updates=300" and not any(o.startswith("train.steps") for o in spec.base)
    cmd = train_command(Path("/s/x"), {"agent.train_ratio": 64}, 1, list(spec.base), threads=1,
                        command=spec.command, data=spec.data)
    assert cmd[3:6] == ["pretrain", str(tmp_path), "exp=debug"] and "agent.train_ratio=64" in cmd
    assert train_command(Path("/s/x"), {}, 0, [], threads=1)[3] == "train"  # the default


@pytest.mark.parametrize("change, message", [
    ({"command": "pretrain"}, "'data' .* goes with command: pretrain and only with it"),
    ({"data": "d"}, "'data' .* goes with command: pretrain and only with it"),
    ({"command": "replay", "data": "d"}, "command 'replay' is not one of train, pretrain"),
    ({"command": "pretrain", "data": "d", "scheduler": {"asha": {"grace_steps": 10}}}, "drop the scheduler"),
    ({"command": "pretrain", "data": "d", "budget": 10, "base": ["exp=debug", "pretrain.updates=5"]},
     "both 'budget' and pretrain.updates"),
])
def test_pretrain_sweep_errors(change, message):
    with pytest.raises(SweepSpecError, match=message):
        parse_spec({**GRID, **change})


def test_a_missing_dataset_or_heldout_set_is_refused_before_ray_starts(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**GRID, "command": "pretrain", "data": str(tmp_path / "nothing")}))
    assert cmd_sweep([str(path), "--dir", str(tmp_path / "sweep")]) == 2
    assert "data" in (err := capsys.readouterr().err) and "does not exist" in err and not (tmp_path / "sweep").exists()
    from reverie.cli import main

    assert main(["record", "--out", str(tmp_path / "data"), "--episodes", "2", "exp=debug"]) == 0
    base = ["exp=debug", f"pretrain.heldout={tmp_path / 'no_heldout'}"]
    path.write_text(yaml.safe_dump({**GRID, "base": base, "command": "pretrain", "data": str(tmp_path / "data")}))
    assert cmd_sweep([str(path), "--dir", str(tmp_path / "sweep"), "--dry-run"]) == 2
    assert "pretrain.heldout" in capsys.readouterr().err and not (tmp_path / "sweep").exists()


def test_every_example_sweep_file_parses():
    from pathlib import Path

    from reverie.sweep import load_spec

    files = sorted((Path(__file__).parents[2] / "examples" / "sweeps").glob("*.yaml"))
    assert len(files) >= 5
    specs = {f.stem: load_spec(f) for f in files}
    knobs = specs["planet_atari_knobs"]
    assert knobs.algorithm == "ablation" and len(configurations(knobs)) == 6  # 1 + 2 + 1 + 1 + 1
