"""`reverie record` -> `reverie pretrain` -> `reverie train init_from=RUN`, debug runs through the CLI."""

import json
import re

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from helpers.runs import read_jsonl

from reverie import load_run
from reverie.agents.dreamer import DreamerV3
from reverie.cli import main
from reverie.state.checkpoint import list_checkpoints, load_checkpoint


def modules(payload, prefix):
    return {k: v for k, v in payload["agent"]["modules"].items() if k.startswith(prefix)}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "cartpole"
    assert main(["record", "--out", str(folder), "--episodes", "8", "--epsilon", "0.5", "exp=debug"]) == 0
    return folder


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "pre"
    assert main(["pretrain", str(data), "exp=debug", f"run_dir={run_dir}", "pretrain.report_every=10",
                 f"pretrain.heldout={data}"]) == 0
    return run_dir


def test_pretrain_writes_a_normal_run_directory(pretrained, data):
    metrics = read_jsonl(pretrained / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [m["updates"] for m in metrics] == [5, 10, 15, 20, 20]  # step: updates
    assert "eval/return_mean" in metrics[-1]  # the final evaluation's row (pretrain.eval_every=0: only at the end)
    metrics = metrics[:-1]
    assert all(m["frames"] == 0 and "loss/vector" in m and "loss/actor" not in m for m in metrics)  # world model only
    reported = [m for m in metrics if "openloop/vector_error" in m]
    assert [m["step"] for m in reported] == [10, 20]
    assert all(np.isfinite(m["heldout/openloop/vector_error"]) for m in reported)
    assert (pretrained / "plots" / "openloop_reward_10.png").is_file()
    summary = json.loads((pretrained / "summary.json").read_text())
    assert summary["env_steps"] == 0 and summary["updates"] == 20 and [e[0] for e in summary["evals"]] == [20]
    held = sorted(k for k in reported[-1] if k.startswith("heldout/quality/") and not re.search(r"_k\d+$", k))
    assert held and all(summary[k] == reported[-1][k] for k in held)  # the last report's held-out quality
    assert {(s["step"], s["mode"]) for s in read_jsonl(pretrained / "scores.jsonl")} == {(20, "eval")}
    first, last = (load_checkpoint(p) for p in list_checkpoints(pretrained / "checkpoints"))
    assert first["counters"]["updates"] == 10 and last["counters"]["env_steps"] == 0
    assert not same(modules(first, "wm."), modules(last, "wm."))
    for part in ("actor.", "critic.", "slow_critic.", "retnorm."):  # update_model leaves the policy as built
        assert same(modules(first, part), modules(last, part)), part
    assert json.loads((pretrained / "overrides.json").read_text())[-1] == f"pretrain.data='{data}'"
    run = load_run(pretrained)  # `reverie eval` and the Python API read it like any run
    action, _ = run.act({"vector": np.zeros(4, np.float32)})
    assert action in (0, 1)


def test_a_run_s_heldout_windows_rebuilt_from_its_config_give_its_heldout_quality(pretrained):
    """reverie.data.heldout.run_heldout_windows (what the study's report and strip scripts read): the final model on
    the windows rebuilt from the run's config alone gives the held-out reward error the run wrote at its last
    report; windows drawn with another seed give another error (the check sees which windows are used)."""
    from reverie.data import load_dataset
    from reverie.data.heldout import heldout_replay, run_heldout_windows
    from reverie.viz.openloop import open_loop
    from reverie.viz.quality import prediction_quality
    from reverie.viz.report import sample_for_report

    run = load_run(pretrained, checkpoint="last")
    cfg = OmegaConf.create(run.config)
    batch, context = run_heldout_windows(cfg)
    assert context == 5 and batch["reward"].shape == (cfg.agent.batch_length, cfg.pretrain.heldout_sequences)
    written = json.loads((pretrained / "summary.json").read_text())["heldout/quality/reward_error"]
    again = prediction_quality(open_loop(run.agent, batch, context=context, seed=0))["quality/reward_error"]
    assert again == pytest.approx(written, rel=1e-6)
    other = sample_for_report(heldout_replay(load_dataset(cfg.pretrain.heldout, cfg.env)),
                              int(cfg.pretrain.heldout_sequences), int(cfg.agent.batch_length), seed=1)
    moved = prediction_quality(open_loop(run.agent, other, context=context, seed=0))["quality/reward_error"]
    assert moved != pytest.approx(written, rel=1e-6)


def test_init_from_takes_the_world_model_and_the_dataset(pretrained, tmp_path, monkeypatch, capsys):
    """train_ratio 1 (1/32 update per env step): no update in 16 env steps changes what was loaded. seed 1: the fresh
    actor differs from the pretrain run's."""
    acted = []
    real_act = DreamerV3.act
    monkeypatch.setattr(DreamerV3, "act", lambda self, obs, state=None, mode="explore":
                        acted.append(mode) or real_act(self, obs, state, mode))
    online = tmp_path / "online"
    assert main(["train", "exp=debug", f"run_dir={online}", f"init_from={pretrained}", "seed=1", "train.steps=16",
                 "agent.train_ratio=1", "train.eval_episodes=1"]) == 0
    # the pretrain run held 8 recorded episodes less the last one's tail rows (left out when its replay was filled),
    # split over exp=debug's 4 env columns: 7 finished episodes, read back as 11 column pieces (144 / 4 = 36 rows each)
    out = capsys.readouterr().out
    assert f"[reverie] dataset {pretrained}: 11 episodes (7 finished), 144 steps, mean return " in out
    assert "; replay filled with 144 steps, 36 rows in each of 4 env column(s)\n" in out
    assert acted[:4] == ["explore"] * 4  # init.prefill=0: the agent acts from the first env step
    pre, now = load_checkpoint(pretrained), load_checkpoint(online)
    assert same(modules(pre, "wm."), modules(now, "wm.")) and not same(modules(pre, "actor."), modules(now, "actor."))
    assert now["agent"]["model_opt"]["state"] and not now["agent"]["actor_opt"]["state"]  # Adam moments: the model's
    before = {k: np.load(f"{pre['replay_dir']}/{k}.npy") for k in ("vector", "action", "reward", "is_first")}
    after = {k: np.load(f"{now['replay_dir']}/{k}.npy") for k in before}
    rows = json.loads((pretrained / "checkpoints" / "ckpt_0000000020.replay" / "replay.json").read_text())["fill"]
    for key in before:  # the dataset's rows first, then 16 / 4 envs = 4 online rows per column
        np.testing.assert_array_equal(after[key][:rows], before[key][:rows], err_msg=key)
    assert after["is_first"][rows].all() and load_checkpoint(online)["counters"]["updates"] == 0


def test_init_from_a_behavior_run_takes_the_policy_and_drop_data(data, tmp_path, capsys):
    pre = tmp_path / "pre"
    assert main(["pretrain", str(data), "exp=debug", f"run_dir={pre}", "pretrain.behavior=true",
                 "pretrain.updates=6", "pretrain.eval_episodes=0"]) == 0
    # the disk line bounds a pretrain run's replay by its dataset (147 steps over exp=debug's 4 env columns: at most
    # ceil(147 / 4) = 37 rows each, 148), not by env steps (it takes none) nor by replay.capacity
    out = capsys.readouterr().out
    assert "(replay of at most 148 steps = min(replay.capacity, the dataset's steps) x" in out
    metrics = read_jsonl(pre / "metrics.jsonl")
    assert all("loss/actor" in m for m in metrics) and not (pre / "scores.jsonl").read_text()  # no env steps at all
    online = tmp_path / "online"
    assert main(["train", "exp=debug", f"run_dir={online}", f"init_from={pre}", "seed=1", "train.steps=16",
                 "init.prefill=16", "init.keep_data=false", "train.eval_episodes=1"]) == 0  # no update: replay short
    a, b = load_checkpoint(pre), load_checkpoint(online)
    assert same(a["agent"]["modules"], b["agent"]["modules"])  # world model, actor, critic, slow critic, normaliser
    assert json.loads((online / "checkpoints" / "ckpt_0000000016.replay" / "replay.json").read_text())["fill"] == 4


@pytest.mark.parametrize("override, message", [
    ("env=pendulum", "that run observes {'vector': (4,)} and acts in ActionSpec(discrete=True, dim=2)"),
    ("size=xs", "its agent does not fit this config"),
    ("replay.capacity=40", "dataset error: the dataset has"),
])
def test_init_from_that_does_not_fit_is_refused_before_the_run_starts(pretrained, tmp_path, capsys, override,
                                                                      message):
    assert main(["train", "exp=debug", f"run_dir={tmp_path / 'x'}", f"init_from={pretrained}", override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_record_with_a_scripted_controller_and_a_trained_run(pretrained, tmp_path):
    out = tmp_path / "scripted"
    assert main(["record", "--out", str(out), "--episodes", "3", "--policy",
                 "helpers.controllers.cartpole_balance", "exp=debug", "env.num_envs=1"]) == 0
    recording = json.loads((out / "dataset.json").read_text())["recordings"][0]
    assert recording["policy"] == "controller helpers.controllers.cartpole_balance, seed 0"
    assert recording["returns"] == [50.0] * 3  # the balancing controller lasts to exp=debug's 50-step time limit
    with np.load(out / "episode_000000.npz") as episode:  # the controller's actions, one-hot
        from helpers.controllers import cartpole_balance

        want = cartpole_balance({"vector": episode["vector"][:-1]})
        np.testing.assert_array_equal(episode["action"][:-1].argmax(1), want)
    assert main(["record", "--out", str(out), "--episodes", "2", "--policy", str(pretrained), "--epsilon", "0.2"]) == 0
    recordings = json.loads((out / "dataset.json").read_text())["recordings"]  # appended, the run's own env
    assert recordings[1]["policy"].startswith("run ") and "epsilon 0.2" in recordings[1]["policy"]
    assert len(list(out.glob("episode_*.npz"))) == 5


def test_recording_the_same_episodes_twice_into_a_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "random"
    record = ["record", "--out", str(out), "--episodes", "1", "exp=debug", "env.num_envs=1"]
    assert main(record) == 0
    assert main(record) == 2  # same policy, seed, epsilon and mode: the same episode again
    assert "already holds a recording of --policy random with seed=0" in capsys.readouterr().err
    assert len(list(out.glob("episode_*.npz"))) == 1 and len(json.loads((out / "dataset.json").read_text())[
        "recordings"]) == 1
    assert main([*record[:-2], "env.num_envs=1"]) == 2  # without exp=debug: another time limit
    assert ("holds episodes of another env config (its dataset.json; env.time_limit: 50 there, None here). "
            "Pass the overrides") in capsys.readouterr().err
    assert main([*record, "seed=1"]) == 0
    with np.load(out / "episode_000000.npz") as first, np.load(out / "episode_000001.npz") as second:
        assert not np.array_equal(first["vector"][0], second["vector"][0])  # another seed: another start
    assert [r["seed"] for r in json.loads((out / "dataset.json").read_text())["recordings"]] == [0, 1]


def test_planet_pretrains_and_starts_online_from_it(data, tmp_path):
    """PlaNet's update is world-model only, so it serves as update_model; init_from takes its whole agent."""
    pre, online = tmp_path / "pre", tmp_path / "online"
    assert main(["pretrain", str(data), "agent=planet", "exp=debug", f"run_dir={pre}", "pretrain.updates=4",
                 "pretrain.eval_episodes=0", "env.num_envs=1"]) == 0
    assert all("loss/kl" in m for m in read_jsonl(pre / "metrics.jsonl"))
    assert main(["train", "agent=planet", "exp=debug", f"run_dir={online}", f"init_from={pre}", "train.steps=4",
                 "train.eval_episodes=1", "env.num_envs=1", "init.prefill=8"]) == 0  # no update in 4 steps
    assert same(load_checkpoint(pre)["agent"]["modules"], load_checkpoint(online)["agent"]["modules"])


@pytest.mark.parametrize("nproc, message", [
    ("2", "config error: reverie pretrain runs in one process; set trainer.nproc=1"),
    ("0", "config error: trainer.nproc must be >= 1, got 0"),  # was taken as 1
    ("abc", "config error: trainer.nproc must be an integer >= 1"),  # was a ValueError traceback
])
def test_pretrain_checks_trainer_nproc_before_anything_is_written(data, tmp_path, capsys, nproc, message):
    assert main(["pretrain", str(data), "exp=debug", f"run_dir={tmp_path / 'x'}", f"trainer.nproc={nproc}"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def wide(data, tmp_path_factory):
    """A pretrain run with model overrides the next commands do not repeat (deter 24, units 24: not exp=debug's)."""
    run_dir = tmp_path_factory.mktemp("runs") / "wide"
    assert main(["pretrain", str(data), "exp=debug", f"run_dir={run_dir}", "pretrain.updates=2",
                 "pretrain.eval_episodes=0", "agent.module.dynamics.deter=24", "agent.module.units=24",
                 "agent.module.kernels=off"]) == 0
    return run_dir


def test_init_from_takes_the_runs_model_settings_without_repeating_them(wide, tmp_path, capsys):
    """Was: 'its agent does not fit this config (Error(s) in loading state_dict for DreamerV3:)' unless the command
    repeated agent.module.dynamics.deter=24 agent.module.units=24. The user's own module overrides go on top."""
    online = tmp_path / "online"
    assert main(["train", "exp=debug", f"run_dir={online}", f"init_from={wide}", "train.steps=8", "seed=1",
                 "init.keep_data=false", "init.prefill=8", "train.eval_episodes=1", "agent.module.actor_lr=0.002"]) == 0
    config = OmegaConf.load(online / "config.yaml")
    assert config.agent.module.dynamics.deter == 24 and config.agent.module.units == 24
    assert config.agent.module.actor_lr == 0.002  # the command's override, on top of the run's settings
    assert same(modules(load_checkpoint(wide), "wm."), modules(load_checkpoint(online), "wm."))
    # resuming it recomposes the same module from the run's own config (no 'may not change on resume' refusal)
    assert main(["train", "--resume", str(online), "train.steps=12"]) == 0, capsys.readouterr().err


def test_init_from_takes_the_runs_preset_sizes_under_another_preset(wide, capsys):
    """Without exp=debug the command's preset is exp=classic (size xs: deter 256); the module still comes from the
    run (deter 24, exp=debug's cnn_depth 4), while the training and runtime settings stay the command's."""
    assert main(["train", f"init_from={wide}", "device=cuda:1", "--cfg"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.agent.module.dynamics.deter == 24 and printed.agent.module.cnn_depth == 4
    assert printed.exp_name == "classic" and printed.train.steps == 30000
    # how to run stays the command's: its device (the run's was cpu) and kernels (the run's were off)
    assert printed.agent.module.device == "cuda:1"
    assert printed.agent.module.kernels == printed.agent.module.dynamics.kernels == "auto"


def test_init_from_names_the_model_settings_that_differ(wide, tmp_path, capsys):
    assert main(["train", "exp=debug", f"run_dir={tmp_path / 'x'}", f"init_from={wide}",
                 "agent.module.dynamics.deter=16"]) == 2
    err = capsys.readouterr().err
    assert ("its agent does not fit this config; these model settings differ from that run's: "
            "agent.module.dynamics.deter: 24 (that run) != 16 (this config). init_from takes the run's model "
            "settings: drop the overrides that change them") in err
    assert "Error(s) in loading state_dict" not in err and not (tmp_path / "x").exists()
    assert main(["train", "exp=debug", f"run_dir={tmp_path / 'x'}", f"init_from={wide}", "agent=planet"]) == 2
    assert ("init error: init_from: that run's agent is dreamerv3, this command chooses agent=planet; drop "
            "agent=planet") in capsys.readouterr().err
    assert main(["train", "exp=debug", f"init_from={tmp_path / 'nowhere'}"]) == 2
    assert f"init_from={tmp_path / 'nowhere'}: no such file or folder" in capsys.readouterr().err


def test_current_agent_pretrains_from_rows_without_latents_and_init_from_leaves_them_out(data, tmp_path):
    """agent=dreamerv3_2025 (replay context): a dataset's rows have no stored latent (their windows start from the
    initial state) until the updates write the trained rows' posteriors back; a run's replay read as a dataset
    (init_from with init.keep_data) leaves the latents out, so the new run's rows start without them too."""
    from reverie.data.runs import read_run

    pre = tmp_path / "pre"
    current = ["agent=dreamerv3_2025", "agent.module.warmup=2"]
    assert main(["pretrain", str(data), "exp=debug", *current, f"run_dir={pre}", "pretrain.behavior=true",
                 "pretrain.updates=6", "pretrain.eval_episodes=0"]) == 0
    snapshot = list_checkpoints(pre / "checkpoints")[-1].with_suffix(".replay")
    has = np.load(snapshot / "has_posterior.npy")
    assert has.any() and not has.all()  # written back into trained rows only
    episodes = read_run(pre)
    latents = {"posterior_deter", "posterior_stoch", "has_posterior"}  # the block RSSM's replay context keys
    assert episodes and all(not latents & set(e.rows) for e in episodes)
    online = tmp_path / "online"
    assert main(["train", "exp=debug", *current, f"run_dir={online}", f"init_from={pre}", "seed=1",
                 "train.steps=8", "train.eval_every=0", "train.eval_episodes=1"]) == 0
    saved = list_checkpoints(online / "checkpoints")[-1].with_suffix(".replay")
    meta = json.loads((saved / "replay.json").read_text())
    has = np.load(saved / "has_posterior.npy")
    acted = 8 // meta["num_envs"]  # rows per column the agent acted on (init.prefill 0), after the dataset's
    assert meta["fill"] > acted and has[-acted:].all()  # acted rows have the acting posterior
    assert not has[0].any()  # the dataset's first rows: no latent (a context row, never written back)


def test_record_reports_its_progress_and_one_description(tmp_path, capsys):
    """Issue 47: `record` says how far it is (the last episode always) and describes the dataset as pretrain and
    init_from do (episodes, finished, steps, mean return)."""
    out = tmp_path / "three"
    assert main(["record", "--out", str(out), "--episodes", "3", "exp=debug", "env.num_envs=1"]) == 0
    captured = capsys.readouterr()
    assert "[reverie] record: 3/3 episodes (last return " in captured.err
    assert "[reverie] recorded 3 episodes (3 finished), " in captured.out
