"""The thread choice of a run (reverie/runtime/threads.py): the idle cores of the affinity mask, at least one."""

import pytest

from reverie.runtime import threads as T

STAT = """cpu  300 0 100 1000 0 0 0 0 0 0
cpu0 100 0 50 500 10 0 0 0 0 0
cpu1 200 0 50 500 0 0 0 0 0 0
intr 12345
"""


def test_proc_stat_is_read_per_core(tmp_path):
    """idle = idle + iowait (fields 4, 5); total = the first 8 fields."""
    path = tmp_path / "stat"
    path.write_text(STAT)
    assert T.cpu_times(path) == {0: (510, 660), 1: (500, 750)}
    assert T.cpu_times(tmp_path / "missing") == {}


def test_idle_cores_sum_each_cores_idle_share():
    before = {0: (0, 0), 1: (0, 0)}
    after = {0: (100, 100), 1: (25, 100)}  # core 0 idle, core 1 busy 3/4 of the time
    assert T.idle_cores(before, after, [0, 1]) == pytest.approx(1.25)
    assert T.idle_cores(before, after, [1]) == pytest.approx(0.25)
    assert T.idle_cores(before, {0: (0, 0), 1: (0, 0)}, [0, 1]) == 2.0  # no ticks in between: idle


@pytest.mark.parametrize("busy_share, processes, expected", [
    (0.0, 1, 2),    # quiet: both cores
    (1.0, 1, 1),    # the other core busy: one thread
    (0.6, 1, 1),    # 1.4 idle rounds to 1
    (0.4, 1, 2),    # 1.6 idle rounds to 2
    (2.0, 1, 1),    # both busy: still one thread
    (0.0, 2, 1),    # two data-parallel processes share two idle cores
])
def test_the_choice_takes_the_idle_cores(monkeypatch, busy_share, processes, expected):
    readings = iter([{0: (0, 0), 1: (0, 0)},
                     {0: (int(100 * max(0.0, 1 - max(busy_share - 1, 0))), 100),
                      1: (int(100 * (1 - min(busy_share, 1.0))), 100)}])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(T, "allowed_cores", lambda: [0, 1])
    monkeypatch.setattr(T, "cpu_times", lambda path="/proc/stat": next(readings))
    n, why = T.choose_threads(None, processes, probe_s=0.0)
    assert n == expected
    assert "affinity mask idle" in why and "threads=N" in why


def test_a_given_count_wins_and_no_proc_stat_takes_the_mask(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert T.choose_threads(3) == (3, "threads=3")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert T.choose_threads(None) == (1, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(T, "allowed_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(T, "cpu_times", lambda path="/proc/stat": {})
    assert T.choose_threads(None)[0] == 4
    assert T.choose_threads(None, processes=2)[0] == 2


def test_a_real_probe_gives_a_count_within_the_mask(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    n, _ = T.choose_threads(None, probe_s=0.05)
    assert 1 <= n <= len(T.allowed_cores())
