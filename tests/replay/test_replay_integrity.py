"""Counting env -> vector env -> VectorStepper -> Replay -> sample: flags, resets, prev-action alignment, wrap."""

import functools

import gymnasium as gym
import numpy as np
import pytest

from reverie.envs import VectorStepper, make_env, make_vector_env
from reverie.envs.testing import CODE_BASE
from reverie.replay import Replay

LENGTHS = (3, 4, 6)  # per env, so episodes end out of phase


def collect(replay, stepper, calls, rng):
    """Run the collect loop as train.py does: row k gets action_k, then the env steps with action_k."""
    row = stepper.reset()
    for _ in range(calls):
        action = rng.uniform(-1, 1, (stepper.num_envs, 1)).astype(np.float32)
        replay.add({**row, "action": action})
        row, _ = stepper.step(action)


def counting_stepper(mode, terminate=True):
    fns = [
        functools.partial(
            make_env,
            {"id": "reverie.envs.testing.CountingEnv",
             "kwargs": {"length": n, "obs_dim": 2, "echo_action": True, "discrete": False, "terminate": terminate}},
            0,
            i,
        )
        for i, n in enumerate(LENGTHS)
    ]
    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    return VectorStepper(cls(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP))


def check_windows(out, terminate=True):
    """Every window is a consecutive (episode, step) stream except exactly where is_first is set."""
    code = out["vector"][..., 0].astype(np.int64)  # (T, B)
    episode, step = code // CODE_BASE, code % CODE_BASE
    first, last = out["is_first"], out["is_last"]
    np.testing.assert_array_equal(first, step == 0)
    np.testing.assert_array_equal(out["reward"], step.astype(np.float32))
    np.testing.assert_array_equal(out["is_terminal"], last if terminate else np.zeros_like(last))
    same = (episode[1:] == episode[:-1]) & (step[1:] == step[:-1] + 1)
    crossing = first[1:] & last[:-1] & (episode[1:] == episode[:-1] + 1)
    np.testing.assert_array_equal(same | crossing, np.ones_like(same))
    np.testing.assert_array_equal(crossing, first[1:])
    # is_last exactly at the end of an episode: a length from LENGTHS, never earlier.
    assert set(step[last].tolist()) <= set(LENGTHS)
    # prev_action: 0 where is_first, else the action the env received (echoed in obs) == previous row's action.
    echo = out["vector"][..., 1]
    np.testing.assert_array_equal(out["prev_action"][..., 0], np.where(first, 0.0, echo))
    np.testing.assert_array_equal(out["prev_action"][1:], np.where(first[1:, :, None], 0.0, out["action"][:-1]))
    assert np.abs(out["prev_action"][~first]).sum() > 0  # the check above is not vacuous


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sampled_windows_are_aligned(mode):
    stepper = counting_stepper(mode)
    try:
        spec = Replay.spec_for(stepper.env.single_observation_space, stepper.action_spec.dim)
        replay = Replay(capacity=3 * 200, num_envs=3, spec=spec, seed=0)
        collect(replay, stepper, 60, np.random.default_rng(0))
    finally:
        stepper.close()
    out = replay.sample(batch=64, length=12)
    check_windows(out)
    # Every stored row appears exactly once per call: column n holds env n's full stream in order.
    for n, length in enumerate(LENGTHS):
        codes = replay.arrays["vector"][:60, n, 0].astype(int)
        expected = [e * CODE_BASE + s for e in range(60) for s in range(length + 1)][:60]
        assert codes.tolist() == expected


def test_truncation_gives_is_last_only():
    stepper = counting_stepper("sync", terminate=False)
    spec = Replay.spec_for(stepper.env.single_observation_space, 1)
    replay = Replay(capacity=3 * 50, num_envs=3, spec=spec, seed=0)
    collect(replay, stepper, 40, np.random.default_rng(1))
    out = replay.sample(batch=32, length=10)
    check_windows(out, terminate=False)
    assert out["is_last"].any()


def test_ring_wrap_keeps_windows_valid():
    stepper = counting_stepper("sync")
    spec = Replay.spec_for(stepper.env.single_observation_space, 1)
    replay = Replay(capacity=3 * 16, num_envs=3, spec=spec, seed=4)  # 16 rows per env
    collect(replay, stepper, 101, np.random.default_rng(2))  # wraps 6 times; cursor at row 101 % 16 = 5
    assert (replay.cursor, replay.num_rows) == (5, 16)
    for length in (1, 8, 15):
        check_windows(replay.sample(batch=256, length=length))
    # The only length-15 window is the 15 newest rows: calls 86..100 of each column.
    out = replay.sample(batch=32, length=15)
    newest = sorted([(k // (n + 1)) * CODE_BASE + k % (n + 1) for k in range(86, 101)] for n in LENGTHS)
    got = {tuple(window) for window in out["vector"][:, :, 0].astype(int).T.tolist()}
    assert sorted(map(list, got)) == newest


def test_image_rows_stored_uint8():
    cfg = {"id": "reverie.envs.testing.ImageCountingEnv", "kwargs": {"length": 4, "dict_obs": True}, "num_envs": 2}
    stepper = VectorStepper(make_vector_env(cfg, seed=0))
    spec = Replay.spec_for(stepper.env.single_observation_space, stepper.action_spec.dim)
    assert spec["image"] == ((3, 64, 64), np.dtype(np.uint8))
    replay = Replay(capacity=2 * 20, num_envs=2, spec=spec, seed=0)
    row = stepper.reset()
    for _ in range(15):
        action = np.eye(2, dtype=np.float32)[[0, 1]]
        replay.add({**row, "action": action})
        row, _ = stepper.step(action)
    assert replay.arrays["image"].dtype == np.uint8
    out = replay.sample(batch=8, length=6)
    assert out["image"].dtype == np.uint8 and out["image"].shape == (6, 8, 3, 64, 64)
    step = out["vector"][..., 0].astype(int) % CODE_BASE
    np.testing.assert_array_equal(out["image"][:, :, 0, 5, 7], step)
    np.testing.assert_array_equal(out["image"][:, :, 1, 0, 0], out["vector"][..., 0].astype(int) // CODE_BASE)
