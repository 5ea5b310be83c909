"""Save and load: a run stopped at its checkpoint and resumed is the run that never stopped (both agents); a loaded
run's agent is the checkpointed one and acts as it did."""

import numpy as np
import pytest
import torch

from reverie import load_run
from reverie.state.checkpoint import load_checkpoint

from helpers.runs import read_jsonl, train, without_timing


@pytest.mark.parametrize("agent", ["dreamerv3", "planet"])
def test_stopped_and_resumed_equals_straight(tmp_path, agent):
    """120 env steps straight against 60, stop, resume to 120 (train.steps raised on resume): the same metrics,
    scores and final parameters, bit for bit."""
    common = [f"agent={agent}", "seed=5", "train.checkpoint_every=60", "train.eval_every=60", "train.log_every=60",
              "env.time_limit=20"]  # the metrics rows' intervals end where the first part stops
    straight = train(tmp_path, "straight", *common, "train.steps=120")
    split = train(tmp_path, "split", *common, "train.steps=60")
    train(tmp_path, "split", *common, "train.steps=120")  # the same run_dir: resumes from its checkpoint
    assert without_timing(read_jsonl(split / "metrics.jsonl")) == without_timing(read_jsonl(straight / "metrics.jsonl"))
    assert (split / "scores.jsonl").read_text() == (straight / "scores.jsonl").read_text()
    a, b = (load_run(d, checkpoint="last").agent.state_dict() for d in (straight, split))
    for key, value in a["modules"].items():
        assert torch.equal(value, b["modules"][key]), key


def test_a_loaded_run_holds_the_checkpointed_agent_and_acts_as_it(tmp_path):
    run_dir = train(tmp_path, "run", "train.steps=64", "train.eval_episodes=1")
    run, payload = load_run(run_dir, checkpoint="last"), load_checkpoint(run_dir)
    for key, value in payload["agent"]["modules"].items():
        assert torch.equal(run.agent.state_dict()["modules"][key], value), key
    twin = load_run(run_dir, checkpoint="last")
    obs = {"vector": np.linspace(-1, 1, 4, dtype=np.float32)}
    torch.manual_seed(0)
    first, state = run.act(obs)
    torch.manual_seed(0)
    again, _ = twin.act(obs)
    assert first == again and run.counters["env_steps"] == 64
