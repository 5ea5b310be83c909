"""Signals and progress of a run for :class:`reverie.loop.session.Session`: Ctrl-C / SIGTERM turned into a clean stop
(in one process after the step in flight, an update never cut in half; with several ranks or offline a flag that
every rank agrees on once per step), and the progress bar."""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

import numpy as np

from reverie.loop.progress import Progress
from reverie.runtime import collectives
from reverie.runtime.signals import SignalFlag, sigterm_as_interrupt


class SessionSignals:
    """The signal and progress steps of :class:`reverie.loop.session.Session`."""

    def update(self, batch: dict[str, np.ndarray] | None = None) -> bool:
        """:meth:`update_once`; in one process a Ctrl-C / SIGTERM that arrives during the update waits for its end
        (then ``KeyboardInterrupt``), so the final checkpoint never holds a half-stepped model or optimiser."""
        if self._flag is not None:  # several ranks, offline: the loop's own flag, checked once per step
            return self.update_once(batch)
        with SignalFlag() as flag:
            diverged = self.update_once(batch)
        if flag.raised:
            raise KeyboardInterrupt
        return diverged

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The block the loop runs in: the progress bar, and Ctrl-C / SIGTERM turned into a clean stop (one process:
        ``KeyboardInterrupt`` after the step in flight; several ranks, and offline runs: a flag checked once per step,
        see :meth:`tick`, so the run stops after the update in flight and its checkpoint resumes exactly).
        """
        self._flag = SignalFlag().install() if self.info.distributed or self.offline else None
        previous = None if self._flag is not None else sigterm_as_interrupt()
        try:
            with Progress(self.steps, enabled=bool(self.cfg.train.progress) and self.info.is_main,
                          description="pretrain" if self.offline else "train", prefill=self.prefill,
                          start_steps=self.step, unit="updates" if self.offline else "steps") as self.progress:
                yield
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
            self.interrupted = True
            self.collected()  # the interrupt came between step_async and the wait
            print(f"\n[reverie] interrupted at {self.where()}: writing metrics and a checkpoint", flush=True)
        finally:
            self.progress = None
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if self._flag is not None:
                self._flag.restore()

    def agree_stop(self, stop: bool) -> bool:
        """The end of :meth:`reverie.loop.session.Session.tick`: whether the run stops (``stop``, or a signal). With
        several ranks (and offline) every rank stops after the same env step (offline: the same update): the stop
        and the signal flag are agreed on here; in one process a signal is a ``KeyboardInterrupt`` instead."""
        if self._flag is not None:
            flags = collectives.agree({"stop": stop, "interrupt": self._flag.raised}, self.info)
            stop, self.interrupted = flags["stop"], flags["interrupt"]
            if self.interrupted:
                print(f"\n[reverie] interrupted at {self.where()}: writing metrics and a checkpoint")
        return stop or self.interrupted

    def show_progress(self) -> None:
        if self.progress is not None:
            self.progress.update(self.step, {"updates": self.loop.updates, "last_return": self.loop.last_return})

    def where(self) -> str:
        """``env step <n>`` (``update <n>`` offline), for messages."""
        return f"{'update' if self.offline else 'env step'} {self.step}"
