"""Data-parallel training end to end: `reverie train ... trainer.nproc=2` through torchrun, 2 gloo ranks on CPU.

The claims: the launcher starts two ranks that finish together; rank 0 alone writes the run's metrics, summary and
agent checkpoint, rank 1 its own files under rank1/; each rank collects its own data (its own replay shard); and both
ranks end with bit-identical agents (rank 1 stores its agent's parameter digest in its checkpoint, compared here with
rank 0's checkpointed agent). The slow tests: exact resume with 2 ranks, the stop decision of rank 0's evaluation
reaching rank 1, a missing rank checkpoint refused, PlaNet (episode cycle) with 2 ranks, and Ctrl-C stopping both
ranks after the same env step with matching checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from reverie.runtime import collectives, process_group
from reverie.state.checkpoint import list_checkpoints, load_checkpoint
from reverie.cli import main
from reverie.state.saved_run import load_run

BASE = ["exp=debug", "trainer.nproc=2", "train.prefill=32", "train.eval_every=0", "train.eval_episodes=1",
        "train.checkpoint_every=0"]


def launch(run_dir, *overrides, timeout=240):
    """`python -m reverie train BASE overrides run_dir=...` in a subprocess; returns (exit code, output)."""
    proc = subprocess.run([sys.executable, "-m", "reverie", "train", *BASE, f"run_dir={run_dir}", *overrides],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def rank_payloads(run_dir):
    """(rank 0's newest checkpoint, rank 1's checkpoint of the same step)."""
    ckpt0 = list_checkpoints(run_dir / "checkpoints")[-1]
    return load_checkpoint(ckpt0), load_checkpoint(run_dir / "rank1" / "checkpoints" / ckpt0.name)


def agent_digest(run_dir):
    return collectives.param_digest(load_run(run_dir, checkpoint="last").agent)


@pytest.mark.timeout(300)
def test_two_ranks_of_the_current_agent_keep_their_own_latents(tmp_path):
    """agent=dreamerv3_2025 with replay context and the online queue: each rank stores and writes back the latents
    of its own replay shard; the agents stay bit-identical."""
    run_dir = tmp_path / "ddp"
    code, out = launch(run_dir, "train.steps=64", "agent=dreamerv3_2025")
    assert code == 0, out[-3000:]
    payload0, payload1 = rank_payloads(run_dir)
    assert payload0["counters"]["updates"] == payload1["counters"]["updates"] > 0
    assert agent_digest(run_dir) == payload1["agent_digest"]
    snaps = [list_checkpoints(d)[-1].with_suffix(".replay") for d in (run_dir / "checkpoints",
                                                                      run_dir / "rank1" / "checkpoints")]
    has = [np.load(s / "has_posterior.npy") for s in snaps]
    deter = [np.load(s / "posterior_deter.npy") for s in snaps]
    assert all(h[1:].any() for h in has)  # written by acting and by the write-back on both ranks
    assert deter[0].shape == deter[1].shape and not np.array_equal(deter[0], deter[1])  # each its own data


@pytest.mark.timeout(300)
def test_two_ranks_train_one_run_with_identical_agents(tmp_path):
    run_dir = tmp_path / "ddp"
    code, out = launch(run_dir, "train.steps=64")
    assert code == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 64 and summary["updates"] > 0 and not summary["interrupted"]
    # rank 0 writes the run's files; rank 1 only its own jsonl and checkpoints under rank1/
    assert (run_dir / "metrics.jsonl").read_text().count("\n") >= 1 and (run_dir / "env_metadata.json").is_file()
    assert sorted(p.name for p in (run_dir / "rank1").iterdir()) == ["checkpoints", "metrics.jsonl", "scores.jsonl"]
    assert not list(run_dir.glob("rank0*")) and not (run_dir / "rank1" / "summary.json").exists()
    # rank 0 speaks for the run (issue 47: every line was printed twice, the done lines disagreeing); both ranks
    # finished the same budget (their counters, below)
    assert out.count("[reverie] done: 64 env steps") == 1 and out.count("[reverie] threads:") == 1
    assert out.count(" env(s) x ") == 1

    payload0, payload1 = rank_payloads(run_dir)
    assert payload1["agent"] is None and payload0["agent_digest"] is None
    for key in ("env_steps", "updates", "frames"):  # episodes differ: each rank's own envs
        assert payload0["counters"][key] == payload1["counters"][key], key
    assert agent_digest(run_dir) == payload1["agent_digest"]  # rank 1's replica equals rank 0's, bit for bit
    # ... though each rank collected its own data (its own env seeds): the replay shards differ
    shard0, shard1 = (np.load(list_checkpoints(d)[-1].with_suffix(".replay") / "vector.npy")
                      for d in (run_dir / "checkpoints", run_dir / "rank1" / "checkpoints"))
    assert shard0.shape == shard1.shape and not np.array_equal(shard0, shard1)
    assert payload0["rng"]["numpy"][1][0] == 0 and payload1["rng"]["numpy"][1][0] != 0  # rank seeds 0 and 10000


def test_bad_trainer_values_fail_before_any_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "bad"
    assert main(["train", "exp=debug", "trainer.nproc=0", f"run_dir={run_dir}"]) == 2
    assert "trainer.nproc must be >= 1" in capsys.readouterr().err
    assert main(["train", "exp=debug", "trainer.nproc=2", "trainer.backend=nccl", f"run_dir={run_dir}"]) == 2
    assert "needs device=cuda" in capsys.readouterr().err
    assert not run_dir.exists()


def test_train_without_torchrun_refuses_several_processes(tmp_path, monkeypatch):
    from reverie.configs.compose import load_config
    from reverie.train import train

    for var in process_group.TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="trainer.nproc=2 but 1 process"):
        train(load_config(["exp=debug", "trainer.nproc=2"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_rank_without_run_dir_is_refused(monkeypatch, capsys):
    for var, value in zip(process_group.TORCHRUN_VARS, ("0", "2", "0", "127.0.0.1", "29500")):
        monkeypatch.setenv(var, value)  # as torchrun sets them, but started without the launcher's run_dir
    assert main(["train", "exp=debug", "trainer.nproc=2"]) == 2
    assert "needs run_dir=<dir>" in capsys.readouterr().err


def test_nproc_is_not_safe_to_change_on_resume():
    from reverie.state.resume import ResumeError, check_resume_config

    saved = {"trainer": {"nproc": 2, "backend": None, "timeout_min": 60}}
    assert check_resume_config(saved, {"trainer": {"nproc": 2, "backend": None, "timeout_min": 90}})
    with pytest.raises(ResumeError, match="trainer.nproc"):
        check_resume_config(saved, {"trainer": {"nproc": 1, "backend": None, "timeout_min": 60}})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resume_with_two_ranks_equals_a_run_that_never_stopped(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    code, out = launch(straight, "train.steps=96")
    assert code == 0, out[-3000:]
    code, out = launch(resumed, "train.steps=48")
    assert code == 0, out[-3000:]
    broken = tmp_path / "broken"  # a copy without rank 1's files cannot be resumed: a clear error
    shutil.copytree(resumed, broken)
    shutil.rmtree(broken / "rank1")
    code, out = launch(broken, "train.steps=96")
    assert code != 0 and "rank1/checkpoints/ckpt_0000000048.pt is missing" in out, out[-3000:]
    code, out = launch(resumed, "train.steps=96")
    assert code == 0 and "resumed" in out, out[-3000:]

    for run in (straight, resumed):
        assert rank_payloads(run)[1]["agent_digest"] == agent_digest(run)
    assert agent_digest(resumed) == agent_digest(straight)
    for a, b in zip(rank_payloads(straight), rank_payloads(resumed)):
        assert {k: v for k, v in a["counters"].items() if k != "wall_s"} == \
               {k: v for k, v in b["counters"].items() if k != "wall_s"}
        assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y))
                   for x, y in zip(a["rng"]["numpy"][1:2], b["rng"]["numpy"][1:2]))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rank_zero_stop_return_stops_every_rank_at_the_same_step(tmp_path):
    run_dir = tmp_path / "stop"
    code, out = launch(run_dir, "train.steps=4000", "train.eval_every=48", "train.stop_return=-1000")
    assert code == 0, out[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 48
    payload0, payload1 = rank_payloads(run_dir)
    assert payload1["counters"]["env_steps"] == 48 and payload1["agent_digest"] == agent_digest(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_planet_episode_cycle_with_two_ranks(tmp_path):
    run_dir = tmp_path / "planet"
    code, out = launch(run_dir, "agent=planet", "train.steps=160", "env.time_limit=20")
    assert code == 0, out[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["updates"] > 0
    assert rank_payloads(run_dir)[1]["agent_digest"] == agent_digest(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_stops_every_rank_after_the_same_step_with_checkpoints(tmp_path):
    import signal

    from helpers.train_process import interrupt_training

    run_dir = tmp_path / "sigint"
    code, out = interrupt_training([*BASE, f"run_dir={run_dir}", "train.steps=100000", "train.log_every=16"],
                                   run_dir / "rank1" / "metrics.jsonl", rows=3,
                                   signum=signal.SIGINT, timeout_s=240)  # what Ctrl-C sends the launcher
    assert code == 130, out[-3000:]
    payload0, payload1 = rank_payloads(run_dir)
    assert 48 <= payload0["counters"]["env_steps"] == payload1["counters"]["env_steps"] < 100000
    assert payload1["agent_digest"] == agent_digest(run_dir) and not (run_dir / "summary.json").exists()
    assert out.count("[reverie] interrupted at env step") == 2


TIMING = {"wall_s", "fps/env_steps", "fps/updates"}


def processes_naming(text: str) -> list[int]:
    """The pids of the live processes whose command line contains ``text``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def log_rows(run_dir, rank_dir: str, name: str) -> list[dict]:
    """The rows of ``<run_dir>/<rank_dir>/<name>`` without the wall-clock columns."""
    text = (run_dir / rank_dir / name).read_text()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in text.splitlines()]


@pytest.mark.timeout(420)
def test_sigkill_after_the_checkpoint_and_resume_hold_each_log_row_once(tmp_path):
    """Issue 47 item 10: two ranks are killed (SIGKILL to the launcher's process group) after a checkpoint at env
    step 48 and after logging past it; the resumed run's metrics.jsonl and scores.jsonl, rank 0's and rank 1's,
    equal an uninterrupted run's row for row (the rows written after the checkpoint are dropped, then written again
    once), as for one process."""
    import signal
    import time

    args = ["train.steps=96", "train.checkpoint_every=48", "train.log_every=8", "env.time_limit=10"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    code, out = launch(straight, *args)
    assert code == 0, out[-3000:]
    proc = subprocess.Popen([sys.executable, "-m", "reverie", "train", *BASE, f"run_dir={killed}", *args],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    checkpoint = killed / "rank1" / "checkpoints" / "ckpt_0000000048.pt"

    def past_the_checkpoint() -> bool:
        if not checkpoint.exists():
            return False
        return any(row["step"] > 48 for d in ("", "rank1") for row in log_rows(killed, d, "metrics.jsonl"))

    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not past_the_checkpoint():
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed past its checkpoint"
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher; torchrun and the ranks run in a session of their own:
    for pid in processes_naming(str(killed)):  # a crash takes them all
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    time.sleep(1)
    assert not processes_naming(str(killed))
    assert not (killed / "summary.json").exists()
    code, out = launch(killed, *args)  # the same command resumes it
    assert code == 0 and "resumed" in out, out[-3000:]
    for rank_dir in ("", "rank1"):
        for name in ("metrics.jsonl", "scores.jsonl"):
            want, got = log_rows(straight, rank_dir, name), log_rows(killed, rank_dir, name)
            assert len(want) >= 3, (rank_dir, name)
            assert got == want, (rank_dir, name, len(got), len(want))
