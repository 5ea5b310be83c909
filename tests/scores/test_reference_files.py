"""The real official files in $REVERIE_REFERENCE_SCORES (skipped where it is not set)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import REAL_REFERENCE_DIR

from reverie.scores import baselines, readers, references
from reverie.scores.protocols import get_protocol, run_scores, task_scores

pytestmark = pytest.mark.skipif(not (REAL_REFERENCE_DIR / "dreamerv3").is_dir(),
                                reason="the official score files are not here: set REVERIE_REFERENCE_SCORES to the "
                                       "folder `reverie scores fetch` fills (reference_scores/) to run these")


def _task_returns(reference: str, window=None):
    path = references.reference_path("atari100k", reference, REAL_REFERENCE_DIR)
    table = readers.read_official(path, method=reference)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # some seeds have no episode in the window
        scores = run_scores(table, get_protocol("atari100k", window=window))
    return table, task_scores(scores).set_index("task")


def test_2023_file_reproduces_the_paper_with_the_20k_frame_window():
    """Paper (DreamerV3, 2023): Pong 18, MsPacman 1327, Boxing 78 at 400k frames."""
    table, tasks = _task_returns("dreamerv3-2023", window=(380_000, 400_000))
    assert len(table.groupby(["task", "seed"])) == 130 and (table["bin_width"] == 10_000).all()
    assert tasks.loc["atari_pong", "return"] == pytest.approx(18.4, abs=1e-9)
    assert tasks.loc["atari_ms_pacman", "return"] == pytest.approx(1326.9166666666667, rel=1e-12)
    assert tasks.loc["atari_boxing", "return"] == pytest.approx(78.05, rel=1e-12)
    assert tasks.loc["atari_breakout", "return"] == pytest.approx(31.123333333333335, rel=1e-12)


def test_current_file_under_the_design_window():
    table, tasks = _task_returns("dreamerv3")
    assert (table["bin_width"] == 0).all() and set(table["seed"]) == {0, 1, 2, 3, 4}
    assert tasks.loc["atari_boxing", "return"] == pytest.approx(82.06, rel=1e-12)
    assert tasks.loc["atari_ms_pacman", "return"] == pytest.approx(1520.6666666666667, rel=1e-12)
    assert tasks.loc["atari_pong", "return"] == -4.0 and tasks.loc["atari_pong", "seeds"] == 4


def test_builtin_atari100k_baselines_match_the_shipped_yaml():
    shipped = baselines.load_baselines(REAL_REFERENCE_DIR / "dreamerv3" / "baselines.yaml")
    assert {task: shipped[task] for task in baselines.ATARI100K_RANDOM_HUMAN} == baselines.ATARI100K_RANDOM_HUMAN


@pytest.mark.parametrize("reading, kind, expected", [
    # bins [x, x + 10k) overlapping [90k, 110k]: the 90k and 100k bins
    ("auto", "bins", {"cartpole_swingup": 515.7687279318254, "reacher_easy": 657.1,
                      "cartpole_balance": 815.767854656835, "finger_spin": 767.5}),
    # points 90k, 100k and 110k: the numbers quoted for the 100k-frame DMC proprio target (513, 727, 821, 780)
    ("points", "points", {"cartpole_swingup": 512.6433670943431, "reacher_easy": 727.3666666666667,
                          "cartpole_balance": 821.0608700102111, "finger_spin": 779.7333333333333}),
])
def test_dmc_proprio_2023_file_at_100k_frames(reading, kind, expected):
    path = references.reference_path("dmc_proprio", "dreamerv3-2023", REAL_REFERENCE_DIR)
    table, chosen = readers.read_score_file(path, method="dreamerv3-2023", reading=reading)
    assert chosen.kind == kind and chosen.step == 10_000
    assert get_protocol("dmc_proprio").window == (90_000, 110_000)
    tasks = task_scores(run_scores(table, get_protocol("dmc_proprio")), reps=10).set_index("task")
    for task, value in expected.items():
        assert tasks.loc[f"dmc_{task}", "return"] == pytest.approx(value, rel=1e-12), task
        assert tasks.loc[f"dmc_{task}", "seeds"] == 5


def test_the_pinned_checksums_are_those_of_the_official_files():
    """Every file of the folder that `reverie scores fetch` pins has the pinned sha256 (the folder may hold fewer)."""
    from reverie.scores.fetch import RELEASES, sha256

    checked = 0
    for release in RELEASES.values():
        for path, digest in release.files.items():
            local = REAL_REFERENCE_DIR / release.folder / Path(path).name
            if local.is_file():
                assert sha256(local) == digest, local
                checked += 1
    assert checked >= 3
