"""Train-ratio scheduler: how many updates to run for the env steps just collected."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction


class Ratio:
    """DreamerV3's train ratio (replayed steps per env step; 0: never update): in total
    ``floor(env_steps * train_ratio / (B * T))`` updates, in exact rationals. ValueError for a negative ratio or
    ``B``, ``T`` < 1."""

    def __init__(self, train_ratio: float, batch_size: int, batch_length: int):
        if train_ratio < 0:
            raise ValueError(f"train_ratio must be >= 0 (replayed steps per env step), got {train_ratio}")
        if batch_size < 1 or batch_length < 1:
            raise ValueError(f"batch_size and batch_length must be >= 1, got {batch_size} and {batch_length}")
        self._per_step = Fraction(train_ratio) / (int(batch_size) * int(batch_length))
        self.env_steps = 0  # total env steps seen
        self.updates = 0  # total updates handed out

    @property
    def updates_per_step(self) -> float:
        """``train_ratio / (batch_size * batch_length)``."""
        return float(self._per_step)

    def __call__(self, env_steps_added: int) -> int:
        """Record new env steps and return the updates to run now; ValueError when negative."""
        if env_steps_added < 0:
            raise ValueError(f"env_steps_added must be >= 0, got {env_steps_added}")
        self.env_steps += int(env_steps_added)
        due = int(self.env_steps * self._per_step)  # floor: both are non-negative
        updates, self.updates = due - self.updates, due
        return updates

    def state_dict(self) -> dict:
        """``{"env_steps": int, "updates": int}``."""
        return {"env_steps": self.env_steps, "updates": self.updates}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore counters saved by :meth:`state_dict`."""
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
