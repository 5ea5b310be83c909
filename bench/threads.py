"""`make train`'s first updates under the default thread choice, threads=1 and threads=2, on a quiet machine and
with one core busy (issue 47: the default must be within 10% of the best of the three in both cases).

    .venv/bin/python bench/threads.py                     # 500 updates, quiet and busy, 1 round
    .venv/bin/python bench/threads.py --updates 100 --rounds 2 --load quiet busy
    .venv/bin/python bench/threads.py --load busy --settings default threads=1 --rounds 2

Each trial runs ``python -m reverie train`` with make train's config (``exp=classic``, CartPole) stopped at
``train.prefill + updates * 8`` env steps (train_ratio 128 at batch 16 x 64: one update per 8 env steps), with
the evaluations, checkpoints, reports and video off (one 1-episode evaluation at the end), and reports the wall
seconds from start to exit, the threads the run chose (its start-up line) and updates/s. ``busy``: a second Python
process spins on one core for the whole trial (not pinned; ``--pin-spinner CPU`` pins it). The settings alternate
within a round (A B C, then C B A), so a drift in the machine's load hits all three; the table gives medians.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {"default": [], "threads=1": ["threads=1"], "threads=2": ["threads=2"]}


def trial(updates: int, extra: list[str]) -> tuple[float, str]:
    """Wall seconds of one run and the threads line it printed."""
    with tempfile.TemporaryDirectory() as tmp:
        steps = 1000 + 8 * updates
        cmd = [sys.executable, "-m", "reverie", "train", f"train.steps={steps}", "train.eval_every=0",
               "train.eval_episodes=1", "train.checkpoint_every=0", "train.report_every=0", "train.video=false",
               "train.progress=false", "logger=none", f"run_dir={tmp}/run", *extra]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - start
    chosen = re.search(r"\[reverie\] threads: (\d+)", out)
    return wall, chosen.group(1) if chosen else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--load", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                        help="which settings to run (e.g. a second round of two that one round left apart)")
    parser.add_argument("--pin-spinner", type=int, default=None, metavar="CPU",
                        help="pin the busy loop to this CPU (less run-to-run spread than letting it migrate)")
    args = parser.parse_args()
    settings = {name: SETTINGS[name] for name in args.settings}
    rows = []
    for load in args.load:
        pin = "" if args.pin_spinner is None else f"import os; os.sched_setaffinity(0, {{{args.pin_spinner}}})\n"
        spinner = (subprocess.Popen([sys.executable, "-c", pin + "while True: pass"]) if load == "busy" else None)
        try:
            walls: dict[str, list[float]] = {name: [] for name in settings}
            chosen: dict[str, str] = {}
            for round_ in range(args.rounds):
                order = list(settings.items())
                for name, extra in order if round_ % 2 == 0 else order[::-1]:  # A B, then B A
                    wall, threads = trial(args.updates, extra)
                    walls[name].append(wall)
                    chosen[name] = threads
                    print(f"{load:5s} {name:9s} threads {threads}: {wall:7.1f} s", flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
        best = min(statistics.median(w) for w in walls.values())
        for name, w in walls.items():
            median = statistics.median(w)
            rows.append((load, name, chosen[name], median, args.updates / median, median / best))
    print(f"\n{Path(sys.executable).name} -m reverie train (exp=classic, CartPole), {args.updates} updates + "
          f"1000 prefill "
          f"steps, {args.rounds} round(s); wall median")
    print(f"{'load':6s}{'setting':11s}{'threads':>8s}{'wall s':>9s}{'upd/s':>8s}{'vs best':>9s}")
    for load, name, threads, median, rate, ratio in rows:
        print(f"{load:6s}{name:11s}{threads:>8s}{median:9.1f}{rate:8.2f}{ratio:9.2f}x")


if __name__ == "__main__":
    main()
