"""examples/planet_atari/report.py: the held-out PSNR per open-loop step, averaged over a configuration's seeds
from the last report of each finished trial (synthetic trial folders, numbers by hand)."""

import importlib.util
import json
from pathlib import Path

import pytest

REPORT = Path(__file__).parents[2] / "examples" / "planet_atari" / "report.py"


def load_report():
    spec = importlib.util.spec_from_file_location("planet_atari_report", REPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trial(sweep: Path, name: str, params: dict, rows: list[dict], finished: bool = True) -> None:
    run = sweep / "trials" / name
    run.mkdir(parents=True)
    (run / "sweep_trial.json").write_text(json.dumps({"params": params, "seed": 0}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run / "summary.json").write_text("{}")


def test_curves_average_the_last_report_over_seeds(tmp_path):
    report = load_report()
    old = {"step": 500, "heldout/quality/image_psnr_k1": 5.0, "heldout/quality/image_psnr_k2": 4.0}
    new = {"step": 1000, "heldout/quality/image_psnr_k1": 20.0, "heldout/quality/image_psnr_k2": 16.0,
           "heldout/quality/reward_error_k1": 0.5}
    trial(tmp_path, "a_seed0", {"agent.module.divergence_scale": 1.0}, [old, new, {"step": 1000, "loss/kl": 1.0}])
    trial(tmp_path, "a_seed1", {"agent.module.divergence_scale": 1.0},
          [{"step": 1000, "heldout/quality/image_psnr_k1": 22.0, "heldout/quality/image_psnr_k2": 14.0}])
    trial(tmp_path, "a_seed2", {"agent.module.divergence_scale": 1.0},
          [{"step": 1000, "heldout/quality/image_psnr_k1": 99.0}], finished=False)  # unfinished: left out
    curves = report.trial_curves(tmp_path)
    assert set(curves) == {"divergence_scale=1.0"}
    per_k = curves["divergence_scale=1.0"]
    assert dict(per_k) == {1: [20.0, 22.0], 2: [16.0, 14.0]}  # the last report's values, seed by seed
    assert sum(per_k[1]) / 2 == pytest.approx(21.0)


def test_paired_steps_compare_two_configurations_at_equal_game_time():
    """--time-ratio 2: the first configuration's step k against the second's step 2k; the difference of two seed
    sets with no spread is their mean difference, and a step the second lacks is skipped."""
    report = load_report()
    first = {1: [20.0, 20.0, 20.0], 2: [18.0, 18.0, 18.0], 3: [10.0, 10.0, 10.0]}
    second = {1: [30.0] * 3, 2: [25.0, 25.0, 25.0], 4: [17.0, 17.0, 17.0]}
    rows = report.paired_steps(first, second, time_ratio=2, reps=200)
    assert [(r["k"], r["k_second"]) for r in rows] == [(1, 2), (2, 4)]
    assert rows[0]["diff"] == pytest.approx(-5.0) and rows[1]["diff"] == pytest.approx(1.0)
    assert rows[0]["mean_first"] == 20.0 and rows[0]["mean_second"] == 25.0
    same = report.paired_steps(first, second, time_ratio=1, reps=200)
    assert [r["k"] for r in same] == [1, 2] and same[0]["diff"] == pytest.approx(-10.0)
