"""Shared by the interrupt tests: `reverie train` in a child process, signalled once it has logged some rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def interrupt_training(overrides: list[str], metrics: Path, rows: int, signum: int,
                       timeout_s: float) -> tuple[int, str]:
    """Start ``python -m reverie train <overrides>`` (``OMP_NUM_THREADS=1``), wait until ``metrics`` (a
    metrics.jsonl) has ``rows`` lines or ``timeout_s`` passed, send ``signum``, and wait up to ``timeout_s`` for the
    exit. Returns ``(returncode, stdout and stderr)``."""
    # SIGINT at its default in the child: a test run started as a background job (`pytest &`) hands SIG_IGN down,
    # and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "reverie", "train", *overrides],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + timeout_s
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= rows):
        time.sleep(0.2)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out.decode()
