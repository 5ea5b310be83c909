"""Throwaway venvs for peer libraries that the side-by-side benchmarks run (bench/vs_sheeprl.py, bench/vs_jax.py).

Peers are installed OUTSIDE the repository (default under ~/.cache/reverie/), never into reverie's own venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Mapping

ROOT = Path(__file__).resolve().parent.parent  # the repository root


def outside_repo(path: Path, flag: str) -> Path:
    """``path`` with ``~`` expanded and resolved.

    Raises:
        ValueError: ``path`` lies inside this repository (a peer's venv or source must stay outside it).
    """
    path = Path(os.path.expanduser(path)).resolve()
    if ROOT in (path, *path.parents):
        raise ValueError(f"{flag} {path} is inside the repository {ROOT}; pass a path outside it "
                         f"(e.g. under ~/.cache/reverie/)")
    return path


def run_steps(steps: list[list[str]], tag: str) -> None:
    """Runs each install command in turn, printing it with ``[tag]``.

    Raises:
        RuntimeError: a command failed (the tail of its output is printed first).
    """
    for cmd in steps:
        print(f"[{tag}] $ {' '.join(cmd)}", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            raise RuntimeError(f"{' '.join(cmd)} failed with exit code {done.returncode}")


def timed_peer_run(command: Callable[[Path, Path], list[str]], env: Mapping[str, str], timeout_s: float, what: str,
                   prefix: str, hint: str = "") -> tuple[list[float], list[float]]:
    """Runs a peer's timing launcher (``command(folder, out)``: its argv) in a fresh temporary folder, which is its
    working directory (the peer's logs go there), and reads the ``times.json`` it writes to ``out``.

    Returns:
        ``(wall seconds, CPU seconds)`` per timed update.

    Raises:
        RuntimeError: the launcher wrote no timings (its output's tail is printed), or stopped before a timed update
            (``hint`` is appended to that message).
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        out = Path(tmp) / "times.json"
        done = subprocess.run(command(Path(tmp), out), cwd=tmp, env=dict(env), capture_output=True, text=True,
                              timeout=timeout_s)
        if not out.exists():
            print(done.stdout[-3000:], done.stderr[-3000:])
            raise RuntimeError(f"{what} wrote no timings (exit code {done.returncode})")
        result = json.loads(out.read_text())
    if not result["times_s"]:
        raise RuntimeError(f"{what} stopped ({result['stopped']}) before a timed update{hint}")
    return result["times_s"], result["cpu_times_s"]
