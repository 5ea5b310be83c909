"""VectorStepper over sync and async NEXT_STEP vector envs: exact rows, flags, resets and episode stats."""

import functools

import gymnasium as gym
import numpy as np
import pytest

from reverie.envs import VectorStepper, make_env, make_vector_env

COUNTING = "reverie.envs.testing.CountingEnv"


def counting_vector_env(lengths, mode, **kwargs):
    """One CountingEnv per entry of ``lengths`` (so envs end episodes out of phase), built like make_vector_env."""
    fns = [
        functools.partial(make_env, {"id": COUNTING, "kwargs": {"length": n, **kwargs}}, 0, i)
        for i, n in enumerate(lengths)
    ]
    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    return cls(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def run(stepper, calls, action):
    rows, episodes = [stepper.reset()], []
    for k in range(calls):
        row, done = stepper.step(action)
        rows.append(row)
        episodes += [(k + 1, e["env"], e["return"], e["length"]) for e in done]
    return rows, episodes


def column(rows, key, env, index=None):
    values = [row[key][env] if index is None else row[key][env][index] for row in rows]
    return [v.item() for v in values]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("terminate", [True, False])
def test_exact_rows_for_envs_of_different_lengths(mode, terminate):
    stepper = VectorStepper(counting_vector_env([2, 3], mode, terminate=terminate))
    try:
        rows, episodes = run(stepper, 6, np.array([[1, 0], [0, 1]], np.float32))
    finally:
        stepper.close()
    assert set(rows[0]) == {"vector", "reward", "is_first", "is_last", "is_terminal"}
    assert rows[1]["reward"].dtype == np.float32 and rows[1]["is_last"].dtype == bool
    # env 0: length 2; the row after is_last is the reset obs of the next episode with reward 0.
    assert column(rows, "vector", 0, 0) == [0, 1, 2, 1000, 1001, 1002, 2000]
    assert column(rows, "reward", 0) == [0, 1, 2, 0, 1, 2, 0]
    assert column(rows, "is_first", 0) == [True, False, False, True, False, False, True]
    assert column(rows, "is_last", 0) == [False, False, True, False, False, True, False]
    assert column(rows, "is_terminal", 0) == [False, False, terminate, False, False, terminate, False]
    # env 1: length 3.
    assert column(rows, "vector", 1, 0) == [0, 1, 2, 3, 1000, 1001, 1002]
    assert column(rows, "reward", 1) == [0, 1, 2, 3, 0, 1, 2]
    assert column(rows, "is_first", 1) == [True, False, False, False, True, False, False]
    assert column(rows, "is_last", 1) == [False, False, False, True, False, False, False]
    assert column(rows, "is_terminal", 1) == [False, False, False, terminate, False, False, False]
    # (call, env, return, length)
    assert episodes == [(2, 0, 3.0, 2), (3, 1, 6.0, 3), (5, 0, 3.0, 2)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vector_env_rows_and_seeding(mode):
    cfg = {"id": COUNTING, "kwargs": {"length": 3}, "num_envs": 2, "vector_mode": mode}
    env = make_vector_env(cfg, seed=0)
    assert isinstance(env, gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv)
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    stepper = VectorStepper(env)
    try:
        rows, episodes = run(stepper, 5, np.array([[1, 0], [1, 0]], np.float32))
    finally:
        stepper.close()
    for i in (0, 1):
        assert column(rows, "vector", i, 0) == [0, 1, 2, 3, 1000, 1001]
        assert column(rows, "is_first", i) == [True, False, False, False, True, False]
    assert episodes == [(3, 0, 6.0, 3), (3, 1, 6.0, 3)]


def test_vector_env_copies_get_distinct_seeds():
    env = make_vector_env({"id": "CartPole-v1"}, seed=0, num_envs=2, mode="sync")
    obs = VectorStepper(env).reset()["vector"]
    assert not np.array_equal(obs[0], obs[1])
    single, _ = make_env({"id": "CartPole-v1"}, 0, index=1).reset()
    np.testing.assert_array_equal(obs[1], single["vector"])


def test_discrete_one_hot_actions_reach_env_as_indices():
    stepper = VectorStepper(counting_vector_env([3], "sync", obs_dim=2, echo_action=True))
    stepper.reset()
    row, _ = stepper.step(np.array([[0.2, 0.8]], np.float32))
    assert row["vector"].tolist() == [[1.0, 1.0]]
    row, _ = stepper.step(np.array([[0.9, 0.1]], np.float32))
    assert row["vector"].tolist() == [[2.0, 0.0]]


def test_time_limit_gives_is_last_without_is_terminal():
    cfg = {"id": COUNTING, "kwargs": {"length": 100}, "time_limit": 2}
    stepper = VectorStepper(make_vector_env(cfg, seed=0, num_envs=1))
    rows, episodes = run(stepper, 3, np.zeros((1, 2), np.float32))
    assert column(rows, "is_last", 0) == [False, False, True, False]
    assert column(rows, "is_terminal", 0) == [False, False, False, False]
    assert column(rows, "vector", 0, 0) == [0, 1, 2, 1000]
    assert episodes == [(2, 0, 3.0, 2)]


def test_rejects_same_step_vector_env_and_step_before_reset():
    fns = [functools.partial(make_env, {"id": COUNTING}, 0, 0)]
    same = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match="autoreset_mode=AutoresetMode.NEXT_STEP"):
        VectorStepper(same)
    stepper = VectorStepper(make_vector_env({"id": COUNTING}, seed=0))
    with pytest.raises(RuntimeError, match="call reset"):
        stepper.step(np.zeros((1, 2), np.float32))
    stepper.reset()
    with pytest.raises(ValueError, match=r"shape \(1, 2\)"):
        stepper.step(np.zeros((2, 2), np.float32))
