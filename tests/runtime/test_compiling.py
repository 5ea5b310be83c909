"""DreamerV3(compile=True): same losses as eager on the debug preset; clean eager fallback
(reverie.runtime.compiling)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import reverie.runtime.compiling as compiling
from reverie.agents.dreamer import DreamerV3
from reverie.envs.testing import random_batch
from reverie.types import ActionSpec
from helpers.agents import dreamer

DEBUG = dreamer()  # size=debug, exp=debug


def make_batch(T: int = 8, B: int = 4, seed: int = 0) -> dict[str, np.ndarray]:  # exp=debug: batch 4 x 8
    return random_batch(T, B, seed=seed)


def run(compile_: bool, updates: int = 3) -> tuple[DreamerV3, list[dict[str, float]], np.ndarray]:
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), compile=compile_, **DEBUG)
    metrics = []
    for i in range(updates):
        torch.manual_seed(100 + i)  # the same latent and action draws in both runs
        metrics.append(agent.update(make_batch(seed=i)))
    torch.manual_seed(7)
    obs = {"vector": np.ones((3, 4), np.float32), "is_first": np.ones(3, bool)}
    action, _ = agent.act(obs, None, "eval")
    return agent, metrics, action


@pytest.mark.timeout(600)
def test_compiled_update_gives_the_eager_losses():
    reason = compiling.compile_unavailable("cpu")
    if reason is not None:
        pytest.skip(f"torch.compile (inductor) cannot compile on this machine: {reason}")
    _, eager, eager_action = run(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would make this test vacuous
        agent, compiled, compiled_action = run(True)
    assert agent.compiled
    fallbacks = [agent.wm.dynamics._cell, agent.critic.forward, agent.actor.net.forward, agent.wm.reward_head.forward]
    assert all(isinstance(f, compiling.EagerFallback) and f.state == "compiled" for f in fallbacks)
    for step, (want, got) in enumerate(zip(eager, compiled)):
        assert want.keys() == got.keys()
        for key in want:
            if key.startswith("loss/"):
                assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), f"update {step}: {key}"
    assert np.array_equal(compiled_action, eager_action)
    # the state_dict keys (checkpoints) are those of an eager agent
    eager_agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **DEBUG)
    assert agent.state_dict()["modules"].keys() == eager_agent.state_dict()["modules"].keys()


def test_compile_unavailable_warns_and_runs_eager(monkeypatch):
    monkeypatch.setattr(compiling, "compile_unavailable", lambda device_type="cpu": "no C++ compiler (test)")
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), compile=True, **DEBUG)
    assert not agent.compiled
    assert not isinstance(agent.wm.dynamics.__dict__.get("_cell"), compiling.EagerFallback)
    assert np.isfinite(agent.update(make_batch())["loss/model"])


def test_a_failing_compile_falls_back_to_eager_at_the_first_call():
    def broken(x):
        raise RuntimeError("inductor could not lower op (test)")

    fallback = compiling.EagerFallback(lambda x: x + 1, broken, "probe")
    with pytest.warns(RuntimeWarning, match="torch.compile of probe failed"):
        assert fallback(1) == 2
    assert fallback.state == "eager" and fallback(2) == 3
    ok = compiling.EagerFallback(lambda x: x + 1, lambda x: x + 1, "ok")
    assert ok(1) == 2 and ok.state == "compiled"
    failing_later = compiling.EagerFallback(lambda x: x, lambda x: 1 / x, "later")
    assert failing_later(1) == 1
    with pytest.raises(ZeroDivisionError):  # after a successful compile, errors are the inputs' and surface
        failing_later(0)
