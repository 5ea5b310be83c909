"""Protocols: windows on the frame axis (never agent steps), bins vs episodes, normalisation, per-task means."""

from __future__ import annotations

import contextlib

import pandas as pd
import pytest
from conftest import make_run

from reverie.scores import baselines, protocols, readers
from reverie.scores.protocols import get_protocol, run_scores, task_scores


def _scores(table, expect_warning=False, **kwargs):
    with pytest.warns(UserWarning, match="no episode ended") if expect_warning else contextlib.nullcontext():
        return run_scores(table, get_protocol(table["suite"].iloc[0], **kwargs))


def test_atari100k_current_format_exact(reference_dir):
    table = readers.read_official(reference_dir / "dreamerv3" / "atari100k-dreamerv3.json.gz")
    scores = _scores(table)
    by = scores.set_index(["task", "seed"])
    assert by.loc[("atari_pong", 0), "return"] == 12.0  # (10 + 12 + 14) / 3; 380k and 400_004 are outside
    assert by.loc[("atari_pong", 0), "episodes"] == 3
    assert by.loc[("atari_pong", 1), "return"] == 17.0
    assert by.loc[("atari_boxing", 1), "return"] == 80.0
    assert by.loc[("atari_pong", 0), "score"] == pytest.approx((12 + 20.7) / (14.6 + 20.7), rel=1e-12)
    tasks = task_scores(scores).set_index("task")
    assert tasks.loc["atari_pong", "return"] == 14.5
    assert tasks.loc["atari_boxing", "return"] == 65.0
    assert tasks.loc["atari_boxing", "score"] == pytest.approx((65 - 0.1) / 12.0, rel=1e-12)
    assert tasks.loc["atari_pong", "seeds"] == 2


def test_atari100k_2023_bins_exact(reference_dir):
    table = readers.read_official(reference_dir / "dreamerv3-2023" / "atari100k_dreamerv3.json.gz")
    scores = _scores(table, expect_warning=True)  # boxing seed 1 has no bin in the window
    tasks = task_scores(scores).set_index("task")
    assert tasks.loc["atari_pong", "return"] == 16.0  # bin [390k, 400k) only: (15 + 17) / 2
    assert tasks.loc["atari_boxing", "return"] == 70.0
    assert tasks.loc["atari_boxing", "seeds"] == 1 and tasks.loc["atari_boxing", "runs"] == 2
    wide = task_scores(_scores(table, window=(380_000, 400_000))).set_index("task")
    assert wide.loc["atari_pong", "return"] == 11.0  # bins 380k and 390k: ((5 + 15) / 2 + (7 + 17) / 2) / 2
    assert wide.loc["atari_boxing", "return"] == 63.5  # (60 + 70) / 2 and 62


def test_window_uses_frames_never_agent_steps(tmp_path):
    """A reverie Atari run with action repeat 4: agent steps 97.5k..100k are frames 390k..400k.

    Episodes whose *step* lies in [390k, 400k] (frames 1.56M..1.6M) must not count; those whose *frames* do must.
    """
    make_run(tmp_path, "a", [(97_000, 1.0), (97_500, 10.0), (99_000, 20.0), (100_000, 30.0), (100_001, 99.0)],
             env_id="ALE/Pong-v5", action_repeat=4)
    make_run(tmp_path, "b", [(390_000, 50.0), (395_000, 60.0), (400_000, 70.0)], env_id="ALE/Pong-v5",
             action_repeat=4, seed=1)
    table = readers.read_runs([tmp_path], suite="atari100k", method="ours")
    assert table.loc[table["run"].str.endswith("b"), "frames"].tolist() == [1_560_000, 1_580_000, 1_600_000]
    with pytest.warns(UserWarning, match="no episode ended in frames \\[390000, 400000\\].*ours/atari_pong/seed 1"):
        scores = run_scores(table, get_protocol("atari100k"))
    by = scores.set_index("seed")
    assert by.loc[0, "return"] == 20.0  # (10 + 20 + 30) / 3: frames 390k, 396k, 400k
    assert by.loc[0, "episodes"] == 3
    assert pd.isna(by.loc[1, "return"]) and by.loc[1, "episodes"] == 0


def test_generic_final_window_from_common_budget(tmp_path):
    make_run(tmp_path, "long", [(500, 1.0), (950, 4.0), (1000, 6.0), (2000, 100.0)], seed=0)
    make_run(tmp_path, "short", [(800, 2.0), (900, 3.0), (1000, 5.0)], seed=1)
    table = readers.read_runs([tmp_path])
    protocol = get_protocol("generic")
    assert protocol.resolve(table) == (900.0, 1000.0)  # budget: the largest frame count every run reached
    by = run_scores(table, protocol).set_index("seed")
    assert by.loc[0, "return"] == 5.0 and by.loc[1, "return"] == 4.0
    assert by.loc[0, "score"] == 5.0  # generic: the raw return
    assert get_protocol("generic", budget=2000, final_fraction=0.5).resolve(table) == (1000.0, 2000.0)


def test_overrides_and_unknown_suite():
    assert get_protocol("atari100k").window == (390_000, 400_000)
    assert get_protocol("dmc_proprio").window == (90_000, 110_000)  # the 100k-frame point
    assert get_protocol("atari100k", window=(1, 2)).window == (1.0, 2.0)
    assert get_protocol("dmc_proprio", budget=100_000).resolve(pd.DataFrame()) == (90_000.0, 100_000.0)
    with pytest.raises(ValueError, match="unknown suite 'atari200k'; known suites: atari100k"):
        get_protocol("atari200k")
    with pytest.raises(ValueError, match="after its end"):
        get_protocol("atari100k", window=(5, 1)).resolve(pd.DataFrame())


def test_in_window_bins_overlap_with_positive_length():
    table = pd.DataFrame({"frames": [380_000.0, 390_000.0, 400_000.0, 400_000.0],
                          "bin_width": [10_000.0, 10_000.0, 10_000.0, 0.0]})
    assert protocols.in_window(table, 390_000, 400_000).tolist() == [False, True, False, True]


def test_normalisers():
    assert baselines.normalise(14.6, "atari_pong", "atari100k") == pytest.approx(1.0)
    assert baselines.normalise(-20.7, "atari_pong", "atari100k") == pytest.approx(0.0)
    assert baselines.normalise(500.0, "dmc_walker_walk", "dmc_vision") == 0.5
    assert baselines.normalise(7.0, "CartPole-v1", "generic") == 7.0
    with pytest.raises(KeyError, match="no random/human baseline for 'atari_skiing'"):
        baselines.normalise(1.0, "atari_skiing", "atari100k")


def test_load_baselines_yaml(tmp_path):
    path = tmp_path / "baselines.yaml"
    path.write_text("atari57_gamer:\n  atari_pong: [-20.7, 14.6]\n  atari_skiing: [-17098.1, -4336.9]\n",
                    encoding="utf-8")
    table = baselines.load_baselines(path)
    assert table["atari_skiing"] == (-17098.1, -4336.9)
    assert baselines.normalise(-4336.9, "atari_skiing", "atari57", table) == pytest.approx(1.0)
    with pytest.raises(KeyError, match="has no group 'dmlab30'; groups: atari57_gamer"):
        baselines.load_baselines(path, group="dmlab30")
