"""Update schedules: DreamerV3's train ratio or PlaNet's episode cycle, both called with the env steps (and
episodes) just collected and returning the updates owed now; both checkpointed by ``state_dict``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reverie.replay.ratio import Ratio


class StepRatio(Ratio):
    """:class:`Ratio` that also accepts (and ignores) ``episodes_finished``, so both schedules share one call."""

    def __call__(self, env_steps_added: int, episodes_finished: int = 0) -> int:
        return super().__call__(env_steps_added)

    def __str__(self) -> str:
        return f"train ratio: {self.updates_per_step:.4g} updates per env step"


class EpisodeCycle:
    """PlaNet's collection cycle (Hafner et al. 2019, algorithm 1): ``train_steps`` (100) updates at the first call,
    after the prefill's seed episodes, then after every ``collect_every`` (1) finished episodes. Raises ValueError
    for ``train_steps < 0`` or ``collect_every < 1``."""

    def __init__(self, train_steps: int = 100, collect_every: int = 1):
        if train_steps < 0 or collect_every < 1:
            raise ValueError(f"EpisodeCycle needs train_steps >= 0 and collect_every >= 1; got {train_steps} and "
                             f"{collect_every}")
        self.train_steps, self.collect_every = int(train_steps), int(collect_every)
        self.env_steps = 0  # env steps seen since the first call
        self.episodes = 0  # episodes finished after the first call
        self.cycles = 0  # cycles paid out (each owes train_steps updates)

    def __call__(self, env_steps_added: int, episodes_finished: int = 0) -> int:
        """Return the updates owed now: in total ``train_steps * (1 + episodes // collect_every)``, counting the
        episodes after the first call. Raises ValueError for a negative count."""
        if env_steps_added < 0 or episodes_finished < 0:
            raise ValueError(f"EpisodeCycle: counts must be >= 0, got {env_steps_added} and {episodes_finished}")
        first = self.cycles == 0
        self.env_steps += int(env_steps_added)
        self.episodes += 0 if first else int(episodes_finished)
        due = 1 + self.episodes // self.collect_every
        owed, self.cycles = (due - self.cycles) * self.train_steps, due
        return owed

    def __str__(self) -> str:
        return (f"episode cycle: {self.train_steps} updates after the prefill and after every "
                f"{self.collect_every} episode(s)")

    def state_dict(self) -> dict:
        """``{"env_steps", "episodes", "cycles"}``."""
        return {"env_steps": self.env_steps, "episodes": self.episodes, "cycles": self.cycles}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore counters saved by :meth:`state_dict`."""
        self.env_steps, self.episodes, self.cycles = (int(state["env_steps"]), int(state["episodes"]),
                                                      int(state["cycles"]))


def make_schedule(agent_cfg: Mapping[str, Any]) -> StepRatio | EpisodeCycle:
    """:class:`EpisodeCycle` for ``agent.schedule: episodes``, else :class:`StepRatio`; ValueError for an unknown
    ``schedule``."""
    kind = agent_cfg.get("schedule", "ratio") or "ratio"
    if kind == "episodes":
        return EpisodeCycle(int(agent_cfg["train_steps"]), int(agent_cfg.get("collect_every", 1)))
    if kind != "ratio":
        raise ValueError(f"agent.schedule must be 'ratio' (train_ratio) or 'episodes' (PlaNet cycle), got {kind!r}")
    return StepRatio(float(agent_cfg["train_ratio"]), int(agent_cfg["batch_size"]), int(agent_cfg["batch_length"]))
