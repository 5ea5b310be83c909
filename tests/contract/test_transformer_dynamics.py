"""The transformer dynamics (``dynamics=storm``) through config alone: `reverie train` with its open-loop reports,
`eval --openloop`, `imagine`, `play` and planning on the trained run, exact resume, and a learning check with its
counter-check (the same judgement as tests/contract/test_learning.py).

Learning check, measured on this project's 2-core CPU under load (10-20), ``IdentityEnv`` with 4 actions, 450 env
steps, the 2023 learning check's settings (batch 16 x 8, 2 updates per env step after 100 random ones, faster
learning rates), threshold 6.0 (random 2.5), mean of the last 3 evaluations, seeds 0 / 1 / 2 (the test runs seed
0; untrained, the first evaluation: 2.4 / 2.6 / 3.0): 8.70 / 8.83 / 9.20 (learning shows at 350 steps in each),
31-33 CPU s each. The actor's learning rate at 0 (``actor_lr=0``, the counter-check): 2.30 / 1.57 / 2.00.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reverie.cli import main
from reverie.play.session import PlaySession
from reverie.state.saved_run import load_run
from reverie.types import ActionSpec

from helpers.runs import read_jsonl, train, without_timing

STORM = "dynamics=storm"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "storm"
    assert main(["train", "exp=debug", STORM, f"run_dir={run_dir}", "train.steps=120", "train.report_every=40",
                 "train.eval_episodes=1"]) == 0
    return run_dir


def test_train_selects_it_by_config_alone_and_reports_open_loop(run_dir):
    rows = read_jsonl(run_dir / "metrics.jsonl")
    losses = [r for r in rows if "loss/dyn" in r]
    assert losses and all(np.isfinite(r["loss/model"]) and r["loss/dyn"] >= 1.0 for r in losses)  # free bits
    assert any("openloop/vector_error" in r for r in rows) and list((run_dir / "plots").glob("openloop_reward_*.png"))
    run = load_run(run_dir, checkpoint="last")
    assert type(run.agent.wm.dynamics).__name__ == "TransformerDynamics"
    assert run.config["agent"]["module"]["dynamics"]["_target_"] == "reverie.models.dynamics.TransformerDynamics"


def test_eval_openloop_and_imagine_commands(run_dir, tmp_path):
    assert main(["eval", str(run_dir), "--episodes", "2", "--no-video", "--openloop",
                 "--out", str(tmp_path / "e")]) == 0
    table = json.loads((tmp_path / "e" / "returns.json").read_text())
    assert len(table["returns"]) == 2 and list((tmp_path / "e").glob("episode_*_openloop.png"))
    assert main(["imagine", str(run_dir), "--horizon", "6", "--out", str(tmp_path / "i")]) == 0
    out = json.loads((tmp_path / "i" / "imagine.json").read_text())
    assert len(out["reward"]) == out["context"] + 6 and np.all(np.isfinite(out["reward"]))


def test_play_dreams_with_the_cache(run_dir):
    """The dream pane steps ``img_step`` on the cache: its predicted rewards are those of the world model rolled
    from the same start with the same actions."""
    run = load_run(run_dir)
    wm = run.agent.wm
    session = PlaySession(run.agent, run.config["env"], ActionSpec(True, 2), seed=0)
    start = {k: v.clone() for k, v in session.dream.items()}
    for action in (1, 0, 1, 1):
        session.step(action)
    expected, state = [], start
    with torch.no_grad():
        for action in (1, 0, 1, 1):
            state = wm.dynamics.img_step(state, torch.eye(2)[[action]], sample=False)
            expected.append(float(wm.reward(wm.dynamics.features(state)).mean[0]))
    np.testing.assert_allclose(session.history["pred_reward"], expected, rtol=0, atol=1e-6)
    # the dream started from the posterior of the episode's first observation: its token and the 4 imagined ones
    assert session.dream["valid"].tolist() == [[False] * 11 + [True] * 5]
    session.close()


def test_planning_acts_over_it(run_dir):
    run = load_run(run_dir, planner="cem", plan={"candidates": 16, "top_k": 4, "iterations": 2, "horizon": 4})
    obs = {"vector": np.linspace(-0.1, 0.1, 4, dtype=np.float32)}
    action, state = run.act(obs)
    action, _ = run.act(obs, state)
    assert action in (0, 1)


def test_stopped_and_resumed_equals_straight(tmp_path):
    """120 env steps straight against 60, stop, resume to 120: the same metrics, scores and parameters, bit for bit
    (the acting carry, a cache of the last L tokens per env, is saved and restored with the checkpoint)."""
    common = [STORM, "seed=5", "train.checkpoint_every=60", "train.eval_every=60", "train.log_every=60",
              "env.time_limit=20"]
    straight = train(tmp_path, "straight", *common, "train.steps=120")
    split = train(tmp_path, "split", *common, "train.steps=60")
    train(tmp_path, "split", *common, "train.steps=120")
    assert without_timing(read_jsonl(split / "metrics.jsonl")) == without_timing(read_jsonl(straight / "metrics.jsonl"))
    assert (split / "scores.jsonl").read_text() == (straight / "scores.jsonl").read_text()
    a, b = (load_run(d, checkpoint="last").agent.state_dict() for d in (straight, split))
    for key, value in a["modules"].items():
        assert torch.equal(value, b["modules"][key]), key


# --------------------------------------------------------------------------------------------- the learning check
IDENTITY = ["exp=debug", "env=gym", "env.id=reverie.envs.testing.IdentityEnv", "+env.kwargs.length=10",
            "env.num_envs=1", "train.checkpoint_every=0", "train.eval_episodes=10", "train.eval_every=50", "seed=0"]
CHECK = [STORM, "+env.kwargs.n=4", "train.prefill=100", "agent.batch_size=16", "agent.train_ratio=256",
         "agent.module.model_lr=3e-3", "agent.module.actor_lr=1e-3", "agent.module.critic_lr=1e-3", "train.steps=450"]
THRESHOLD = 6.0
COUNTER = "agent.module.actor_lr=0"


def mean_of_last_evaluations(run_dir, last=3):
    returns = [r["eval/return_mean"] for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/return_mean" in r]
    assert len(returns) >= last, returns
    return sum(returns[-last:]) / last


def test_it_learns_identity_env(tmp_path):
    assert main(["train", f"run_dir={tmp_path / 'run'}", *IDENTITY, *CHECK]) == 0
    assert mean_of_last_evaluations(tmp_path / "run") >= THRESHOLD


def test_broken_learning_fails_the_check(tmp_path):
    assert main(["train", f"run_dir={tmp_path / 'run'}", *IDENTITY, *CHECK, COUNTER]) == 0
    assert mean_of_last_evaluations(tmp_path / "run") < THRESHOLD
