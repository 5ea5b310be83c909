"""A tiny `exp=debug` sweep through Ray Tune: kill the driver mid-sweep, rerun the same command, nothing is repeated.

Two sequential trials (``--num-cpus 1``): the driver is killed (SIGKILL to its whole process group, as a crashed
terminal would) as soon as the first trial has written ``summary.json``. The rerun must finish the sweep without
running the finished trial again, and no training subprocess may outlive the killed driver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.tune")

ROOT = Path(__file__).resolve().parents[1]


def _trainings_in(sweep_dir: Path) -> list[int]:
    """PIDs of live processes whose command line mentions ``sweep_dir`` (the trials' `reverie train` runs)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if str(sweep_dir) in cmdline and "reverie train" in cmdline and "zombie" not in state:
            pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to check for orphaned trials")
def test_killed_sweep_resumes_without_repeating_finished_trials(tmp_path):
    spec = {"name": "kill", "base": ["exp=debug"], "budget": 72, "seeds": 1, "retries": 0,
            "space": {"agent.module.dynamics.free_nats": {"grid": [0.5, 1.0]}}, "resources": {"cpus": 1}}
    path = tmp_path / "kill.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "reverie", "sweep", str(path), "--dir", str(sweep_dir), "--num-cpus", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    # --- first run: killed as soon as one trial has finished ---
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    deadline = time.time() + 240
    finished: list[Path] = []
    while not finished and driver.poll() is None and time.time() < deadline:
        time.sleep(0.5)
        finished = list(sweep_dir.glob("trials/*/summary.json"))
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert len(finished) == 1, (tmp_path / "first.log").read_text()[-3000:]
    first = finished[0].parent
    stamp, content = finished[0].stat().st_mtime_ns, finished[0].read_text()
    deadline = time.time() + 60
    while _trainings_in(sweep_dir) and time.time() < deadline:  # the worker dies with Ray, then its child
        time.sleep(0.5)
    assert _trainings_in(sweep_dir) == [], "a training subprocess outlived the killed sweep driver"

    # --- second run: the same command finishes the sweep ---
    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    summaries = sorted(sweep_dir.glob("trials/*/summary.json"))
    assert len(summaries) == 2
    assert (first / "summary.json").stat().st_mtime_ns == stamp and (first / "summary.json").read_text() == content
    assert (first / "train.log").read_text().count("[sweep] ") == 1  # started once, never again
    for summary in summaries:
        record = json.loads(summary.read_text())
        assert record["env_steps"] >= 72 and not record["interrupted"] and record["updates"] > 0
        meta = json.loads((summary.parent / "sweep_trial.json").read_text())
        assert (summary.parent / "config.yaml").is_file() and meta["seed"] == 0
    text = (sweep_dir / "summary.md").read_text()
    assert "2 trials: 2 finished" in text and "Best configuration" in text
    best = json.loads((sweep_dir / "best.json").read_text())
    assert best["seeds"] == 1 and best["overrides"][-1] in ("agent.module.dynamics.free_nats=0.5",
                                                            "agent.module.dynamics.free_nats=1.0")
    for name in ("params.png", "summary.csv", "trials.csv", "compare/table.md", "compare/curves.png"):
        assert (sweep_dir / name).is_file(), name
    assert "1/2 done" in second.stdout or "2/2 done" in second.stdout  # progress lines
