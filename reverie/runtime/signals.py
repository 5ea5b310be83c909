"""Ctrl-C and SIGTERM during training: a run that is stopped still writes its metrics and a checkpoint."""

from __future__ import annotations

import signal
import threading
from typing import Any

class SignalFlag:
    """While active (main thread only), SIGINT and SIGTERM set :attr:`raised` instead of raising: an exception
    mid-update would leave other ranks waiting in a collective."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.raised = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        self.raised = True

    def install(self) -> SignalFlag:
        """Put the flag's handler in place (main thread only); :meth:`restore` puts the previous ones back."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def __enter__(self) -> SignalFlag:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.restore()


def sigterm_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt (main thread only) so a killed run still saves; returns the old handler
    (None where nothing was installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
