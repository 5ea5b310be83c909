"""Update schedules: PlaNet's episode cycle and the train-ratio adapter share one interface."""

import pytest
from omegaconf import OmegaConf

from reverie.replay.cycle import EpisodeCycle, StepRatio, make_schedule


def test_episode_cycle_counts_exactly():
    cycle = EpisodeCycle(train_steps=100, collect_every=2)
    assert cycle(4, episodes_finished=5) == 100  # first call after the prefill: train on the seed episodes
    # 1+1 -> one cycle; 3 -> one more (+1 left)
    assert [cycle(1, e) for e in (0, 1, 0, 1, 3, 0)] == [0, 0, 0, 100, 100, 0]
    assert cycle(1, 1) == 100
    assert cycle.state_dict() == {"env_steps": 11, "episodes": 6, "cycles": 4}


def test_episode_cycle_resumes_from_its_state():
    a = EpisodeCycle(10, 1)
    a(5, 0)
    a(5, 1)
    b = EpisodeCycle(10, 1)
    b.load_state_dict(a.state_dict())
    assert [a(1, 2), a(1, 0)] == [b(1, 2), b(1, 0)] == [20, 0]


def test_bad_counts_raise():
    with pytest.raises(ValueError, match="collect_every >= 1"):
        EpisodeCycle(100, 0)
    with pytest.raises(ValueError, match=">= 0"):
        EpisodeCycle()(-1)


def test_make_schedule_picks_from_the_agent_config():
    planet = make_schedule(OmegaConf.create({"schedule": "episodes", "train_steps": 7, "collect_every": 1}))
    assert isinstance(planet, EpisodeCycle) and planet(1) == 7
    dreamer = make_schedule(OmegaConf.create({"train_ratio": 16, "batch_size": 4, "batch_length": 8}))
    assert isinstance(dreamer, StepRatio)
    # 16 / 32: one update per 2 env steps; episodes ignored
    assert [dreamer(1, episodes_finished=3) for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="schedule"):
        make_schedule(OmegaConf.create({"schedule": "sometimes"}))
