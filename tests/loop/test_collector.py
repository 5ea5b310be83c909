"""train.control_hz (issue 8 item 3): a collector thread acts at a fixed rate while the main thread learns.

Checked here: the train_ratio is honoured exactly in total (also across an interrupt and a resume), the
collector's step start times keep the rate (generous tolerance: the machine is shared; not a speed test), a
checkpoint never holds a half-step, and the replay a counting env fills has no lost, doubled or spliced rows.
"""

import importlib
import json
import os
import signal

import numpy as np
import pytest
import torch

from reverie.state.checkpoint import list_checkpoints, load_checkpoint
from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.loop.collector import Collector, make_policy_copy, sync_policy
from reverie.envs import VectorStepper, make_vector_env
from reverie.envs.testing import CODE_BASE
from reverie.replay import Replay
from reverie.loop.collector import check_async_collect
from reverie.agents.build import build_agent
from reverie.loop.session import random_actions
from reverie.types import ActionSpec

collector_module = importlib.import_module("reverie.loop.collector")

HZ, SLEEP = 25.0, 0.002  # 40 ms period; each env step sleeps 2 ms (a stand-in for a robot's I/O)
RUN = ["exp=debug", "env=gym", "env.id=reverie.envs.testing.CountingEnv", "+env.kwargs.length=5", "env.num_envs=2",
       f"env.wrappers=[{{_target_: reverie.envs.testing.Sleep, seconds: {SLEEP}}}]", f"train.control_hz={HZ}",
       "agent.train_ratio=32", "train.prefill=16", "train.steps=80", "train.checkpoint_every=40",
       "train.eval_every=0", "train.eval_episodes=1", "train.log_every=20", "seed=3"]
# debug batch 4 x 8 and train_ratio 32: one update per env step once the synchronous loop's condition holds
# (env_steps >= prefill and more than batch_length rows): iterations i = 9..40 of 2 env steps -> 64 updates
OWED = 64


def owed_updates(steps=80, n=2, prefill=16, length=8, per_step=32 / (4 * 8)):
    """What the synchronous loop's train_ratio owes for ``steps`` env steps (rows i = 1, 2, ... per env)."""
    counted = sum(n for i in range(1, steps // n + 1) if i * n >= prefill and i > length)
    return int(counted * per_step)


def replay_columns(snapshot):
    meta = json.loads((snapshot / "replay.json").read_text())
    arrays = {key: np.load(snapshot / f"{key}.npy") for key in ("vector", "reward", "is_first", "is_last")}
    assert not meta.get("wrapped", False) and meta["cursor"] == meta["fill"]
    return {key: value[: meta["fill"]] for key, value in arrays.items()}, meta["fill"]


def assert_counting_integrity(data):
    """Per env column: row t+1 continues row t's episode (code + 1, reward = step) or, after is_last, starts the
    next episode (code (episode + 1) * 1000, is_first); nothing lost, doubled or spliced."""
    code = data["vector"][..., 0].astype(np.int64)  # (L, N)
    assert data["is_first"][0].all()
    for col in range(code.shape[1]):
        for t in range(code.shape[0] - 1):
            a, b = code[t, col], code[t + 1, col]
            if data["is_last"][t, col]:
                assert data["is_first"][t + 1, col] and b == (a // CODE_BASE + 1) * CODE_BASE, (col, t, a, b)
            else:
                assert not data["is_first"][t + 1, col] and b == a + 1, (col, t, a, b)
                assert data["reward"][t + 1, col] == b % CODE_BASE, (col, t)


@pytest.fixture
def collectors(monkeypatch):
    made = []

    class Recording(Collector):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(collector_module, "Collector", Recording)
    return made


def test_fixed_rate_run_keeps_the_rate_owes_exact_updates_and_checkpoints_whole_steps(tmp_path, collectors):
    run_dir = tmp_path / "r"
    assert owed_updates() == OWED
    assert main(["train", *RUN, f"run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 80 and summary["updates"] == OWED  # the ratio, honoured exactly in total
    final = load_checkpoint(run_dir)
    assert final["ratio"] == {"env_steps": OWED, "updates": OWED}

    (collector,) = collectors
    starts = np.asarray(collector.step_starts)
    assert len(starts) == 40  # one start per step, 2 envs x 40 = 80 env steps
    period = float(np.median(np.diff(starts)))
    assert 0.8 / HZ <= period <= 1.5 / HZ, f"median period {period * 1e3:.1f} ms, asked {1e3 / HZ:.0f} ms"

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all("collect/late_steps" in m and "collect/update_lag" in m for m in metrics[:-1])
    assert metrics[-1]["updates"] == OWED

    # the mid-run checkpoint (train.checkpoint_every, taken with the collector paused at a step boundary)
    snapshots = list_checkpoints(run_dir / "checkpoints")
    assert len(snapshots) == 2
    mid = torch.load(snapshots[0], weights_only=False)
    steps = mid["counters"]["env_steps"]
    assert 40 <= steps < 80
    data, fill = replay_columns(snapshots[0].with_suffix(".replay"))
    assert fill == steps // 2  # one row per env per step: the saved replay holds exactly the steps counted
    last, row = data["vector"][-1, :, 0], mid["row"]["vector"][:, 0]  # the saved row follows the last replay row
    np.testing.assert_array_equal(np.where(data["is_last"][-1], (last // CODE_BASE + 1) * CODE_BASE, last + 1), row)
    # owed updates not done yet stay owed in the saved clock (ratio.updates == updates actually done)
    assert mid["ratio"]["updates"] == mid["counters"]["updates"] <= mid["ratio"]["env_steps"]

    data, fill = replay_columns(list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay"))
    assert fill == 40
    assert_counting_integrity(data)


def test_interrupt_stops_the_collector_checkpoints_and_the_resume_finishes_the_ratio(tmp_path, collectors,
                                                                                     monkeypatch):
    real_sample, calls = Replay.sample, {"n": 0}

    def sample_then_interrupt(self, batch, length, **kw):
        calls["n"] += 1
        if calls["n"] == 6:  # SIGTERM while the collector runs (the run turns it into a KeyboardInterrupt, as Ctrl-C)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_sample(self, batch, length, **kw)

    monkeypatch.setattr(Replay, "sample", sample_then_interrupt)
    run_dir = tmp_path / "r"
    assert main(["train", *RUN, f"run_dir={run_dir}"]) == 130
    assert collectors[0].done  # the thread was stopped and joined
    saved = load_checkpoint(run_dir)
    steps, updates = saved["counters"]["env_steps"], saved["counters"]["updates"]
    assert updates == 5 and saved["ratio"]["updates"] == 5  # the owed ones stay owed
    assert saved["ratio"]["env_steps"] == owed_updates(steps=steps)  # 1 update per counted step
    data, fill = replay_columns(list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay"))
    assert fill == steps // 2
    assert_counting_integrity(data)

    monkeypatch.setattr(Replay, "sample", real_sample)
    assert main(["train", *RUN, f"run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == steps and summary["env_steps"] == 80 and summary["updates"] == OWED
    data, fill = replay_columns(list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay"))
    assert fill == 40
    assert_counting_integrity(data)  # the envs pickled: the episodes in flight continued across the resume


def test_pause_holds_the_collector_at_a_step_boundary_and_stop_joins_it():
    cfg = load_config(["exp=debug", "env=gym", "env.id=reverie.envs.testing.CountingEnv", "+env.kwargs.length=3",
                       "env.num_envs=2"]).env
    stepper = VectorStepper(make_vector_env(cfg, 0))
    replay = Replay(200, 2, Replay.spec_for(stepper.env.single_observation_space, 2))
    rng = np.random.default_rng(0)
    collector = Collector(stepper, replay, None, 200.0, row=stepper.reset(), state=None, env_steps=0, ratio_steps=0,
                          steps=10_000, prefill=10_000, batch_length=4,
                          random_action=lambda: random_actions(rng, stepper.action_spec, 2))
    collector.start()
    while collector.counts()[0] < 8:
        collector.wait(0.5)
    with collector.paused():
        before = collector.counts()
        collector.wait(0.1)
        assert collector.counts() == before and replay.num_rows == before[0] // 2
    while collector.counts()[0] < before[0] + 4:  # it resumes after the pause
        collector.wait(0.5)
    collector.stop()
    assert collector.done and collector.error is None
    assert replay.num_rows == collector.counts()[0] // 2
    assert_counting_integrity({k: replay.arrays[k][: replay.num_rows] for k in ("vector", "reward", "is_first",
                                                                                "is_last")})
    stepper.close()


def test_a_failure_in_the_collector_thread_is_raised_in_the_caller():
    cfg = load_config(["exp=debug", "env=gym", "env.id=reverie.envs.testing.CountingEnv", "env.num_envs=2"]).env
    stepper = VectorStepper(make_vector_env(cfg, 0))
    replay = Replay(200, 2, Replay.spec_for(stepper.env.single_observation_space, 2))
    collector = Collector(stepper, replay, None, 100.0, row=stepper.reset(), state=None, env_steps=0, ratio_steps=0,
                          steps=100, prefill=100, batch_length=4, random_action=lambda: np.zeros((1, 2), np.float32))
    collector.start()
    while not collector.done:
        collector.wait(0.5)
    with pytest.raises(RuntimeError, match=r"collector thread failed: ValueError: .*'action' has shape \(1, 2\)"):
        collector.check()
    with pytest.raises(RuntimeError, match="collector thread failed"), collector.paused():
        pass
    assert replay.num_rows == 0 and collector.counts() == (0, 0, 0)
    stepper.close()


def test_policy_copy_is_independent_until_synced():
    cfg = load_config(["exp=debug"])
    agent = build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(discrete=True, dim=2))
    policy = make_policy_copy(agent)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(1.0)
    assert not any(torch.equal(a, b) for a, b in zip(agent.parameters(), policy.parameters()))
    sync_policy(policy, agent)
    assert all(torch.equal(a, b) for a, b in zip(agent.parameters(), policy.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(agent.buffers(), policy.buffers()))


@pytest.mark.parametrize("overrides, match", [
    (["train.control_hz=10", "train.async_collect=true", "env.vector_mode=async"], "set train.async_collect=false"),
    (["train.control_hz=10", "+agent.schedule=episodes"], "agent.schedule=episodes"),
    (["train.control_hz=0"], "positive number"),
    (["train.control_hz=fast"], "positive number"),
    (["train.control_hz=10", "train.policy_sync_every=0"], "policy_sync_every must be >= 1"),
])
def test_control_hz_refusals(overrides, match):
    with pytest.raises(ValueError, match=match):
        check_async_collect(load_config(["exp=debug", *overrides]))
    check_async_collect(load_config(["exp=debug", "train.control_hz=10"]))


def test_resume_may_change_policy_sync_every_but_not_control_hz():
    from reverie.state.resume import ResumeError, check_resume_config

    saved = {"train": {"control_hz": 10.0, "policy_sync_every": 1}}
    assert check_resume_config(saved, {"train": {"control_hz": 10.0, "policy_sync_every": 4}}) == {
        "train.policy_sync_every": (1, 4)}
    with pytest.raises(ResumeError, match="train.control_hz: 10.0"):
        check_resume_config(saved, {"train": {"control_hz": 20.0, "policy_sync_every": 1}})


def test_policy_copy_of_a_compiled_agent_acts_with_its_own_weights():
    """deepcopy keeps a compiled function that calls the learner's module; the copy must not act through it."""
    cfg = load_config(["exp=debug", "agent.module.compile=true"])
    agent = build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(discrete=False, dim=2))
    policy = make_policy_copy(agent)
    obs = {"vector": np.ones((3, 4), np.float32), "is_first": np.ones(3, bool)}

    def act():  # the posterior is sampled even in eval mode: same seed, same draw
        torch.manual_seed(0)
        return policy.act(obs, None, "eval")[0]

    before = act()
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.5)
    np.testing.assert_array_equal(act(), before)  # the learner's change is not seen
    sync_policy(policy, agent)
    assert not np.array_equal(act(), before)


def test_control_hz_with_data_parallel_ranks_is_refused_before_a_run_dir(tmp_path, capsys):
    from reverie.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.control_hz=50", "trainer.nproc=2"]) == 2
    assert "trainer.nproc=1" in capsys.readouterr().err
    assert not run_dir.exists()


def test_fixed_rate_run_of_the_current_agent_stores_and_writes_back_latents(tmp_path):
    """agent=dreamerv3_2025 (replay context, online queue) under train.control_hz: the collector thread stores the
    policy copy's posterior with every row it acted on, the learner writes the trained rows' posteriors back under
    the replay lock; the ratio is honoured exactly (the context row makes windows one row longer, so the counting
    starts one row later)."""
    run_dir = tmp_path / "r"
    assert main(["train", *RUN, "agent=dreamerv3_2025", f"run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 80 and summary["updates"] == owed_updates(length=9)
    snapshot = list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay")
    has = np.load(snapshot / "has_posterior.npy")  # (40, 2)
    assert has[8:].all()  # rows the policy acted on (after the 16-step prefill: 8 rows per env)
    assert has[1:8].any() and not has[0].any()  # prefill rows get a latent only by the write-back; row 0 never
    assert_counting_integrity(replay_columns(snapshot)[0])
