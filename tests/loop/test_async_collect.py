"""train.async_collect (issue 8 item 3): env steps overlap the updates, and the run is exactly the same run.

The loop adds row t to replay before stepping the envs, and the updates only sample rows already in replay, so
stepping the envs while the updates run must change nothing but wall time. These tests check the split
``VectorStepper.step_async``/``step_wait`` row by row, that the updates really run while a step is in flight,
and that whole runs with the switch on and off are bit-identical (losses, scores, replay, parameters).
"""

import functools
import json

import gymnasium as gym
import numpy as np
import pytest

from reverie.state.checkpoint import list_checkpoints, load_checkpoint
from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.loop.collector import check_async_collect
from reverie.envs import VectorStepper, make_env
from reverie.envs.testing import FlakyEnv
from reverie.replay import Replay
from helpers.state_compare import assert_same

TIMING = {"wall_s", "fps/env_steps", "fps/updates"}
ASYNC = ["exp=debug", "env.vector_mode=async", "env.num_envs=2", "replay.capacity=400", "seed=11",
         "agent.train_ratio=32", "train.prefill=16", "train.steps=64", "train.eval_every=32", "train.eval_episodes=1",
         "train.log_every=16", "train.checkpoint_every=32", "env.time_limit=12"]


def counting(lengths, mode):
    fns = [functools.partial(make_env, {"id": "reverie.envs.testing.CountingEnv", "kwargs": {"length": n}}, 0, i)
           for i, n in enumerate(lengths)]
    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    return cls(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


# ------------------------------------------------------------------------------------------- the split step
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_split_step_gives_exactly_the_rows_of_step(mode):
    """Lengths 2 and 3 end episodes out of phase: resets, true final observations and returns all line up."""
    plain, split = VectorStepper(counting([2, 3], mode)), VectorStepper(counting([2, 3], mode))
    assert split.overlaps == (mode == "async")  # AsyncVectorEnv steps in its processes; sync steps in step_wait
    action = np.eye(2, dtype=np.float32)[[1, 0]]
    assert_same(plain.reset(), split.reset(), "reset")
    ends = 0
    for k in range(8):
        expected = plain.step(action)
        split.step_async(action)
        assert split.in_flight
        got = split.step_wait()
        assert not split.in_flight
        assert_same(expected, got, f"call {k}")
        ends += len(got[1])
    assert ends == 3 + 2  # env 0 ends at calls 2, 5, 8 and env 1 at 3, 7 (a reset row in between)
    assert [e["return"] for e in got[1]] == [3.0]  # 1 + 2 on the call that ended env 0's third episode
    plain.close()
    split.close()


def test_one_step_in_flight_at_a_time_and_no_state_while_one_is():
    stepper = VectorStepper(counting([3, 3], "async"))
    action = np.eye(2, dtype=np.float32)[[0, 0]]
    with pytest.raises(RuntimeError, match="before reset"):
        stepper.step_async(action)
    stepper.reset()
    with pytest.raises(RuntimeError, match="no step in flight; call step_async"):
        stepper.step_wait()
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 2\)"):
        stepper.step_async(action[:1])
    assert not stepper.in_flight  # a refused call leaves nothing in flight
    stepper.step_async(action)
    for call in (lambda: stepper.step_async(action), lambda: stepper.step(action), stepper.state_dict,
                 stepper.reset, lambda: stepper.load_state_dict({})):
        with pytest.raises(RuntimeError, match="in flight; call step_wait"):
            call()
    row, _ = stepper.step_wait()
    np.testing.assert_array_equal(row["vector"][:, 0], [1, 1])  # the refused calls did not disturb the step
    assert stepper.state_dict()["last"] is not None
    stepper.close()


@pytest.mark.filterwarnings("ignore:.*ERROR:UserWarning")  # the async env worker reports the intended crash
def test_a_worker_that_raises_during_an_overlapped_step_is_restarted():
    """The error surfaces in step_wait: the episodes close (is_last), then the rebuilt envs' reset row."""
    def vec(fail_at=None, offset=0):
        return gym.vector.AsyncVectorEnv([lambda: FlakyEnv(fail_at, offset)] * 2,
                                         autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)

    made = []
    stepper = VectorStepper(vec(fail_at=2), make=lambda k: made.append(k) or vec(offset=100 * k), max_restarts=1)
    action = np.eye(2, dtype=np.float32)[[0, 1]]
    stepper.reset()
    stepper.step_async(action)
    last, _ = stepper.step_wait()  # obs 1
    stepper.step_async(action)  # the workers raise on this step
    with pytest.warns(RuntimeWarning, match="simulator crashed"):
        closing, episodes = stepper.step_wait()
    assert made == [1] and episodes == [] and not stepper.in_flight
    np.testing.assert_array_equal(closing["vector"], last["vector"])
    assert closing["is_last"].all() and not closing["is_terminal"].any() and (closing["reward"] == 0).all()
    stepper.step_async(action)  # nothing is sent: the rebuilt envs' reset row comes back
    first, _ = stepper.step_wait()
    assert first["is_first"].all()
    np.testing.assert_array_equal(first["vector"][:, 0], [100, 100])
    stepper.step_async(action)
    nxt, _ = stepper.step_wait()
    np.testing.assert_array_equal(nxt["vector"][:, 0], [101, 101])
    stepper.close()


# ------------------------------------------------------------------------------------------- the training loop
def final_state(run_dir):
    payload = load_checkpoint(run_dir)
    snapshot = list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay")
    replay = {p.stem: np.load(p) for p in sorted(snapshot.glob("*.npy"))}
    return payload, replay


def rows(path, drop=()):
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in path.read_text().splitlines()]


@pytest.mark.parametrize("agent", [[], ["agent=dreamerv3_2025"]], ids=["dreamerv3", "dreamerv3_2025"])
def test_async_collect_gives_the_same_run_and_updates_while_the_envs_step(tmp_path, monkeypatch, agent):
    """Same seed, vector_mode=async, async_collect true vs false: identical losses and metrics, scores, replay,
    parameters, optimisers, train_ratio clock, counters and last row; and with the switch on every update
    samples while a step is in flight (off: none does). The 2025 agent: its replay's stored latents, written by
    acting and by the updates, and its online queue too."""
    flight = {"now": False, "during": []}
    real_async, real_wait, real_sample = VectorStepper.step_async, VectorStepper.step_wait, Replay.sample

    def step_async(self, action):
        real_async(self, action)
        flight["now"] = True

    def step_wait(self):
        flight["now"] = False
        return real_wait(self)

    def sample(self, batch, length, **kw):
        flight["during"].append(flight["now"])
        return real_sample(self, batch, length, **kw)

    monkeypatch.setattr(VectorStepper, "step_async", step_async)
    monkeypatch.setattr(VectorStepper, "step_wait", step_wait)
    monkeypatch.setattr(Replay, "sample", sample)
    seen = {}
    for on in (False, True):
        flight["during"] = []
        assert main(["train", *ASYNC, *agent, f"train.async_collect={on}", f"run_dir={tmp_path / str(on)}"]) == 0
        seen[on] = flight["during"]
    assert len(seen[True]) == len(seen[False]) > 0
    assert all(seen[True]) and not any(seen[False])

    off, on = tmp_path / "False", tmp_path / "True"
    metrics = [rows(d / "metrics.jsonl", TIMING) for d in (off, on)]
    assert metrics[0] == metrics[1] and any("loss/model" in m for m in metrics[0])
    scores = [rows(d / "scores.jsonl") for d in (off, on)]
    assert scores[0] == scores[1] and any(s["mode"] == "train" for s in scores[0])
    (pa, ra), (pb, rb) = final_state(off), final_state(on)
    assert pa["counters"]["env_steps"] == 64 and pa["counters"]["updates"] > 0
    for key in ("agent", "ratio", "row", "act_state", "clocks"):
        assert_same(pa[key], pb[key], key)
    assert [(e[0], e[2]) for e in pa["evals"]] == [(e[0], e[2]) for e in pb["evals"]]  # e[1] is wall time
    assert_same({k: v for k, v in pa["counters"].items() if k != "wall_s"},
                {k: v for k, v in pb["counters"].items() if k != "wall_s"}, "counters")
    assert_same(ra, rb, "replay")
    if agent:
        assert ra["has_posterior"].any()


def test_async_collect_with_envs_in_this_process_is_refused():
    cfg = load_config(["exp=debug", "train.async_collect=true"])
    with pytest.raises(ValueError, match="set env.vector_mode=async"):
        check_async_collect(cfg)
    check_async_collect(load_config(["exp=debug", "train.async_collect=true", "env.vector_mode=async"]))
    check_async_collect(load_config(["exp=debug"]))  # off: any mode
    planet_cycle = ["exp=debug", "train.async_collect=true", "env.vector_mode=async", "+agent.schedule=episodes"]
    cfg = load_config(planet_cycle)
    with pytest.raises(ValueError, match="agent.schedule=episodes"):
        check_async_collect(cfg)


def test_interrupt_during_overlapped_updates_checkpoints_after_the_step_and_resumes(tmp_path, monkeypatch, capsys):
    """Ctrl-C inside an update (a step in flight): the loop collects that step, then checkpoints (a checkpoint of
    a step in flight would raise). The run resumes with async_collect switched off (a safe change)."""
    real_sample, calls = Replay.sample, {"n": 0}

    def sample_then_interrupt(self, batch, length, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real_sample(self, batch, length, **kw)

    monkeypatch.setattr(Replay, "sample", sample_then_interrupt)
    run_dir = tmp_path / "r"
    assert main(["train", *ASYNC, "train.async_collect=true", f"run_dir={run_dir}"]) == 130
    monkeypatch.setattr(Replay, "sample", real_sample)
    saved, replay = final_state(run_dir)
    steps = saved["counters"]["env_steps"]
    assert 16 < steps < 64 and saved["counters"]["updates"] == 4
    snapshot = list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay")
    meta = json.loads((snapshot / "replay.json").read_text())
    assert meta["cursor"] == steps // 2  # one row per env per loop iteration, the last one's step collected too
    assert saved["row"]["is_first"].shape == (2,)
    assert load_checkpoint(run_dir)["config"]["train"]["async_collect"] is True
    capsys.readouterr()
    assert main(["train", *ASYNC, "train.async_collect=false", f"run_dir={run_dir}"]) == 0
    assert "train.async_collect True -> False" in capsys.readouterr().out
    assert load_checkpoint(run_dir)["counters"]["env_steps"] == 64


def test_cli_refuses_async_collect_with_sync_envs_before_any_run_dir(tmp_path, capsys):
    from reverie.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.async_collect=true"]) == 2
    assert "env.vector_mode=async" in capsys.readouterr().err
    assert not run_dir.exists()
