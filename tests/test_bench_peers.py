"""The side-by-side benchmarks' guards and timing loop (bench/peer_venv.py, bench/timing.py, bench/vs_jax.py)."""

import sys
from pathlib import Path

import pytest

# bench/ is a folder of scripts at the repository root, not part of the installed package: import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peer_venv import ROOT, outside_repo  # noqa: E402
from bench.timing import time_calls  # noqa: E402
from bench.vs_jax import check_source  # noqa: E402


def test_outside_repo_refuses_paths_in_the_repository(tmp_path):
    with pytest.raises(ValueError, match="--venv .* is inside the repository"):
        outside_repo(ROOT / "peer-venv", "--venv")
    assert outside_repo(tmp_path / "venv", "--venv") == (tmp_path / "venv").resolve()


def test_check_source_names_the_git_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="git clone https://github.com/danijar/dreamerv3 .* checkout e3f0224"):
        check_source(tmp_path)
    (tmp_path / "dreamerv3").mkdir()
    (tmp_path / "dreamerv3" / "main.py").write_text("")
    (tmp_path / "embodied" / "jax").mkdir(parents=True)
    (tmp_path / "embodied" / "jax" / "agent.py").write_text("")
    assert check_source(tmp_path) == Path(tmp_path).resolve()


def test_time_calls_skips_the_warmup_and_stops_at_max_calls():
    calls = []
    wall, cpu = time_calls(lambda: calls.append(1), warmup=2, max_calls=3)
    assert len(calls) == 5
    assert len(wall) == len(cpu) == 3
    assert all(t >= 0 for t in wall + cpu)
    wall, _ = time_calls(lambda: None, warmup=0, max_seconds=0.0)
    assert wall == []
