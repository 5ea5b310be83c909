"""train.max_minutes: a run stops once its wall budget is spent, resumes included, and finishes as at train.steps.

Runs of equal wall-clock budget (the two DreamerV3 agents side by side in docs/dreamerv3.md) need a stop on wall
time. These tests check the rule itself on a state with a known clock, and whole runs on both loops (synchronous
and ``train.async_collect``): a spent budget stops the run early with a final evaluation, a checkpoint and
``summary.json``; an ample budget changes nothing.
"""

import json

import numpy as np
import pytest

from reverie.cli import main
from reverie.configs.ranges import range_errors
from reverie.loop.state import LoopState
from reverie.replay.cycle import StepRatio

RUN = ["exp=debug", "env.num_envs=2", "replay.capacity=400", "seed=3", "agent.train_ratio=32", "train.prefill=16",
       "train.steps=96", "train.eval_every=48", "train.eval_episodes=1", "train.log_every=16",
       "train.checkpoint_every=48", "env.time_limit=12", "train.progress=false", "train.video=false",
       "train.report_every=0"]


def state(wall_before: float, started: float) -> LoopState:
    loop = LoopState.create(StepRatio(1.0, 1, 1), seed=0, every={})
    loop.wall_before, loop.started = wall_before, started
    return loop


def test_budget_counts_the_wall_time_before_a_resume(monkeypatch):
    """90 s before the resume + 20 s since = 110 s: spent for a 1.5-minute (90 s) budget, not for 2 minutes."""
    monkeypatch.setattr("reverie.loop.state.time.time", lambda: 1020.0)
    loop = state(wall_before=90.0, started=1000.0)
    assert loop.wall_s() == pytest.approx(110.0)
    assert loop.out_of_time(1.5)
    assert loop.out_of_time(110.0 / 60.0)  # reached exactly: stop
    assert not loop.out_of_time(2.0)
    assert not loop.out_of_time(None)


def test_budget_must_be_positive_or_null():
    assert range_errors({"train": {"max_minutes": 0}}) == [
        "train.max_minutes=0 must be > 0 (wall minutes before the run stops; null: never)"]
    assert range_errors({"train": {"max_minutes": None}}) == []
    assert range_errors({"train": {"max_minutes": 0.5}}) == []


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("loop", ["sync", "async"])
def test_a_spent_budget_stops_the_run_early_with_a_final_evaluation(tmp_path, capsys, loop):
    """A budget of 1e-6 minutes is spent before the first step boundary after start-up: the run stops there, far
    short of train.steps=96, evaluates once at its last step and writes its checkpoint and summary.json. The same
    run with a budget of an hour goes to 96 steps with evaluations at 48 and 96 (the counter-check)."""
    extra = ["train.async_collect=true", "env.vector_mode=async"] if loop == "async" else []
    short, full = tmp_path / "short", tmp_path / "full"
    assert main(["train", *RUN, *extra, "train.max_minutes=1e-6", f"run_dir={short}"]) == 0
    assert "[reverie] done (train.max_minutes=1e-06 spent):" in capsys.readouterr().out
    assert main(["train", *RUN, *extra, "train.max_minutes=60", f"run_dir={full}"]) == 0
    assert "[reverie] done: 96 env steps" in capsys.readouterr().out
    s, f = summary(short), summary(full)
    assert 0 < s["env_steps"] < 48  # stopped before the first clocked evaluation
    assert [e[0] for e in s["evals"]] == [s["env_steps"]]  # the final evaluation, at the stop
    assert np.isfinite(s["eval_return"])
    assert sorted(p.name for p in (short / "checkpoints").glob("ckpt_*.pt"))  # the stop's checkpoint
    assert f["env_steps"] == 96 and [e[0] for e in f["evals"]] == [48, 96]
    assert s["stopped_by"] == "max_minutes" and f["stopped_by"] is None


def test_the_control_rate_loop_stops_on_the_budget_too(tmp_path, capsys):
    """train.control_hz runs its own loop (a collector thread acting at 25 Hz): a spent budget stops it as well."""
    run = tmp_path / "hz"
    args = ["exp=debug", "env=gym", "env.id=reverie.envs.testing.CountingEnv", "+env.kwargs.length=5",
            "env.num_envs=2", "train.control_hz=25", "agent.train_ratio=32", "train.prefill=16", "train.steps=400",
            "train.eval_every=0", "train.eval_episodes=1", "train.video=false", "train.progress=false", "seed=3",
            "train.max_minutes=0.01", f"run_dir={run}"]  # 0.6 s: ~15 steps per env at 25 Hz, far short of 400
    assert main(["train", *args]) == 0
    s = summary(run)
    assert s["stopped_by"] == "max_minutes" and 0 < s["env_steps"] < 400
    assert "done (train.max_minutes=0.01 spent)" in capsys.readouterr().out


def test_offline_runs_count_updates_not_minutes():
    """reverie pretrain's loop (offline) ignores train.max_minutes; an online run records the budget; a met
    stop_return is recorded first and kept."""
    from types import SimpleNamespace

    from reverie.loop.session import Session

    spent = SimpleNamespace(out_of_time=lambda minutes: minutes is not None)
    cfg = SimpleNamespace(train=SimpleNamespace(max_minutes=1.0))
    offline = SimpleNamespace(stopped_by=None, offline=True, loop=spent, cfg=cfg)
    Session.stop_reason(offline, False)
    assert offline.stopped_by is None
    online = SimpleNamespace(stopped_by=None, offline=False, loop=spent, cfg=cfg)
    Session.stop_reason(online, False)
    assert online.stopped_by == "max_minutes"
    reached = SimpleNamespace(stopped_by=None, offline=False, loop=spent, cfg=cfg)
    Session.stop_reason(reached, True)
    Session.stop_reason(reached, False)
    assert reached.stopped_by == "stop_return"


def test_a_run_stopped_by_its_budget_resumes_with_a_larger_one(tmp_path, capsys):
    """The budget is a resume-safe key: a run stopped by train.max_minutes=1e-6 and resumed with the same budget does
    nothing and says why and what to give; resumed with an hour it goes on to train.steps=96, with the clocked
    evaluations after the stop (48 and 96)."""
    run = tmp_path / "r"
    assert main(["train", *RUN, "train.max_minutes=1e-6", f"run_dir={run}"]) == 0
    before = summary(run)
    stopped = before["env_steps"]
    assert main(["train", "--resume", str(run), "train.max_minutes=1e-6"]) == 0
    assert summary(run) == before  # nothing ran, nothing rewritten
    out = capsys.readouterr().out
    assert f"stopped at {stopped} of 96 env steps (summary.json): its train.max_minutes=1e-06 is spent" in out
    assert "give a larger train.max_minutes (or train.max_minutes=null) to continue it" in out
    assert main(["train", "--resume", str(run), "train.max_minutes=60"]) == 0
    done = summary(run)
    assert done["env_steps"] == 96 and [e[0] for e in done["evals"]][-2:] == [48, 96]
    assert done["resumed_from"] == stopped and done["stopped_by"] is None


def test_early_stops_say_what_lets_the_run_go_on():
    """A run stopped by stop_return goes on with a higher target or none; one stopped by its budget with more
    minutes than it spent (90 s) or none; otherwise the message names the key and what to give. Summaries without
    ``stopped_by`` (older runs) are judged by their numbers; with it, by it."""
    from reverie.state.resume import early_stop

    by_target = {"env_steps": 5000, "wall_s": 90.0, "eval_return": 480.0, "stopped_by": "stop_return"}
    saved = {"stop_return": 475.0, "max_minutes": None}
    assert early_stop(by_target, {"stop_return": None, "max_minutes": None}, saved) is None
    assert early_stop(by_target, {"stop_return": 490.0, "max_minutes": None}, saved) is None
    assert early_stop(by_target, saved, saved) == (
        "its eval return 480.0 reached train.stop_return=475; give a higher train.stop_return "
        "(or train.stop_return=null, or a larger train.stop_evals) to continue it")
    # more evaluations in a row than the run stopped at (1, the default when absent) let it go on; the same do not
    assert early_stop(by_target, dict(saved, stop_evals=3), saved) is None
    assert early_stop(by_target, dict(saved, stop_evals=3), dict(saved, stop_evals=3)) is not None
    # a named target (solved): the same name stops it again, null, a number above its return or a longer
    # confirmation let it go on
    solved = {"stop_return": "solved", "max_minutes": None, "stop_confirm": 100}
    assert early_stop(by_target, solved, solved).startswith("its eval return 480.0 reached train.stop_return=solved")
    assert early_stop(by_target, dict(solved, stop_return=None), solved) is None
    assert early_stop(by_target, dict(solved, stop_return=490.0), solved) is None
    assert early_stop(by_target, dict(solved, stop_confirm=200), solved) is None
    old_summary = {k: v for k, v in by_target.items() if k != "stopped_by"}
    assert early_stop(old_summary, saved, saved).startswith("its eval return 480.0 reached")
    by_budget = dict(by_target, eval_return=100.0, stopped_by="max_minutes")
    saved = {"stop_return": 475.0, "max_minutes": 1.5, "steps": 30000}
    assert early_stop(by_budget, {"stop_return": 475.0, "max_minutes": 2.0}, saved) is None
    assert early_stop(by_budget, {"stop_return": 475.0, "max_minutes": None}, saved) is None
    assert early_stop(by_budget, {"stop_return": 475.0, "max_minutes": 1.5}, saved).startswith(
        "its train.max_minutes=1.5 is spent (1.5 min)")
    # a return of 480 that met stop_return while the budget was also spent: the recorded cause decides
    both = dict(by_target, stopped_by="stop_return")
    assert early_stop(both, {"stop_return": None, "max_minutes": 1.5}, saved) is None
    # another early stop (neither limit): only a larger train.steps lets it go on
    other = dict(by_target, stopped_by=None, eval_return=float("nan"))
    assert early_stop(other, saved, saved) == "it stopped early; raise train.steps above 30000 to continue it"
    assert early_stop(other, saved, saved, lengthened=True) is None


def test_a_changed_preset_is_named_with_the_overrides_that_resume_the_run():
    """A run of the current agent started when exp=classic left it the official values: today's preset gives 128 /
    1.2e-4 / 0, so the resume is refused, and the message gives the overrides that bring the run's own values
    back; composing with them gives those values."""
    from reverie.configs.compose import load_config
    from reverie.state.resume import ResumeError, check_resume_config

    saved = {"agent": {"train_ratio": 512, "module": {"lr": 4e-5}}, "train": {"prefill": 1000}}
    now = {"agent": {"train_ratio": 128, "module": {"lr": 1.2e-4}}, "train": {"prefill": 0}}
    with pytest.raises(ResumeError) as err:
        check_resume_config(saved, now)
    tail = "add the run's own values to the resume command: "
    overrides = str(err.value).split(tail)[1].split()
    assert overrides == ["agent.module.lr=4e-05", "agent.train_ratio=512", "train.prefill=1000"]
    cfg = load_config(["agent=dreamerv3_2025", *overrides])
    assert (cfg.agent.train_ratio, cfg.agent.module.lr, cfg.train.prefill) == (512, 4e-5, 1000)
