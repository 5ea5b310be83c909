"""Resident memory of a whole `reverie train` run over time: the peak, and what the run was doing when it rose.

    .venv/bin/python bench/run_memory.py                                   # make train's run, 5,000 env steps
    .venv/bin/python bench/run_memory.py -- train.steps=30000 threads=1    # the whole default run
    .venv/bin/python bench/run_memory.py -- cpu_keep_freed_memory=false    # one setting against the default

Runs ``python -m reverie train train.progress=false run_dir=<tmp> [overrides]`` and reads the process's ``VmRSS``
from ``/proc/<pid>/status`` every ``--every`` seconds, with its output lines as they come (each sample is labelled
with the last line the run printed and the last metrics row's env step). Prints the peak (``VmHWM``, the kernel's
own high-water mark, read just before the process exits), the RSS after start-up, and the samples where RSS rose
by more than ``--jump`` MiB, so the phase that costs the memory (an update, an evaluation, a report, a checkpoint,
the final video) can be read off. Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def last_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--jump", type=float, default=50.0, help="MiB of rise between samples worth printing")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for reverie train (after --)")
    args = parser.parse_args()
    overrides = args.overrides or ["train.steps=5000"]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "reverie", "train", "train.progress=false", f"run_dir={run_dir}", *overrides]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last_line = ["(start)"]

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                last_line[0] = line.strip()[:100]

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        start = time.monotonic()
        samples: list[tuple[float, int, int, str]] = []
        hwm = 0
        while proc.poll() is None:
            rss = status_kib(proc.pid, "VmRSS")
            hwm = max(hwm, status_kib(proc.pid, "VmHWM") or 0)
            if rss is not None:
                samples.append((time.monotonic() - start, rss, last_step(run_dir), last_line[0]))
            time.sleep(args.every)
        reader.join(timeout=5)
    print(f"{' '.join(cmd[3:])}")
    print(f"exit {proc.returncode}, {samples[-1][0] if samples else 0:.0f} s, {len(samples)} samples")
    if not samples:
        return
    peak = max(samples, key=lambda s: s[1])
    settled = next((s for s in samples if s[3].startswith("[reverie] ") and " env(s) x " in s[3]), samples[0])
    print(f"peak VmRSS sampled {peak[1] / 1024:.0f} MiB at {peak[0]:.0f} s (env step {peak[2]}); VmHWM "
          f"{hwm / 1024:.0f} MiB; after start-up {settled[1] / 1024:.0f} MiB; "
          f"at the end {samples[-1][1] / 1024:.0f} MiB")
    print(f"{'t s':>7s} {'RSS MiB':>8s} {'step':>7s}  last line")
    previous = samples[0][1]
    for t, rss, step, line in samples:
        if (rss - previous) / 1024 > args.jump or (t, rss) == peak[:2]:
            print(f"{t:7.1f} {rss / 1024:8.0f} {step:7d}  {line}")
        previous = rss


if __name__ == "__main__":
    main()
