"""agent=storm (issue 44 item 1): the transformer world model with STORM's actor-critic, through the CLI; its
actor-critic's update is checked against STORM's own code in tests/goldens/test_storm_actor_critic.py."""

import json

import numpy as np
import pytest
import torch

from reverie.agents.build import build_agent
from reverie.agents.storm import Storm
from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.types import ActionSpec


def test_storm_trains_through_the_cli_with_its_own_losses(tmp_path):
    run_dir = tmp_path / "storm"
    assert main(["train", "exp=debug", "agent=storm", f"run_dir={run_dir}", "train.steps=96",
                 "train.eval_every=0", "train.log_every=32"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "loss/policy" in r]
    assert losses and all(np.isfinite(r[k]) for r in losses for k in ("loss/policy", "loss/value", "loss/slow_reg",
                                                                        "loss/model", "return/scale"))
    assert "loss/actor" not in losses[-1]  # DreamerV3's actor-critic is not there


def test_storm_settings_are_storms_and_continuous_actions_are_refused(tmp_path, capsys):
    agent = build_agent(load_config(["agent=storm", "exp=debug"]).agent, {"vector": (4,)}, ActionSpec(True, 3))
    assert isinstance(agent, Storm) and type(agent.wm.dynamics).__name__ == "TransformerDynamics"
    ac = agent.ac
    assert (ac.gamma, ac.lam, ac.entropy, ac.clip, ac.slow_decay) == (0.985, 0.95, 3e-4, 100.0, 0.98)
    assert ac.opt.defaults["lr"] == 3e-5 and ac.opt.defaults["eps"] == 1e-5
    assert load_config(["agent=storm"]).agent.module.horizon == 16
    run_dir = tmp_path / "pendulum"
    assert main(["train", "exp=debug", "agent=storm", "env=pendulum", f"run_dir={run_dir}"]) == 2
    assert "agent=storm: STORM's policy is a categorical over discrete actions" in capsys.readouterr().err
    assert not run_dir.exists()


def test_eval_takes_the_most_probable_action_and_explore_samples():
    torch.manual_seed(0)
    agent = build_agent(load_config(["agent=storm", "exp=debug"]).agent, {"vector": (4,)}, ActionSpec(True, 3))
    with torch.no_grad():
        agent.ac.actor[-1].bias.copy_(torch.tensor([0.0, 3.0, 0.0]))  # action 1 the most probable (~0.9)
        agent.ac.actor[-1].weight.zero_()
    obs = {"vector": np.zeros((64, 4), np.float32), "is_first": np.ones(64, bool)}
    greedy, _ = agent.act(obs, mode="eval")
    sampled, _ = agent.act(obs, mode="explore")
    assert (greedy.argmax(-1) == 1).all() and set(np.unique(greedy)) == {0.0, 1.0}
    assert 0 < (sampled.argmax(-1) != 1).sum() < 32  # p(other) = 2 / (2 + e^3) = 0.09 each draw
