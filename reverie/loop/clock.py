"""Clocks of the training loop: log, eval, checkpoint and report every so many env steps (or updates)."""

from __future__ import annotations


class Clock:
    """Fires when ``step`` crosses a multiple of ``every`` (never when ``every <= 0``).

    ``last`` is the step it last fired at (saved in checkpoints by :class:`reverie.loop.state.LoopState`), so a
    resumed run fires at the same steps as one that never stopped.
    """

    def __init__(self, every: int):
        self.every, self.last = int(every or 0), 0

    def due(self, step: int) -> bool:
        """Whether :meth:`__call__` would fire at ``step`` (without firing)."""
        return self.every > 0 and step // self.every != self.last // self.every

    def __call__(self, step: int) -> bool:
        """Fire (True, and remember ``step``) when ``step`` crossed a multiple of ``every`` since the last firing."""
        if not self.due(step):
            return False
        self.last = step
        return True
