"""examples/planet_atari/report.py: the held-out PSNR per open-loop step, averaged over a configuration's seeds
from the last report of each finished trial (synthetic trial folders, numbers by hand)."""

import json
from pathlib import Path

import pytest


@pytest.fixture
def report(planet_atari_script):
    return planet_atari_script("report")


def trial(sweep: Path, name: str, params: dict, rows: list[dict], finished: bool = True) -> None:
    run = sweep / "trials" / name
    run.mkdir(parents=True)
    (run / "sweep_trial.json").write_text(json.dumps({"params": params, "seed": 0}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run / "summary.json").write_text("{}")


def test_curves_average_the_last_report_over_seeds(tmp_path, report):
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


def test_paired_steps_compare_two_configurations_at_equal_game_time(report):
    """--time-ratio 2: the first configuration's step k against the second's step 2k; the difference of two seed
    sets with no spread is their mean difference, and a step the second lacks is skipped."""
    first = {1: [20.0, 20.0, 20.0], 2: [18.0, 18.0, 18.0], 3: [10.0, 10.0, 10.0]}
    second = {1: [30.0] * 3, 2: [25.0, 25.0, 25.0], 4: [17.0, 17.0, 17.0]}
    rows = report.paired_steps(first, second, time_ratio=2, reps=200)
    assert [(r["k"], r["k_second"]) for r in rows] == [(1, 2), (2, 4)]
    assert rows[0]["diff"] == pytest.approx(-5.0) and rows[1]["diff"] == pytest.approx(1.0)
    assert rows[0]["mean_first"] == 20.0 and rows[0]["mean_second"] == 25.0
    same = report.paired_steps(first, second, time_ratio=1, reps=200)
    assert [r["k"] for r in same] == [1, 2] and same[0]["diff"] == pytest.approx(-10.0)


def test_paired_mean_averages_each_seed_over_the_matched_steps(report):
    """Seed i's mean over the steps both have (k = 1, 2 against 2, 4 at ratio 2; k = 3 has no partner): first
    (20 + 18) / 2 = 19 and (22 + 14) / 2 = 18, second (25 + 17) / 2 = 21 and (27 + 19) / 2 = 23."""
    first = {1: [20.0, 22.0], 2: [18.0, 14.0], 3: [0.0, 0.0]}
    second = {2: [25.0, 27.0], 4: [17.0, 19.0]}
    m = report.paired_mean(first, second, time_ratio=2, reps=200)
    assert m["steps"] == 2 and m["mean_first"] == pytest.approx(18.5) and m["mean_second"] == pytest.approx(22.0)
    assert m["diff"] == pytest.approx(-3.5)  # IQM of two values is their mean
    with pytest.raises(ValueError, match="share no step"):
        report.paired_mean({3: [1.0]}, second, time_ratio=2)


def test_the_copy_last_frame_baseline_by_hand(report):
    """Two context frames, then three more: the baseline predicts frame 1 for each; a frame that differs from it by
    d in every value has MSE d^2, so PSNR = 10 log10(255^2 / d^2) = 20 log10(255 / d); equal frames are capped at
    100 dB; the reward error is the mean |reward| after the context."""
    import numpy as np

    frames = np.full((5, 2, 3, 4, 4), 100, np.uint8)  # (T, B, C, H, W)
    frames[2, 0] += 5  # k = 1, window 0: off by 5
    frames[3] += 51  # k = 2: both windows off by 51
    reward = np.array([[9.0, 9.0], [9.0, 9.0], [1.0, 0.0], [0.0, -2.0], [0.0, 0.0]])
    scores = report.copy_last_scores(frames, reward, context=2)
    k1 = (20 * np.log10(255 / 5) + 100.0) / 2
    k2 = 20 * np.log10(255 / 51)
    assert scores["psnr_k1"] == pytest.approx(k1) and scores["psnr_k2"] == pytest.approx(k2)
    assert scores["psnr_k3"] == 100.0 and scores["psnr"] == pytest.approx((k1 + k2 + 100.0) / 3)
    assert scores["reward_error"] == pytest.approx(3.0 / 6)


def test_a_constant_frame_prediction_by_hand(report):
    """Every frame 0 except one pixel; predicting the constant frame 10 everywhere: MSE over (C, H, W) = 3 x 2 x 2 =
    12 values of 100 (and one of (255 - 10)^2 where the pixel is lit); context rows are not scored."""
    import math

    import numpy as np

    frames = np.zeros((4, 1, 3, 2, 2), np.uint8)  # (T, B, C, H, W)
    frames[3, 0, 0, 0, 0] = 255
    frames[0] = 77  # a context row: not scored
    out = report.constant_frame_scores(frames, np.full((3, 2, 2), 10.0), context=2)
    k1 = 10 * math.log10(255 ** 2 / 100.0)
    k2 = 10 * math.log10(255 ** 2 / ((11 * 100.0 + 245.0 ** 2) / 12))
    assert out["psnr_k1"] == pytest.approx(k1) and out["psnr_k2"] == pytest.approx(k2)
    assert out["psnr"] == pytest.approx((k1 + k2) / 2) and set(out) == {"psnr_k1", "psnr_k2", "psnr"}

