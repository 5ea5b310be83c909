"""Exact resume of `reverie pretrain` (as tests/state/test_resume.py for `reverie train`): 2N updates == N, stop,
resume, N more; a run killed after a checkpoint, or stopped by Ctrl-C, resumes to the same state and metric rows."""

import json
import os
import signal

import pytest

from reverie.agents.dreamer import DreamerV3
from reverie.cli import main
from reverie.state.checkpoint import load_checkpoint
from helpers.state_compare import assert_same, final_state

TIMING = {"wall_s", "fps/env_steps", "fps/updates"}
N = 12  # updates per half; checkpoints every 8, metric rows every 4
BASE = ["exp=debug", "pretrain.log_every=4", "pretrain.checkpoint_every=8", "pretrain.eval_episodes=1", "seed=3"]


class Killed(BaseException):
    """Stands in for kill -9: nothing after it runs (no checkpoint, no summary)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "cartpole"
    assert main(["record", "--out", str(folder), "--episodes", "6", "exp=debug"]) == 0
    return folder


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    pretrain(data, run_dir, f"pretrain.updates={2 * N}")
    return run_dir


def pretrain(data, run_dir, *overrides, expect=0):
    assert main(["pretrain", str(data), *BASE, f"run_dir={run_dir}", *overrides]) == expect


def compare(a, b):
    pa, ra, ma, ca = final_state(a)
    pb, rb, mb, cb = final_state(b)
    assert ca == cb and ca["updates"] == 2 * N and ca["env_steps"] == 0
    assert_same(pa["agent"], pb["agent"], "agent")  # parameters and Adam moments
    assert_same(ra, rb, "replay")
    assert {k: ma[k] for k in ("cursor", "fill", "rng")} == {k: mb[k] for k in ("cursor", "fill", "rng")}
    assert_same(pa["rng"], pb["rng"], "rng")  # python, numpy, torch and the loop's generator


def rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_n_then_resume_n_equals_2n(data, straight, tmp_path):
    run_dir = tmp_path / "resumed"
    pretrain(data, run_dir, f"pretrain.updates={N}")
    assert main(["pretrain", "--resume", str(run_dir), f"pretrain.updates={N}"]) == 0  # finished: nothing to do
    assert load_checkpoint(run_dir)["counters"]["updates"] == N
    assert main(["pretrain", "--resume", str(run_dir), f"pretrain.updates={2 * N}"]) == 0  # DATA from overrides.json
    compare(straight, run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"] == N


def test_killed_run_resumes_to_the_same_state_and_rows(data, straight, tmp_path, monkeypatch):
    real, calls = DreamerV3.update_model, {"n": 0}

    def update_then_die(self, batch):
        calls["n"] += 1
        if calls["n"] == 13:  # after the checkpoint at update 8 and the metric row at 12
            raise Killed
        return real(self, batch)

    monkeypatch.setattr(DreamerV3, "update_model", update_then_die)
    killed = tmp_path / "killed"
    with pytest.raises(Killed):
        pretrain(data, killed, f"pretrain.updates={2 * N}")
    monkeypatch.setattr(DreamerV3, "update_model", real)
    assert load_checkpoint(killed)["counters"]["updates"] == 8 and rows(killed)[-1]["step"] == 12
    pretrain(data, killed, f"pretrain.updates={2 * N}")  # the same command resumes it
    compare(straight, killed)
    assert rows(killed) == rows(straight)  # rows after the checkpoint were dropped and written again


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stop_after_the_update_and_resume_exactly(data, straight, tmp_path, monkeypatch, signum):
    real, calls = DreamerV3.update_model, {"n": 0}

    def interrupted_update(self, batch):
        calls["n"] += 1
        if calls["n"] == 6:  # the signal arrives in the middle of update 6: the run stops once it is done
            os.kill(os.getpid(), signum)
        return real(self, batch)

    monkeypatch.setattr(DreamerV3, "update_model", interrupted_update)
    stopped = tmp_path / "stopped"
    pretrain(data, stopped, f"pretrain.updates={2 * N}", expect=130)
    monkeypatch.setattr(DreamerV3, "update_model", real)
    assert load_checkpoint(stopped)["counters"]["updates"] == 6 and not (stopped / "summary.json").exists()
    pretrain(data, stopped, f"pretrain.updates={2 * N}")
    compare(straight, stopped)
