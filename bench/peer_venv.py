"""Throwaway venvs for peer libraries that the side-by-side benchmarks run (bench/vs_sheeprl.py, bench/vs_jax.py).

Peers are installed OUTSIDE the repository (default under ~/.cache/reverie/), never into reverie's own venv.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
