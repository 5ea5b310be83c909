"""An env that raises is rebuilt: its episodes close with is_last, then restart with is_first (issue 6)."""

import gymnasium as gym
import numpy as np
import pytest

from reverie.envs.stepper import VectorStepper
from reverie.envs.testing import FlakyEnv


def vec(fail_at=None, offset=0, n=2):
    return gym.vector.SyncVectorEnv([lambda: FlakyEnv(fail_at, offset)] * n,
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def test_failure_closes_episodes_then_restarts_with_is_first():
    made = []
    stepper = VectorStepper(vec(fail_at=3), make=lambda k: made.append(k) or vec(offset=100 * k), max_restarts=2)
    action = np.eye(2, dtype=np.float32)[[0, 1]]
    stepper.reset()
    rows = [stepper.step(action)[0] for _ in range(2)]  # obs 1, 2
    with pytest.warns(RuntimeWarning, match="simulator crashed"):
        closing, episodes = stepper.step(action)  # the third step raises
    assert made == [1] and stepper.restarts == 1 and episodes == []
    np.testing.assert_array_equal(closing["vector"], rows[-1]["vector"])  # the last observation again
    assert closing["is_last"].all() and not closing["is_terminal"].any() and not closing["is_first"].any()
    assert (closing["reward"] == 0).all()
    first, _ = stepper.step(action)  # the rebuilt env's reset row; action ignored
    assert first["is_first"].all() and not first["is_last"].any()
    np.testing.assert_array_equal(first["vector"][:, 0], [100, 100])
    nxt, _ = stepper.step(action)
    np.testing.assert_array_equal(nxt["vector"][:, 0], [101, 101])
    assert not nxt["is_first"].any()


def test_bounded_retries_then_raise():
    stepper = VectorStepper(vec(fail_at=1), make=lambda k: vec(fail_at=1), max_restarts=2)
    stepper.reset()
    action = np.eye(2, dtype=np.float32)[[0, 0]]
    with pytest.warns(RuntimeWarning):
        stepper.step(action)  # failure 1: restart
        stepper.step(action)  # the reset row
        stepper.step(action)  # failure 2: restart
        stepper.step(action)
        with pytest.raises(RuntimeError, match="failed 3 times in a row"):
            stepper.step(action)
    without = VectorStepper(vec(fail_at=1))  # no make: errors propagate unchanged
    without.reset()
    with pytest.raises(RuntimeError, match="simulator crashed"):
        without.step(action)


def test_state_dict_continues_episodes_exactly():
    a = VectorStepper(vec())
    a.reset()
    action = np.eye(2, dtype=np.float32)[[0, 1]]
    for _ in range(3):
        a.step(action)
    state = a.state_dict()
    b = VectorStepper(vec(offset=50))
    b.reset()
    assert b.load_state_dict(state) is True
    ra, rb = a.step(action)[0], b.step(action)[0]
    for key in ra:
        np.testing.assert_array_equal(ra[key], rb[key])
