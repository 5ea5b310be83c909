"""Ratio: updates = floor(env_steps * train_ratio / (B * T)) exactly, across calls and checkpoints."""

import pytest

from reverie.replay import Ratio


def test_half_update_per_step():
    ratio = Ratio(train_ratio=512, batch_size=16, batch_length=64)
    assert ratio.updates_per_step == 0.5
    assert [ratio(1) for _ in range(6)] == [0, 1, 0, 1, 0, 1]


def test_vector_env_steps_and_many_updates_per_call():
    ratio = Ratio(train_ratio=1024, batch_size=16, batch_length=64)  # 1 update per step
    assert [ratio(4), ratio(4), ratio(0)] == [4, 4, 0]
    ratio = Ratio(train_ratio=3, batch_size=1, batch_length=2)  # 1.5 per step
    assert [ratio(1), ratio(1), ratio(1), ratio(3)] == [1, 2, 1, 5]


def test_large_totals_exact():
    ratio = Ratio(train_ratio=1000, batch_size=16, batch_length=64)  # 125/128 per step, not a float-friendly sum
    total = sum(ratio(7) for _ in range(100_000))
    assert total == 700_000 * 125 // 128 == 683_593
    ratio = Ratio(train_ratio=0.1, batch_size=1, batch_length=1)
    assert sum(ratio(1) for _ in range(1000)) == 100  # exact for the float 0.1 (just above 1/10)


def test_state_dict_round_trip_continues_exactly():
    a = Ratio(512, 16, 64)
    a(3)
    b = Ratio(512, 16, 64)
    b.load_state_dict(a.state_dict())
    assert a.state_dict() == {"env_steps": 3, "updates": 1}
    assert [a(1) for _ in range(5)] == [b(1) for _ in range(5)] == [1, 0, 1, 0, 1]


def test_zero_ratio_and_errors():
    assert Ratio(0, 16, 64)(1000) == 0
    with pytest.raises(ValueError, match="train_ratio must be >= 0"):
        Ratio(-1, 16, 64)
    with pytest.raises(ValueError, match="batch_size and batch_length must be >= 1"):
        Ratio(512, 0, 64)
    with pytest.raises(ValueError, match="env_steps_added must be >= 0"):
        Ratio(512, 16, 64)(-1)
