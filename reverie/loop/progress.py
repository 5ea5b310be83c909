"""A small training progress display built on ``rich.progress``.

In a terminal it shows one live line::

    train ━━━━━━━━━━━━━━━━━━╺━━━━━━━━━━━━━━━━━━  4,096/10,000  812 steps/s  25.3 updates/s  return 21.0  0:00:05 < 0:00:07

Without a terminal (CI logs, ``> file``, ``| tee``) rich draws nothing live and prints the final line once at
``close``; so that a long run still shows signs of life, this class then also prints one plain status line
every ``plain_interval_s`` seconds (60 by default) and never more often.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as _RichProgress

#: Seconds of history behind the env steps/s and updates/s figures.
RATE_WINDOW_S = 30.0


class Progress:
    """Live progress of a training run: env steps done/total, env steps/s, updates/s, last episode return.

    Args:
        total_steps: env steps the run will take (the bar's 100%).
        enabled: False makes every method a no-op (no output at all).
        console: the ``rich.console.Console`` to draw on; a new one on stdout by default.
        plain_interval_s: without a terminal, the seconds between plain status lines (``None``: none;
            the final line is still printed at ``close``).
        description: the label in front of the bar.
        clock: seconds as a float, for the rates and the plain-line interval (tests pass a fake one).

    Use as a context manager, or call ``close`` at the end::

        with Progress(total_steps=100_000) as progress:
            ...
            progress.update(env_steps, {"updates": agent_updates, "last_return": episode_return})
    """

    def __init__(
        self,
        total_steps: int,
        enabled: bool = True,
        *,
        console: Console | None = None,
        plain_interval_s: float | None = 60.0,
        description: str = "train",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if int(total_steps) <= 0:
            raise ValueError(f"Progress needs total_steps > 0 (env steps of the run), got {total_steps!r}.")
        self.total_steps = int(total_steps)
        self.enabled = bool(enabled)
        self.plain_interval_s = plain_interval_s
        self._steps = 0
        self._updates: int | None = None
        self._last_return: float | None = None
        self._samples: deque[tuple[float, int, int | None]] = deque()
        self._clock = clock
        self._start = clock()
        self._last_plain = self._start
        self._closed = False
        self._progress: _RichProgress | None = None
        if not self.enabled:
            return
        self.console = console if console is not None else Console()
        self._progress = _RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[steps_rate]}"),
            TextColumn("{task.fields[updates_rate]}"),
            TextColumn("{task.fields[last_return]}"),
            TimeElapsedColumn(),
            TextColumn("<"),
            TimeRemainingColumn(),
            console=self.console,
            refresh_per_second=2,
        )
        self._task = self._progress.add_task(description, total=self.total_steps, **self._fields())
        self._progress.start()

    def update(self, env_steps: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Sets the env steps done so far and refreshes the figures.

        Args:
            env_steps: total env steps so far (not an increment).
            metrics: may hold ``"updates"`` (total gradient updates so far) and ``"last_return"`` (return of
                the most recently finished episode, or None). Missing keys keep their previous values;
                other keys are ignored.
        """
        if not self.enabled or self._closed:
            return
        metrics = metrics or {}
        self._steps = int(env_steps)
        if metrics.get("updates") is not None:
            self._updates = int(metrics["updates"])
        if metrics.get("last_return") is not None:
            self._last_return = float(metrics["last_return"])
        now = self._clock()
        self._samples.append((now, self._steps, self._updates))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        assert self._progress is not None
        self._progress.update(self._task, completed=self._steps, **self._fields())
        if (not self.console.is_terminal and self.plain_interval_s is not None
                and now - self._last_plain >= self.plain_interval_s):
            self._last_plain = now
            self.console.print(self.status_line(), highlight=False, soft_wrap=True)

    def rates(self) -> tuple[float | None, float | None]:
        """(env steps/s, updates/s) over the last ``RATE_WINDOW_S`` seconds (at least the last two updates).

        None before two updates; updates/s is None while ``"updates"`` was never given.
        """
        if len(self._samples) < 2:
            return None, None
        (t0, s0, u0), (t1, s1, u1) = self._samples[0], self._samples[-1]
        dt = t1 - t0
        if dt <= 0:
            return None, None
        updates_rate = (u1 - u0) / dt if u0 is not None and u1 is not None else None
        return (s1 - s0) / dt, updates_rate

    def status_line(self) -> str:
        """One plain line: ``train 4,096/10,000 (41%) | 812 steps/s | 25.3 updates/s | return 21.0 | 0:00:05``."""
        fields = self._fields()
        elapsed = int(self._clock() - self._start)
        clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
        percent = 100.0 * self._steps / self.total_steps
        parts = [f"{self._steps:,}/{self.total_steps:,} ({percent:.0f}%)", fields["steps_rate"],
                 fields["updates_rate"], fields["last_return"], clock]
        description = self._progress.tasks[0].description if self._progress is not None else "train"
        return f"{description} " + " | ".join(parts)

    def close(self) -> None:
        """Stops the live display (without a terminal, rich prints the final line here). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._progress.stop()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fields(self) -> dict[str, str]:
        steps_rate, updates_rate = self.rates()
        return {
            "steps_rate": "- steps/s" if steps_rate is None else f"{steps_rate:,.0f} steps/s",
            "updates_rate": "- updates/s" if updates_rate is None else f"{updates_rate:,.1f} updates/s",
            "last_return": "return -" if self._last_return is None else f"return {self._last_return:.1f}",
        }


__all__ = ["Progress"]
