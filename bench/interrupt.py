"""Ctrl-C cost of a pixel run (issue 20): seconds from SIGINT to exit, and the bytes of the checkpoint written.

    .venv/bin/python bench/interrupt.py                        # DMC cartpole_swingup from pixels, 1,000 env steps
    .venv/bin/python bench/interrupt.py --steps 1000 -- exp=atari100k env.task=pong

Starts ``python -m reverie train env=dmc_vision env.task=cartpole_swingup train.prefill=<large>
train.log_every=<steps> run_dir=<tmp> [extra overrides]`` (random actions only: no update ever runs), waits
for the first metrics row (written at ``--steps`` env steps), sends SIGINT, and prints the seconds until the
process exits (wall, and the CPU seconds it spent meanwhile: less sensitive to other jobs on the core), its exit
code and the size of ``checkpoints/`` (each file). The run directory is removed unless
``--keep``. Which reverie runs is the one ``python -m reverie`` imports (set PYTHONPATH to compare trees).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a running process (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="env steps before the SIGINT (default 1000)")
    parser.add_argument("--dir", default=None, help="parent of the run directory (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for each phase")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="interrupt_", dir=args.dir))
    run_dir = parent / "run"
    command = [sys.executable, "-m", "reverie", "train", "env=dmc_vision", "env.task=cartpole_swingup",
               f"train.prefill={100 * args.steps}", f"train.steps={1000 * args.steps}",
               f"train.log_every={args.steps}", "train.eval_every=0", "train.progress=false",
               f"run_dir={run_dir}", *args.overrides]
    print("command:", " ".join(command[1:]), flush=True)
    # SIGINT back to its default in the child: started from a background job (`cmd &` without job control) it
    # would inherit SIG_IGN, and Python then ignores Ctrl-C altogether
    proc = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = run_dir / "metrics.jsonl"
    start = time.monotonic()
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        if proc.poll() is not None or time.monotonic() - start > args.timeout:
            print(proc.communicate()[0].decode()[-3000:])
            raise SystemExit("the run ended or timed out before its first metrics row")
        time.sleep(0.05)
    reached = time.monotonic() - start
    cpu_before = _cpu_seconds(proc.pid)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=args.timeout)
    took = time.monotonic() - sent
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    files = sorted(p for p in (run_dir / "checkpoints").rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    print(out.decode()[-1500:])
    print(f"reached {args.steps} env steps after {reached:.1f} s; SIGINT -> exit {proc.returncode} in {took:.2f} s "
          f"wall, {cpu:.2f} s CPU (user + system)")
    for p in files:
        print(f"  {p.relative_to(run_dir)}: {p.stat().st_size:,} bytes")
    print(f"checkpoints/ total: {total:,} bytes ({total / 2**20:.1f} MiB)")
    if not args.keep:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
