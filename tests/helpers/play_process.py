"""Shared by the play tests: `reverie play RUN --port 0` in a child process, and the address it prints."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class PlayProcess:
    """Starts ``python -m reverie play <run_dir> --port 0`` (this checkout first on ``PYTHONPATH``) and collects its
    output lines on a thread; :meth:`address` waits for the ``http://`` line it prints once it listens."""

    def __init__(self, run_dir: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-m", "reverie", "play", str(run_dir), "--port", "0"],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if "http://" in line:
                self._listening.set()

    def address(self, timeout_s: float = 180) -> str | None:
        """``http://host:port/``, or None when nothing was printed within ``timeout_s``."""
        if not self._listening.wait(timeout_s):
            return None
        line = next(line for line in self.lines if "http://" in line)
        return line[line.index("http://"):].split()[0]

    def output(self) -> str:
        """Everything printed so far; after :meth:`close`, all of it."""
        return "".join(self.lines)

    def close(self) -> None:
        """Kill the process if it still runs, and wait for the last output line."""
        self.process.kill()
        self.process.wait(30)
        self._reader.join(10)
