"""Exact resume (issue 6): 2N steps == N steps, stop, resume, N more; the replay is exactly the saved one."""

import json

import numpy as np
import pytest
import torch

from reverie.agents.base import UpdateResult
from reverie.state.checkpoint import list_checkpoints, load_checkpoint
from reverie.cli import main
from reverie.envs.stepper import VectorStepper
from helpers.state_compare import assert_same, final_state

TIMING = {"wall_s", "fps/env_steps", "fps/updates"}
N = 48  # env steps per half (4 envs: 12 rows); 0.5 updates per env step after a 16-step prefill
BASE = ["exp=debug", "agent.train_ratio=16", "train.prefill=16", "train.eval_every=0", "train.eval_episodes=1",
        "train.log_every=16", "seed=5"]


def run(run_dir, *overrides, expect=0):
    assert main(["train", *BASE, f"run_dir={run_dir}", *overrides]) == expect


def compare_runs(straight, resumed):
    pa, ra, ma, ca = final_state(straight)
    pb, rb, mb, cb = final_state(resumed)
    assert ca == cb and ca["env_steps"] == 2 * N and ca["updates"] > 0
    assert_same(pa["agent"], pb["agent"], "agent")  # parameters, slow critic, normaliser, three optimisers
    assert_same(pa["ratio"], pb["ratio"], "ratio")
    assert_same(ra, rb, "replay")
    keys = ("cursor", "fill", "wrapped", "rng", "added", "queue")  # the online queue and its row counter too
    assert {k: ma[k] for k in keys} == {k: mb[k] for k in keys}
    assert_same(pa["row"], pb["row"], "row")
    assert_same(pa["act_state"], pb["act_state"], "act_state")
    assert_same(pa["rng"]["torch"], pb["rng"]["torch"], "torch rng")


def test_2n_equals_n_then_resume_n(tmp_path):
    run(tmp_path / "straight", f"train.steps={2 * N}")
    run(tmp_path / "resumed", f"train.steps={N}")  # finishes (summary.json) ...
    assert json.loads((tmp_path / "resumed" / "summary.json").read_text())["env_steps"] == N
    run(tmp_path / "resumed", f"train.steps={N}")  # ... the same steps again: already finished, exit 0, no work
    assert load_checkpoint(tmp_path / "resumed")["counters"]["env_steps"] == N
    run(tmp_path / "resumed", f"train.steps={2 * N}")  # ... and continues with more steps
    compare_runs(tmp_path / "straight", tmp_path / "resumed")
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["env_steps"] == 2 * N and summary["resumed_from"] == N


def test_current_dreamerv3_resumes_exactly(tmp_path):
    """agent=dreamerv3_2025: its one LaProp state (steps, moments), slow value and normaliser resume exactly, and so
    do the replay context's stored latents (written by acting and by the updates) and the online queue."""
    current = ["agent=dreamerv3_2025", "agent.module.warmup=2"]
    run(tmp_path / "straight", f"train.steps={2 * N}", *current)
    run(tmp_path / "resumed", f"train.steps={N}", *current)
    run(tmp_path / "resumed", f"train.steps={2 * N}", *current)
    compare_runs(tmp_path / "straight", tmp_path / "resumed")
    assert load_checkpoint(tmp_path / "resumed")["agent"]["opt"]["state"]  # the optimiser state was saved
    _, replay, meta, _ = final_state(tmp_path / "resumed")
    assert {"posterior_deter", "posterior_stoch", "has_posterior"} <= set(replay)
    assert replay["has_posterior"].any() and not replay["has_posterior"].all()  # acted rows have one, prefill not
    assert meta["added"] == 2 * N // 4 and "queue" in meta


@pytest.mark.parametrize("agent", [["agent.module.representation=r2"],
                                   ["agent=dreamerv3_2025", "agent.module.warmup=2",
                                    "agent.module.representation=infonce"]],
                         ids=["dreamerv3-r2", "dreamerv3_2025-infonce"])
def test_decoder_free_objectives_resume_exactly(tmp_path, agent):
    """Issue 29: a world model without decoders (its projector, the objective's metrics) continues exactly."""
    run(tmp_path / "straight", f"train.steps={2 * N}", *agent)
    run(tmp_path / "resumed", f"train.steps={N}", *agent)
    run(tmp_path / "resumed", f"train.steps={2 * N}", *agent)
    compare_runs(tmp_path / "straight", tmp_path / "resumed")
    params = load_checkpoint(tmp_path / "resumed")["agent"]["modules"]
    assert any(".projector." in k for k in params) and not any("decoder" in k for k in params)


class Killed(BaseException):
    """Stands in for kill -9: nothing after it runs (no checkpoint, no summary)."""


def straight_and_killed(tmp_path, monkeypatch, *overrides):
    """Run 2N env steps straight, and the same run killed 24 env steps past its checkpoint at N (env step 72);
    returns the killed run's folder, not yet resumed."""
    run(tmp_path / "straight", f"train.steps={2 * N}", *overrides)
    real_step, calls = VectorStepper.step, {"n": 0}

    def step_then_die(self, action):
        calls["n"] += 1
        if calls["n"] == (N + N // 2) // 4:  # env step 72: 24 steps collected past the checkpoint at 48
            raise Killed
        return real_step(self, action)

    monkeypatch.setattr(VectorStepper, "step", step_then_die)
    with pytest.raises(Killed):
        run(tmp_path / "killed", f"train.steps={2 * N}", *overrides)
    monkeypatch.setattr(VectorStepper, "step", real_step)
    return tmp_path / "killed"


@pytest.mark.parametrize("agent", [[], ["agent=dreamerv3_2025", "agent.module.warmup=2"]],
                         ids=["dreamerv3", "dreamerv3_2025"])  # 2025: stored latents written back into the memmap
def test_kill_after_collecting_past_the_checkpoint_drops_that_data(tmp_path, monkeypatch, agent):
    mm = ["replay.storage=memmap", "replay.capacity=64", "train.checkpoint_every=" + str(N), *agent]  # 16 rows: wraps
    killed = straight_and_killed(tmp_path, monkeypatch, *mm)
    assert not (killed / "summary.json").exists()
    saved = load_checkpoint(killed)
    assert saved["counters"]["env_steps"] == N
    live = np.load(killed / "replay" / "vector.npy")
    snap = np.load(killed / "checkpoints" / f"ckpt_{N:010d}.replay" / "vector.npy")
    assert not np.array_equal(live, snap)  # the live memmap moved on past the checkpoint (and wrapped over it)
    assert max(json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()) > N

    run(killed, f"train.steps={2 * N}", *mm)  # the same command resumes it
    compare_runs(tmp_path / "straight", killed)
    # metric rows after the checkpoint were dropped and written again: the log equals the straight run's
    rows = [[{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in
             (d / "metrics.jsonl").read_text().splitlines()] for d in (tmp_path / "straight", killed)]
    assert rows[0] == rows[1] and any("loss/model" in r for r in rows[0])


def test_resume_rejects_unsafe_changes_and_applies_safe_ones(tmp_path, capsys):
    run(tmp_path / "r", "train.steps=16", "train.prefill=16")
    before = (tmp_path / "r" / "config.yaml").read_text()
    assert main(["train", "--resume", str(tmp_path / "r"), "agent.module.horizon=7", "train.steps=32"]) == 2
    err = capsys.readouterr().err
    assert "agent.module.horizon: 4 (saved) -> 7 (now)" in err and "train.steps" in err  # names key, values, safe keys
    assert (tmp_path / "r" / "config.yaml").read_text() == before  # nothing touched
    assert main(["train", "--resume", str(tmp_path / "r"), "train.steps=32", "train.log_every=8"]) == 0
    assert "train.log_every 16 -> 8" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "r")["config"]["train"]["log_every"] == 8
    (tmp_path / "nothing").mkdir()  # a folder without checkpoints (a missing one: tests/test_cli.py)
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint under" in capsys.readouterr().err


def test_truncated_newest_checkpoint_resumes_from_the_previous(tmp_path, capsys):
    """Issue 20: the resume warns once; the next checkpoint's pruning removes the unreadable file, never the good
    one it resumed from (keep 2: the good 16 and the new 20 stay, the truncated 32 goes)."""
    run(tmp_path / "t", "train.steps=32", "train.checkpoint_every=16")
    (tmp_path / "t" / "summary.json").unlink()  # as if killed right after writing checkpoint 32 ...
    newest = tmp_path / "t" / "checkpoints" / "ckpt_0000000032.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # ... which the disk then cut short
    with pytest.warns(UserWarning, match="ckpt_0000000032.pt is unreadable") as caught:
        run(tmp_path / "t", "train.steps=20", "train.checkpoint_every=20", "train.checkpoint_keep=2")
    assert sum("is unreadable" in str(w.message) for w in caught) == 1
    out = capsys.readouterr().out
    assert "from ckpt_0000000016.pt: env step 16" in out and "removing unreadable checkpoint" in out
    assert [p.name for p in list_checkpoints(tmp_path / "t" / "checkpoints")] == [
        "ckpt_0000000016.pt", "ckpt_0000000020.pt"]
    assert load_checkpoint(tmp_path / "t")["counters"]["env_steps"] == 20
    assert load_checkpoint(tmp_path / "t" / "checkpoints" / "ckpt_0000000016.pt")["counters"]["env_steps"] == 16


def test_many_non_finite_updates_in_a_row_stop_with_a_checkpoint(tmp_path, monkeypatch):
    from reverie.agents.dreamer import DreamerV3

    monkeypatch.setattr(DreamerV3, "update", lambda self, batch: UpdateResult({"guard/nonfinite": 1.0}, skipped=1))
    with pytest.warns(RuntimeWarning, match="non-finite"):
        run(tmp_path / "d", "train.steps=200", "train.max_nonfinite_updates=5", expect=1)
    payload = load_checkpoint(tmp_path / "d")
    assert payload["counters"]["skipped_updates"] == 5 and payload["counters"]["env_steps"] < 200
    assert not (tmp_path / "d" / "summary.json").exists()
    last = json.loads((tmp_path / "d" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["guard/skipped_updates"] == 5 and last["guard/nonfinite"] == 1.0


@pytest.mark.parametrize("storage, message", [("memory", "GiB of RAM"), ("memmap", "GiB of disk")])
def test_preflight_refuses_a_replay_that_cannot_fit(tmp_path, capsys, storage, message):
    assert main(["train", *BASE, f"run_dir={tmp_path / 'x'}", "replay.capacity=400000000000",
                 "train.steps=400000000000", f"replay.storage={storage}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "replay.capacity" in err
    assert ("400,000,000,000 steps x 31 bytes" if storage == "memory" else
            "400,000,000,000 steps = min(replay.capacity, train.steps) x 31 bytes") in err
    assert not (tmp_path / "x").exists()


def test_preflight_numbers():
    from reverie.state.preflight import PreflightError, held_steps, preflight

    spec = {"image": ((3, 64, 64), np.uint8), "action": ((6,), np.float32), "reward": ((), np.float32),
            "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}
    agent = torch.nn.Linear(10, 10)  # 110 parameters -> RAM 4 x 440 bytes; saved 3 x 440 (values, Adam's moments)
    report = preflight(spec, 1000, agent, "memory", "/tmp", "/tmp", keep=2, ram=10**9, disk=10**9)
    assert report["replay_bytes"] == 1000 * (12_288 + 24 + 4 + 3) and report["model_bytes"] == 1760
    assert report["disk_needed"] == 2 * (report["replay_bytes"] + 1320)  # no train.steps: the full capacity
    with pytest.raises(PreflightError, match="replay.storage=memmap"):
        preflight(spec, 1000, agent, "memory", "/tmp", "/tmp", keep=2, ram=10**6, disk=10**9)
    assert preflight(spec, 1000, agent, "memmap", "/tmp", "/tmp", keep=2, ram=10**6, disk=10**9)["ram_needed"] == 1760
    # issue 20: a checkpoint holds the filled rows, at most min(L, ceil(steps / N)) rows per env
    assert (held_steps(1000, 4, 300), held_steps(1000, 4, 301), held_steps(1000, 4, 10**6)) == (300, 304, 1000)
    short = preflight(spec, 10**6, agent, "memmap", "/tmp", "/tmp", keep=3, ram=10**9, disk=10**8, steps=1000,
                      num_envs=4)
    assert short["checkpoint_bytes"] == 1000 * 12_319 + 1320 and short["disk_needed"] == 4 * 1000 * 12_319 + 3 * 1320
    frozen = torch.nn.Linear(10, 10).requires_grad_(False)  # a slow copy: its values only
    assert preflight(spec, 10, frozen, "memory", "/tmp", "/tmp", keep=1, ram=10**9, disk=10**9,
                     env_bytes=5000)["checkpoint_bytes"] == 10 * 12_319 + 440 + 5000
    with pytest.raises(PreflightError, match=r"checkpoints up to 11.7 MiB each .* x train.checkpoint_keep=3: 35.2 MiB"):
        preflight(spec, 10**6, agent, "memmap", "/tmp", "/tmp", keep=3, ram=10**9, disk=10**7, steps=1000, num_envs=4)


def test_sigterm_writes_a_final_checkpoint(tmp_path):
    import signal

    from helpers.train_process import interrupt_training

    run_dir = tmp_path / "term"
    code, out = interrupt_training([*BASE, f"run_dir={run_dir}", "train.steps=100000", "train.checkpoint_every=100000"],
                                   run_dir / "metrics.jsonl", rows=2, signum=signal.SIGTERM, timeout_s=120)
    assert code == 130, out[-2000:]
    payload = load_checkpoint(run_dir)
    assert 32 <= payload["counters"]["env_steps"] < 100000 and not (run_dir / "summary.json").exists()


def test_envs_that_cannot_be_saved_restart_their_episodes_cleanly(tmp_path):
    """Async envs do not pickle: the resumed run resets them, the replay keeps the saved rows unchanged and the
    next row it gets starts new episodes (is_first), so no episode is spliced onto another."""
    env = ["env.vector_mode=async", "env.num_envs=2", "replay.capacity=200"]
    run(tmp_path / "a", "train.steps=32", *env)
    assert load_checkpoint(tmp_path / "a")["stepper"]["env"] is None  # nothing to restore exactly
    before = np.load(tmp_path / "a" / "checkpoints" / "ckpt_0000000032.replay" / "vector.npy")
    run(tmp_path / "a", "train.steps=64", *env)
    final = load_checkpoint(tmp_path / "a")["replay_dir"]
    vector, is_first = np.load(f"{final}/vector.npy"), np.load(f"{final}/is_first.npy")
    np.testing.assert_array_equal(vector[:16], before[:16])  # the 16 rows per env saved at step 32
    assert is_first[16].all()  # row 16 (the first after resume) starts new episodes in both columns


def test_checkpoint_without_run_state_is_refused_clearly(tmp_path, capsys):
    from reverie.state.checkpoint import save_checkpoint

    run(tmp_path / "old", "train.steps=16")
    payload = load_checkpoint(tmp_path / "old")
    for key in ("rng", "stepper", "replay_meta", "replay_dir", "checkpoint_path"):
        payload.pop(key)
    save_checkpoint(tmp_path / "old" / "checkpoints", 16, payload)  # as an older reverie wrote it
    assert main(["train", "--resume", str(tmp_path / "old"), "train.steps=32"]) == 2
    assert "cannot be resumed: it lacks ['replay_meta', 'rng', 'stepper']" in capsys.readouterr().err


def test_interrupted_run_prints_the_command_that_resumes_it(tmp_path):
    """Issue 20: Ctrl-C prints `... train --resume <run_dir>`; that command, run as printed (plus a shorter
    train.steps so the test ends), resumes the run from its final checkpoint."""
    import os
    import re
    import signal
    import subprocess

    from helpers.train_process import interrupt_training

    run_dir = tmp_path / "int"
    code, out = interrupt_training([*BASE, f"run_dir={run_dir}", "train.steps=100000",
                                    "train.checkpoint_every=100000"], run_dir / "metrics.jsonl", rows=2,
                                   signum=signal.SIGINT, timeout_s=120)
    assert code == 130, out[-2000:]
    command = re.search(r"\[reverie\] resume this run with: (.+)", out).group(1)
    assert command.endswith(f"-m reverie train --resume {run_dir}")  # started as `python -m reverie`
    stopped = load_checkpoint(run_dir)["counters"]["env_steps"]
    done = subprocess.run(f"{command} train.steps={stopped + 16}", shell=True, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"resumed {run_dir} from ckpt_{stopped:010d}.pt: env step {stopped}" in done.stdout
    assert load_checkpoint(run_dir)["counters"]["env_steps"] == stopped + 16


def test_resume_command_forms(tmp_path):
    from reverie.state.resume import resume_command

    assert resume_command("runs/a b", environ={"REVERIE_MAKE_TRAIN": "1"}) == 'make train ARGS="--resume \'runs/a b\'"'
    assert resume_command("runs/x", environ={}, argv0=str(tmp_path / "bin" / "reverie")) == (
        f"{tmp_path / 'bin' / 'reverie'} train --resume runs/x")  # a launcher not on PATH: its path
    assert resume_command("runs/x", environ={}, argv0="/usr/bin/pytest") == "reverie train --resume runs/x"


def test_ctrl_c_during_an_update_waits_for_its_end_and_the_checkpoint_resumes(tmp_path, monkeypatch):
    """A Ctrl-C that arrives in the middle of an update (here: sent at its start) stops the run only after that
    update: the final checkpoint counts it and holds a whole optimiser state, so resuming it trains on. (A
    KeyboardInterrupt inside the optimiser step once saved an Adam state without `exp_avg_sq`.)"""
    import os
    import signal

    from reverie.agents.dreamer import DreamerV3

    original = DreamerV3.update

    def interrupted_update(self, batch):
        os.kill(os.getpid(), signal.SIGINT)  # delivered at once to this (main) thread
        return original(self, batch)

    monkeypatch.setattr(DreamerV3, "update", interrupted_update)
    assert main(["train", *BASE, f"run_dir={tmp_path / 'c'}", "train.steps=64"]) == 130
    saved = load_checkpoint(tmp_path / "c")
    assert saved["counters"]["updates"] == 1  # the update in flight finished and was counted
    monkeypatch.setattr(DreamerV3, "update", original)
    assert main(["train", "--resume", str(tmp_path / "c"), f"train.steps={saved['counters']['env_steps'] + 16}"]) == 0
    assert load_checkpoint(tmp_path / "c")["counters"]["updates"] > 1


def test_sticky_action_atari_resumes_exactly_after_a_kill(tmp_path, monkeypatch):
    """Issue 47: env=atari (sticky actions 0.25, the long protocol) continues its episodes exactly after a kill:
    the run dies 24 env steps past its checkpoint at N, the same command resumes it, and it ends equal to the run
    that never stopped (agent, replay, row, RNG, metric rows). Before, ALE's saved state lacked the action a sticky
    frame repeats: the envs were not saved and the episodes in flight restarted."""
    pytest.importorskip("ale_py", reason="Atari tests need ale-py: pip install -e '.[atari]'")
    env = ["env=atari", "env.task=pong", "env.num_envs=4", "replay.capacity=200", f"train.checkpoint_every={N}"]
    straight_and_killed(tmp_path, monkeypatch, *env)
    saved = load_checkpoint(tmp_path / "killed")
    assert saved["counters"]["env_steps"] == N and saved["stepper"]["env"] is not None  # the envs were saved
    run(tmp_path / "killed", f"train.steps={2 * N}", *env)
    compare_runs(tmp_path / "straight", tmp_path / "killed")
    rows = [[{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in
             (d / "metrics.jsonl").read_text().splitlines()] for d in (tmp_path / "straight", tmp_path / "killed")]
    assert rows[0] == rows[1]


def test_storm_resumes_exactly(tmp_path):
    """agent=storm (issue 44): its actor-critic, slow critic, k-th percentile normaliser and one Adam continue
    exactly, with the transformer world model."""
    run(tmp_path / "straight", f"train.steps={2 * N}", "agent=storm")
    run(tmp_path / "resumed", f"train.steps={N}", "agent=storm")
    run(tmp_path / "resumed", f"train.steps={2 * N}", "agent=storm")
    compare_runs(tmp_path / "straight", tmp_path / "resumed")
    payload = load_checkpoint(tmp_path / "resumed")["agent"]
    assert set(payload) == {"modules", "model_opt", "ac_opt"}
    assert "ac.slow_critic.0.weight" in payload["modules"] and float(payload["modules"]["ac.retnorm.high"]) != 0.0
