"""The training loop's own state: counters, clocks, the update schedule, evaluations and the loop's random stream.

All of it goes into every checkpoint (top-level keys ``counters``, ``clocks``, ``ratio``, ``evals``,
``last_return``, ``rng``) and comes back on resume, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reverie.loop.clock import Clock
from reverie.replay.cycle import EpisodeCycle, StepRatio
from reverie.state.rng import rng_state, set_rng_state

CLOCKS = ("log", "eval", "checkpoint", "report")  # report counts updates, the others env steps


@dataclass
class LoopState:
    """Counters, clocks and schedule of one run.

    ``schedule`` is the train_ratio clock or PlaNet's episode cycle (:func:`reverie.replay.cycle.make_schedule`);
    ``rng`` draws the prefill's random actions; ``env_steps`` are summed over the ``N`` envs; ``skipped`` counts
    updates with a non-finite optimiser step; ``evals`` holds ``(env_step, wall_s, mean_return)``; the first
    ``untrained`` evaluations came before any update (never the best); ``wall_before`` is the time before a resume.
    """

    schedule: StepRatio | EpisodeCycle
    rng: np.random.Generator
    clocks: dict[str, Clock]
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    skipped: int = 0
    evals: list[tuple[int, float, float]] = field(default_factory=list)
    last_return: float = math.nan
    untrained: int = 0
    wall_before: float = 0.0
    started: float = field(default_factory=time.time)

    @classmethod
    def create(cls, schedule: StepRatio | EpisodeCycle, seed: int, every: Mapping[str, int]) -> LoopState:
        """A fresh state: ``every`` maps each name of :data:`CLOCKS` to its interval (0: never)."""
        return cls(schedule, np.random.default_rng(seed), {name: Clock(every.get(name, 0)) for name in CLOCKS})

    def best_eval(self) -> tuple[int, float] | None:
        """``(env_step, mean_return)`` of the first evaluation with the highest finite mean after the
        :attr:`untrained` ones (what ``checkpoints/best.pt`` holds); None without one."""
        best = None
        for step, _, mean in self.evals[self.untrained:]:
            if math.isfinite(mean) and (best is None or mean > best[1]):
                best = (int(step), float(mean))
        return best

    def reached(self, target: float | None, in_a_row: int = 1) -> bool:
        """True when the last ``in_a_row`` evaluations of a trained policy all reached ``target``
        (``train.stop_return``, ``train.stop_evals``); False for ``target`` None or fewer evaluations."""
        last = [mean for _, _, mean in self.evals[self.untrained:][-in_a_row:]]
        return target is not None and len(last) == in_a_row and all(mean >= target for mean in last)

    def wall_s(self) -> float:
        """Wall seconds of the run so far, its time before a resume included."""
        return self.wall_before + time.time() - self.started

    def out_of_time(self, max_minutes: float | None) -> bool:
        """True once :meth:`wall_s` has reached ``max_minutes`` (``train.max_minutes``; None: never); checked at
        step boundaries, so a run stops at most one env step (or update) late, then finishes as at ``train.steps``."""
        return max_minutes is not None and self.wall_s() >= 60.0 * max_minutes

    def state_dict(self, frames_per_step: int = 1) -> dict[str, Any]:
        """The checkpoint entries: ``counters`` (with ``frames`` and ``wall_s``), ``ratio``, ``clocks``, ``evals``,
        ``last_return`` and ``rng`` (every global random stream and the loop's generator)."""
        return {"counters": {"env_steps": self.env_steps, "updates": self.updates,
                             "frames": self.env_steps * frames_per_step, "episodes": self.episodes,
                             "skipped_updates": self.skipped, "wall_s": self.wall_s(),
                             "untrained_evals": self.untrained},
                "ratio": self.schedule.state_dict(), "clocks": {name: c.last for name, c in self.clocks.items()},
                "evals": list(self.evals), "last_return": self.last_return, "rng": rng_state(self.rng)}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the wall clock continues from its ``wall_s``."""
        c = saved["counters"]
        self.env_steps, self.updates, self.episodes, self.skipped = (c["env_steps"], c["updates"], c["episodes"],
                                                                     c["skipped_updates"])
        self.wall_before, self.started = c["wall_s"], time.time()
        self.untrained = int(c.get("untrained_evals", 0))  # checkpoints before this count: every evaluation counts
        self.schedule.load_state_dict(saved["ratio"])
        for name, clock in self.clocks.items():
            clock.last = saved["clocks"][name]
        self.evals, self.last_return = [tuple(e) for e in saved["evals"]], saved["last_return"]
        set_rng_state(saved["rng"], self.rng)
