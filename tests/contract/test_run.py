"""Smoke and start-up checks of `reverie train` (exp=debug everywhere): what a run writes, what it refuses."""

import json
import re

import numpy as np
import pytest

from reverie.cli import main
from reverie.configs.compose import ConfigError, load_config
from reverie import load_run, make_env

from helpers.runs import read_jsonl, train


@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_smoke_debug_run_writes_everything(tmp_path, env):
    run_dir = train(tmp_path, env, f"env={env}")
    assert (run_dir / "config.yaml").is_file()
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[-1]["step"] == 200 and metrics[-1]["updates"] > 0
    assert any("loss/model" in m and np.isfinite(m["loss/model"]) for m in metrics)
    scores = read_jsonl(run_dir / "scores.jsonl")
    assert {s["mode"] for s in scores} == {"train", "eval"}
    assert sorted({s["step"] for s in scores if s["mode"] == "eval"}) == [100, 200]  # train.eval_every=100
    assert all(s["frames"] == s["step"] for s in scores)  # action_repeat 1
    assert sorted((run_dir / "checkpoints").iterdir())
    run = load_run(run_dir, checkpoint="last")  # the final checkpoint (the default, best.pt, may be earlier)
    assert run.counters["env_steps"] == 200
    env = make_env(run.config["env"], seed=0)
    obs, _ = env.reset()
    action, state = run.act(obs)  # one env, as make_env returns it
    assert env.action_space.contains(action)
    obs, *_ = env.step(action)
    action, state = run.act(obs, state)
    assert env.action_space.contains(action)
    batch = {k: np.stack([v, v]) for k, v in obs.items()}
    actions, _ = run.act(batch)
    assert len(actions) == 2 and all(env.action_space.contains(a) for a in actions)


@pytest.mark.parametrize("dict_obs", [False, True])
def test_smoke_image_observations(tmp_path, dict_obs):
    """uint8 (16, 16, 3) images -> env layer (3, 16, 16) -> replay -> conv encoder/decoder; discrete actions."""
    run_dir = train(tmp_path, f"img{dict_obs}", "env=gym", "env.id=reverie.envs.testing.ImageCountingEnv",
                    "+env.kwargs.size=16", "+env.kwargs.length=10", f"+env.kwargs.dict_obs={dict_obs}",
                    "train.steps=96", "train.eval_episodes=1")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[-1]["updates"] > 0
    assert any("loss/image" in m and np.isfinite(m["loss/image"]) for m in metrics)
    assert any(("loss/vector" in m) == dict_obs for m in metrics if "loss/image" in m)
    run = load_run(run_dir)
    assert run.obs_shapes["image"] == (3, 16, 16)
    env = make_env(run.config["env"], seed=0)
    obs, _ = env.reset()
    assert obs["image"].dtype == np.uint8 and obs["image"].shape == (3, 16, 16)
    action, _ = run.act(obs)
    assert env.action_space.contains(action)


def test_unknown_key_fails_naming_the_key_and_alternatives():
    with pytest.raises(ConfigError, match=r"unknown key 'agent.module.lerning_rate'.*model_lr"):
        load_config(["agent.module.lerning_rate=1"])


def test_a_key_that_moved_into_a_sub_block_is_suggested_with_its_path():
    with pytest.raises(ConfigError, match=r"unknown key 'agent.module.free_nats'.*Did you mean "
                                          r"'agent.module.dynamics.free_nats'\?"):
        load_config(["agent.module.free_nats=1"])
    with pytest.raises(ConfigError) as err:  # a key of the block itself is not redirected
        load_config(["agent.module.lerning_rate=1"])
    assert "Did you mean" not in str(err.value)


def test_unknown_group_option_lists_options():
    with pytest.raises(ConfigError, match=r"env=nope: the group 'env' has no option 'nope'. Options: .*cartpole"):
        load_config(["env=nope"])


def test_missing_env_id_fails(tmp_path, capsys):
    assert main(["train", "env=gym", f"run_dir={tmp_path / 'x'}"]) == 2
    assert "env.id" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bad_env_id_and_unsupported_space_fail_before_the_run_dir_exists(tmp_path, capsys):
    assert main(["train", "exp=debug", "env.id=NoSuchEnv-v0", f"run_dir={tmp_path / 'x'}"]) == 2
    assert "NoSuchEnv-v0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["train", "exp=debug", "env=gym", "env.id=reverie.envs.testing.CountingEnv",
                 "+env.kwargs.obs_dim=2", f"run_dir={tmp_path / 'y'}", "train.steps=8", "train.prefill=8",
                 "train.eval_episodes=1"]) == 0  # a user's own env by import path works
    err = capsys.readouterr().err  # prefill 8 of 8 steps: a run that never updates is said to be one
    assert "warning: prefill 8 >= 8 env steps: this run only collects random actions and never updates" in err


def test_user_env_by_import_path_and_wrapper_list(tmp_path):
    run_dir = train(tmp_path, "own", "env=gym", "env.id=reverie.envs.testing.CountingEnv", "+env.kwargs.length=7",
                    "env.wrappers=[{_target_: gymnasium.wrappers.ClipReward, min_reward: 0, max_reward: 1}]",
                    "train.steps=64", "train.prefill=64", "train.eval_episodes=1")
    scores = read_jsonl(run_dir / "scores.jsonl")
    train_eps = [s for s in scores if s["mode"] == "train"]
    assert train_eps and all(s["length"] == 7 for s in train_eps)
    assert all(s["return"] == 7.0 for s in train_eps)  # rewards 1..7 clipped to [0, 1] -> seven ones


def test_memmap_replay_and_async_envs(tmp_path):
    run_dir = train(tmp_path, "mm", "replay.storage=memmap", "env.vector_mode=async", "env.num_envs=2",
                    "train.steps=96")
    files = {p.name for p in (run_dir / "replay").iterdir()}
    assert {"vector.npy", "action.npy", "is_first.npy"} <= files
    assert read_jsonl(run_dir / "metrics.jsonl")[-1]["updates"] > 0


def test_eval_command_on_discrete_and_continuous_runs(tmp_path, capsys):
    for env in ("cartpole", "pendulum"):
        run_dir = train(tmp_path, f"ev_{env}", f"env={env}", "train.steps=64", "train.eval_episodes=1")
        capsys.readouterr()
        assert main(["eval", str(run_dir), "--episodes", "3"]) == 0
        printed = capsys.readouterr().out
        table = json.loads(next(run_dir.glob("eval/*/returns.json")).read_text())
        assert len(table["returns"]) == 3 and table["min"] <= table["mean"] <= table["max"]
        assert f"{table['mean']:.1f} +- {table['std']:.1f}" in printed
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_interrupt_writes_a_checkpoint_and_exits_130(tmp_path, monkeypatch, capsys):
    from reverie.agents.dreamer import DreamerV3

    calls = {"n": 0}
    real_update = DreamerV3.update

    def update_then_interrupt(self, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real_update(self, batch)

    monkeypatch.setattr(DreamerV3, "update", update_then_interrupt)
    run_dir = tmp_path / "int"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=1000", "train.eval_every=5000"]) == 130
    out = capsys.readouterr().out  # interrupted before the first evaluation: said so (was 'last eval return nan')
    assert re.search(r"\[reverie\] interrupted: \d+ env steps, 4 updates, no evaluation yet, [\d.]+ min", out), out
    run = load_run(run_dir)
    assert 64 <= run.counters["env_steps"] < 1000 and run.counters["updates"] == 4
    assert read_jsonl(run_dir / "metrics.jsonl")[-1]["step"] == run.counters["env_steps"]


IMAGE_ENV = ["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv"]


@pytest.mark.parametrize("overrides, message", [
    (["agent.train_ratio=abc"], "not a number"),
    (["+agent.module.lr=1"], "lr"),
    (["+agent.module.bogus=1"], "bogus"),
    ([*IMAGE_ENV, "+env.kwargs.size=16", "agent.module.cnn.norm=batch"], "norm must be one of"),
    ([*IMAGE_ENV, "+env.kwargs.size=48"], "image side 48"),
])
def test_bad_agent_values_fail_before_the_run_dir_exists(tmp_path, capsys, overrides, message):
    assert main(["train", "exp=debug", *overrides, f"run_dir={tmp_path / 'x'}"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_unknown_key_hints_for_nested_and_free_form_keys():
    with pytest.raises(ConfigError, match=r"'agent' has no key 'modul'.*train_ratio"):
        load_config(["agent.modul.model_lr=1"])
    with pytest.raises(ConfigError, match=r"free-form mapping.*\+env\.kwargs\.foo"):
        load_config(["env=gym", "env.id=Acrobot-v1", "env.kwargs.foo=1"])


def test_help_texts(capsys):
    assert main(["--help"]) == 0 and "commands:" in capsys.readouterr().out
    assert main(["train", "--help"]) == 0 and "overrides" in capsys.readouterr().out.lower()


def fake_evaluations(monkeypatch, means):
    """Replace the training loop's evaluation by one that returns ``means`` in turn (one episode each)."""
    import sys

    means = iter(means)

    def fake_evaluate(agent, env_cfg, episodes, seed, mode="eval", on_episode=None):
        mean = next(means)
        return {"returns": [mean], "lengths": [10], "mean": mean, "std": 0.0, "min": mean, "max": mean}

    monkeypatch.setattr(sys.modules["reverie.loop.session_report"], "evaluate", fake_evaluate)


def test_the_best_evaluation_is_kept_reported_and_loaded_by_default(tmp_path, monkeypatch, capsys):
    """Issue 20: evaluations return 5, 9, 7, 9 (at env steps 52, 100, 152, 200): best.pt holds the weights of
    step 100 (the tie at 200 does not beat it), the summary reports best and last, load_run/eval use best.pt."""
    import torch

    from reverie.state.saved_run import describe_checkpoint
    from helpers.state_compare import assert_same

    fake_evaluations(monkeypatch, [5.0, 9.0, 7.0, 9.0])
    run_dir = train(tmp_path, "best", "train.eval_every=50", "train.checkpoint_keep=3")
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)
    assert best["counters"]["env_steps"] == 100 and best["eval_return"] == 9.0
    assert_same(best["agent"], torch.load(run_dir / "checkpoints" / "ckpt_0000000100.pt",
                                          weights_only=False)["agent"]["modules"], "best.pt weights")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["best_eval_step"], summary["best_eval_return"], summary["eval_return"]) == (100, 9.0, 9.0)
    assert "last eval return 9.0 (best 9.0 at env step 100: checkpoints/best.pt)" in capsys.readouterr().out

    run = load_run(run_dir)  # default: best
    assert run.checkpoint.name == "best.pt" and run.counters["env_steps"] == 100
    assert describe_checkpoint(run) == ("checkpoints/best.pt (best: the weights of the best evaluation; env step 100, "
                                        "eval return 9.0)")
    assert load_run(run_dir, checkpoint="last").checkpoint.name == "ckpt_0000000200.pt"
    assert load_run(run_dir, checkpoint="ckpt_0000000100.pt").counters["env_steps"] == 100
    obs, _ = make_env(run.config["env"], seed=0).reset()
    assert run.act(obs)[0] in (0, 1)
    assert main(["eval", str(run_dir), "--episodes", "1", "--no-video", "--out", str(tmp_path / "e")]) == 0
    assert "[reverie] eval: checkpoints/best.pt (best: the weights of the best evaluation; env step 100" in \
        capsys.readouterr().err
    assert main(["eval", str(run_dir), "--episodes", "1", "--no-video", "--out", str(tmp_path / "e2"),
                 "--checkpoint", "last"]) == 0
    assert "[reverie] eval: checkpoints/ckpt_0000000200.pt (last; env step 200)" in capsys.readouterr().err


def test_an_evaluation_before_the_first_update_never_becomes_best(tmp_path, monkeypatch):
    """Evaluations at env steps 64 (the prefill of 100 is not done: no update yet), 128 and 192 return 9, 5, 7:
    the untrained 9 is logged but best.pt holds step 192's weights (7), and the summary names step 192. The
    counter-check: the same run with a prefill of 16 has updated before step 64, so its 9 is the best."""
    import torch

    fake_evaluations(monkeypatch, [9.0, 5.0, 7.0, 6.0])
    run_dir = train(tmp_path, "untrained", "train.eval_every=64", "train.steps=192", "train.prefill=100")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [e[2] for e in summary["evals"]] == [9.0, 5.0, 7.0]
    assert (summary["best_eval_step"], summary["best_eval_return"]) == (192, 7.0)
    assert torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)["counters"]["env_steps"] == 192
    fake_evaluations(monkeypatch, [9.0, 5.0, 7.0, 6.0])
    run_dir = train(tmp_path, "trained", "train.eval_every=64", "train.steps=192", "train.prefill=16")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["best_eval_step"], summary["best_eval_return"]) == (64, 9.0)


def test_stop_evals_asks_for_evaluations_in_a_row(tmp_path, monkeypatch):
    """train.stop_return=8 with train.stop_evals=2: evaluations 1, 9, 5, 9, 9 (every 48 env steps) stop the run at
    the second 9 in a row (240), not at the first 9 (96); with stop_evals=1 the run stops at 96."""
    from reverie.loop.state import LoopState
    from reverie.replay.cycle import StepRatio

    loop = LoopState.create(StepRatio(1.0, 1, 1), seed=0, every={})
    loop.evals = [(1, 0.0, 9.0), (2, 0.0, 5.0), (3, 0.0, 9.0)]
    assert loop.reached(8.0, 1) and not loop.reached(8.0, 2) and not loop.reached(None, 1)
    loop.evals.append((4, 0.0, 8.0))
    assert loop.reached(8.0, 2) and not loop.reached(8.0, 3) and not loop.reached(8.5, 2)

    fake_evaluations(monkeypatch, [1.0, 9.0, 5.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0])
    run_dir = train(tmp_path, "two", "train.eval_every=48", "train.steps=400", "train.stop_return=8",
                    "train.stop_evals=2")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 240 and summary["stopped_by"] == "stop_return"
    fake_evaluations(monkeypatch, [1.0, 9.0, 5.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0])
    run_dir = train(tmp_path, "one", "train.eval_every=48", "train.steps=400", "train.stop_return=8")
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 96


def test_a_stop_is_confirmed_on_more_episodes_first(tmp_path, monkeypatch, capsys):
    """train.stop_confirm=100: an evaluation that reaches train.stop_return=8 is confirmed on 100 more episodes of
    the same policy before the run stops. Evaluations (2 episodes, every 48 env steps) return 1, 9, 9, ...; the
    confirmations 5 (below: training goes on) then 8.5 (the run stops at 144, the third evaluation)."""
    import sys

    calls = []

    def fake_evaluate(agent, env_cfg, episodes, seed, mode="eval", on_episode=None):
        calls.append(episodes)
        mean = ({1: 1.0}.get(len(calls), 9.0) if episodes != 100 else
                5.0 if calls.count(100) == 1 else 8.5)
        return {"returns": [mean] * episodes, "lengths": [10] * episodes, "mean": mean, "std": 0.0,
                "min": mean, "max": mean}

    monkeypatch.setattr(sys.modules["reverie.loop.session_report"], "evaluate", fake_evaluate)
    run_dir = train(tmp_path, "confirm", "train.eval_every=48", "train.steps=400", "train.stop_return=8",
                    "train.stop_confirm=100")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 144 and summary["stopped_by"] == "stop_return"
    assert calls == [2, 2, 100, 2, 100]
    out = capsys.readouterr().out
    assert "env step 96: mean return 5.0 over 100 more episodes (min 5.0) < train.stop_return 8: not yet" in out
    assert "env step 144: mean return 8.5 over 100 more episodes (min 8.5) >= train.stop_return 8: solved" in out
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["eval/confirm_return_mean"] for r in rows if "eval/confirm_return_mean" in r] == [5.0, 8.5]


def test_stop_return_solved_takes_the_envs_registered_threshold():
    from reverie.loop.evaluate import stop_target

    assert stop_target({"stop_return": "solved"}, {"id": "CartPole-v1"}) == 475.0
    assert stop_target({"stop_return": "solved"}, {"id": "Acrobot-v1"}) == -100.0
    assert stop_target({"stop_return": 3}, {"id": "Pendulum-v1"}) == 3.0
    assert stop_target({"stop_return": None}, {"id": "Pendulum-v1"}) is None
    with pytest.raises(ValueError, match="Pendulum-v1 registers no reward_threshold"):
        stop_target({"stop_return": "solved"}, {"id": "Pendulum-v1"})
    with pytest.raises(ValueError, match="give a number, solved"):
        stop_target({"stop_return": "yes"}, {"id": "CartPole-v1"})
    cfg = load_config([])  # make train's run: CartPole under exp=classic
    assert (cfg.train.stop_return, cfg.train.stop_confirm, cfg.train.eval_every) == ("solved", 100, 1000)
    assert load_config(["env=pendulum"]).train.stop_return is None  # the rule is CartPole's (exp_suite)


def test_an_untrained_evaluation_never_stops_the_run(tmp_path, monkeypatch, capsys):
    """The stop rule counts evaluations of a trained policy only: 9 at env step 48 (prefill 64: no update yet)
    reaches train.stop_return=8 but does not stop the run; 1 at 96 does not either; 9 at 144 does, with a line
    that says why."""
    fake_evaluations(monkeypatch, [9.0, 1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    run_dir = train(tmp_path, "untrained", "train.eval_every=48", "train.steps=400", "train.stop_return=8")
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 144
    assert "[reverie] env step 144: eval return 9.0 >= train.stop_return 8: stopping" in capsys.readouterr().out


def test_the_kept_heap_is_handed_back_before_each_evaluation_and_the_video(tmp_path, monkeypatch):
    """The updates' freed heap (kept for reuse, reverie/runtime/cpu_memory.py) goes back to the system before
    every evaluation and the end-of-run video, so those phases do not stack on it (peak RSS, docs/dreamerv3.md):
    evaluations at env steps 100 and 200, then the video: three calls, each before its phase's first episode."""
    import reverie.loop.session_report as session_report

    calls = []
    release = session_report.release_freed_memory
    monkeypatch.setattr(session_report, "release_freed_memory", lambda: calls.append("release") or release())
    record = session_report.record_episode
    monkeypatch.setattr(session_report, "record_episode", lambda *a, **k: calls.append("video") or record(*a, **k))
    evaluate = session_report.evaluate
    monkeypatch.setattr(session_report, "evaluate", lambda *a, **k: calls.append("eval") or evaluate(*a, **k))
    train(tmp_path, "run", "train.video=true")
    assert calls == ["release", "eval", "release", "eval", "release", "video"]
