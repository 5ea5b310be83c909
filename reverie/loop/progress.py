"""A small training progress display built on ``rich.progress``: one live line that fits the terminal::

    train ━━━━━━━━━━╺━━━━━━━━━ 4,096/30,000 812 steps/s 25.3 upd/s ret 21.0 0:00:05 eta 0:01:07

The time left comes from the current phase's speed (:func:`remaining_s`): the prefill's (random actions, fast),
then learning's from the first update on (that one compiles and allocates, possibly for minutes, so its status
shows meanwhile). Without a terminal (CI logs, ``| tee``) rich draws nothing live, so a plain status line is
printed every ``plain_interval_s`` seconds and whenever the status changes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import ProgressColumn
from rich.progress import Progress as _RichProgress
from rich.text import Text

#: Seconds of history behind the env steps/s and updates/s figures.
RATE_WINDOW_S = 30.0
#: The learning phase's estimate: "estimating" for its first ETA_WARMUP_S seconds, then from the speed over its
#: last ETA_WINDOW_S seconds (a moving window follows a run that speeds up or slows down).
ETA_WARMUP_S, ETA_WINDOW_S = 30.0, 300.0
BAR_MIN, BAR_MAX = 10, 40  # bar width bounds, in columns


def clock_text(seconds: float | None) -> str:
    """``H:MM:SS`` (``-:--:--`` for None)."""
    if seconds is None:
        return "-:--:--"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def remaining_s(steps: int, target: int, since: tuple[float, int] | None, now: float) -> float | None:
    """Seconds until ``steps`` reaches ``target`` at the speed since ``since`` = ``(time, steps)``, the start of
    the current phase: ``(target - steps) * (now - t0) / (steps - s0)``; None before any step in the phase."""
    if since is None:
        return None
    t0, s0 = since
    if steps <= s0 or now <= t0:
        return None
    return max(target - steps, 0) * (now - t0) / (steps - s0)


def format_line(width: int, count: str, elapsed: str, optional: list[tuple[str, str]], fraction: float) -> str:
    """One progress line of at most ``width`` characters, e.g. ``"train ━━━━╺━━━ 4,096/30,000 0:00:05 eta 0:01:07"``.

    ``count`` and ``elapsed`` are always shown; ``optional`` holds ``(name, text)`` in priority order, the last
    dropped first until the line fits (empty texts skipped; ``"bar"`` takes the room left, ``BAR_MIN`` to
    ``BAR_MAX`` columns, filled to ``fraction``). On the line: label, bar, count, steps/s, upd/s, ret, elapsed,
    eta or status.
    """
    order = ["label", "bar", "count", "steps/s", "upd/s", "ret", "elapsed", "eta", "status"]
    ranked = [(name, text) for name, text in optional if text or name == "bar"]

    def line(chosen: dict[str, str], bar: int) -> str:
        texts = {**chosen, "count": count, "elapsed": elapsed}
        if bar:
            done = int(round(bar * min(max(fraction, 0.0), 1.0)))
            texts["bar"] = "━" * done + ("╺" if done < bar else "") + "━" * max(bar - done - 1, 0)
        return " ".join(texts[name] for name in order if name in texts and texts[name])

    for keep in range(len(ranked), -1, -1):
        chosen = dict(ranked[:keep])
        bar = BAR_MIN if "bar" in chosen else 0
        text = line(chosen, bar)
        if len(text) <= width:
            return line(chosen, min(BAR_MAX, BAR_MIN + width - len(text))) if bar else text
    return line({}, 0)[:width]


class _LineColumn(ProgressColumn):
    """rich column that renders the owner's whole line at the console's width."""

    def __init__(self, owner: Progress):
        super().__init__()
        self.owner = owner

    def render(self, task: Any) -> Text:
        return Text(self.owner.line(self.owner.console.width - 1), no_wrap=True, overflow="crop")


class Progress:
    """Live progress of a training run: env steps done/total, env steps/s, updates/s, last episode return, the
    elapsed time and an estimate of the time left. A context manager (or call ``close``).

    ``enabled=False`` makes every method a no-op; ``plain_interval_s`` is the seconds between plain lines without a
    terminal (None: only the final one); ``clock`` returns seconds (tests pass a fake); env steps below ``prefill``
    are the prefill phase; ``start_steps`` were done before (a resumed run); ``unit`` is ``"steps"`` or ``"updates"``
    (``reverie pretrain``: no env steps, no second updates rate). Raises ValueError when ``total_steps`` <= 0.
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
        prefill: int = 0,
        start_steps: int = 0,
        unit: str = "steps",
    ) -> None:
        if int(total_steps) <= 0:
            raise ValueError(f"Progress needs total_steps > 0 (env steps of the run), got {total_steps!r}.")
        self.total_steps = int(total_steps)
        self.prefill = int(prefill)
        self.enabled = bool(enabled)
        self.plain_interval_s = plain_interval_s
        self.description = description
        self.unit = unit
        self._steps = int(start_steps)
        self._updates: int | None = None
        self._last_return: float | None = None
        self._status: str | None = None
        self._samples: deque[tuple[float, int, int | None]] = deque()
        self._clock = clock
        self._start = clock()
        self._phase_start: tuple[float, int] | None = (self._start, self._steps)  # (time, steps) of this phase
        self._window: deque[tuple[float, int]] = deque([self._phase_start])  # this phase's last ETA_WINDOW_S
        self._learning = self._steps >= self.prefill
        self._last_plain = self._start
        self._closed = False
        self._progress: _RichProgress | None = None
        if not self.enabled:
            return
        self.console = console if console is not None else Console()
        self._progress = _RichProgress(_LineColumn(self), console=self.console, refresh_per_second=2)
        self._task = self._progress.add_task(description, total=self.total_steps)
        self._progress.start()

    def update(self, env_steps: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Set the total env steps so far (not an increment); ``metrics`` may hold ``"updates"`` (total so far) and
        ``"last_return"`` (None or NaN before the first episode). Missing keys keep their previous values."""
        if not self.enabled or self._closed:
            return
        metrics = metrics or {}
        now = self._clock()
        if not self._learning and int(env_steps) >= self.prefill:  # prefill done: the learning phase starts
            self._learning = True
            self._new_phase(now, int(env_steps))
        self._steps = int(env_steps)
        self._window.append((now, self._steps))
        while len(self._window) > 2 and now - self._window[1][0] >= ETA_WINDOW_S:
            self._window.popleft()
        if metrics.get("updates") is not None:
            self._updates = int(metrics["updates"])
        if metrics.get("last_return") is not None and not math.isnan(float(metrics["last_return"])):
            self._last_return = float(metrics["last_return"])  # NaN: no episode has finished yet
        self._samples.append((now, self._steps, self._updates))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        assert self._progress is not None
        self._progress.update(self._task, completed=self._steps)
        if now - self._last_plain >= (self.plain_interval_s if self.plain_interval_s is not None else float("inf")):
            self._plain(now)

    def status(self, text: str | None, restart: bool = True) -> None:
        """Show ``text`` in place of the estimate until ``status(None)``, which restarts the phase's clock when
        ``restart`` so a one-off cost (the first update) does not slow the estimate; a recurring one (an evaluation)
        passes ``restart=False``. Without a terminal each new status is printed (``restart=False`` ones at most every
        ``plain_interval_s``)."""
        if not self.enabled or self._closed:
            return
        now = self._clock()
        if text is None and self._status is not None and restart:
            self._new_phase(now, self._steps)
        self._status = text
        assert self._progress is not None
        self._progress.refresh()
        interval = self.plain_interval_s if self.plain_interval_s is not None else float("inf")
        if text is not None and (restart or now - self._last_plain >= interval):
            self._plain(now)

    def rates(self) -> tuple[float | None, float | None]:
        """(env steps/s, updates/s) over the last ``RATE_WINDOW_S`` seconds (at least the last two updates); None
        before two updates, updates/s None while ``"updates"`` was never given."""
        if len(self._samples) < 2:
            return None, None
        (t0, s0, u0), (t1, s1, u1) = self._samples[0], self._samples[-1]
        dt = t1 - t0
        if dt <= 0:
            return None, None
        updates_rate = (u1 - u0) / dt if u0 is not None and u1 is not None else None
        return (s1 - s0) / dt, updates_rate

    def _new_phase(self, now: float, steps: int) -> None:
        self._phase_start = (now, steps)
        self._window = deque([self._phase_start])

    def remaining(self) -> tuple[str, float | None]:
        """``(label, seconds)``: ``("prefill eta", s)`` during the prefill, else ``("eta", s)`` to the end of the run
        (None during the phase's first ``ETA_WARMUP_S``)."""
        now = self._clock()
        if self._learning:
            assert self._phase_start is not None
            if now - self._phase_start[0] < ETA_WARMUP_S:
                return "eta", None
            return "eta", remaining_s(self._steps, self.total_steps, self._window[0], now)
        return "prefill eta", remaining_s(self._steps, self.prefill, self._phase_start, now)

    def _eta_text(self) -> str:
        label, left = self.remaining()
        if left is None and self._learning:
            return f"{label} estimating"
        return f"{label} {clock_text(left)}"

    def line(self, width: int) -> str:
        """The live line at ``width`` columns (:func:`format_line`)."""
        steps_rate, updates_rate = self.rates()
        last = self._status if self._status is not None else self._eta_text()
        optional = [("status" if self._status is not None else "eta", last),
                    ("steps/s", "" if steps_rate is None else self._rate_text(steps_rate, short=True)),
                    ("ret", "" if self._last_return is None else f"ret {self._last_return:.1f}"),
                    ("bar", ""),
                    ("upd/s", "" if updates_rate is None or self.unit == "updates" else f"{updates_rate:,.1f} upd/s"),
                    ("label", self.description)]
        return format_line(width, f"{self._steps:,}/{self.total_steps:,}", clock_text(self._clock() - self._start),
                           optional, self._steps / self.total_steps)

    def status_line(self) -> str:
        """One plain line: ``train 4,096/10,000 (41%) | 812 steps/s | 25.3 updates/s | return 21.0 | 0:00:05 |
        eta 0:00:07`` (the status, when one is set, in place of the estimate)."""
        steps_rate, updates_rate = self.rates()
        percent = 100.0 * self._steps / self.total_steps
        parts = [f"{self._steps:,}/{self.total_steps:,} ({percent:.0f}%)",
                 f"- {self.unit}/s" if steps_rate is None else self._rate_text(steps_rate, short=False)]
        if self.unit != "updates":
            parts.append("- updates/s" if updates_rate is None else f"{updates_rate:,.1f} updates/s")
        parts += ["return -" if self._last_return is None else f"return {self._last_return:.1f}",
                  clock_text(self._clock() - self._start),
                  self._status if self._status is not None else self._eta_text()]
        return f"{self.description} " + " | ".join(parts)

    def _rate_text(self, rate: float, short: bool) -> str:
        if self.unit == "updates":
            return f"{rate:,.1f} {'upd' if short else 'updates'}/s"
        return f"{rate:,.0f} steps/s"

    def close(self) -> None:
        """Stops the live display (without a terminal, rich prints the final line here). Idempotent."""
        if self._closed:
            return
        self._status = None
        self._closed = True
        if self._progress is not None:
            self._progress.stop()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _plain(self, now: float) -> None:
        """Without a terminal: print the plain status line."""
        if not self.console.is_terminal:
            self._last_plain = now
            self.console.print(self.status_line(), highlight=False, soft_wrap=True)


__all__ = ["Progress", "format_line", "remaining_s"]
