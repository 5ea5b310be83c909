"""train.control_hz: how well the collector thread keeps its rate while the learner trains.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/control_rate.py                  # xs, 20 Hz, 5 ms sleep
    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/control_rate.py --size debug --hz 50 --steps 400

Runs ``reverie train`` once on CartPole-v1 made slow by :class:`reverie.envs.testing.Sleep` (a stand-in for a
robot whose step takes ``--sleep`` seconds), one env, with ``train.control_hz=--hz``, and records the start time
of every collector step. Prints, over the steps taken while the learner was training (after prefill): the asked
and the median period, the 90th and 99th percentile periods, the share of late steps (``collect/late_steps``:
started more than 10% of a period after their deadline), the updates done against those the train_ratio owes
(they must be equal at the end), and the learner's rate. The periods measure the scheduling of this process's
threads, so a busy machine (other jobs on the cores) shows up directly in the percentiles and the late share.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from reverie.cli import main as reverie_main
from reverie.loop.collector import Collector

train_module = importlib.import_module("reverie.train")
MADE: list[Collector] = []


class Recording(Collector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        MADE.append(self)


train_module.Collector = Recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="xs")
    parser.add_argument("--hz", type=float, default=20.0)
    parser.add_argument("--sleep", type=float, default=0.005, help="seconds added to every env step")
    parser.add_argument("--steps", type=int, default=300, help="env steps (one env)")
    parser.add_argument("--prefill", type=int, default=100)
    parser.add_argument("--train-ratio", type=float, default=512)
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval (seconds) for the whole run; Python's default is 0.005")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        overrides = [f"size={args.size}", "env.num_envs=1", "threads=1", "train.progress=false", "train.video=false",
                     "logger=none", f"train.control_hz={args.hz}", f"train.steps={args.steps}",
                     f"train.prefill={args.prefill}", f"agent.train_ratio={args.train_ratio}", "train.eval_every=0",
                     "train.eval_episodes=1", "train.report_every=0", f"train.log_every={args.steps}",
                     f"train.checkpoint_every={args.steps}",
                     f"env.wrappers=[{{_target_: reverie.envs.testing.Sleep, seconds: {args.sleep}}}]"]
        assert reverie_main(["train", f"run_dir={run_dir}", *overrides]) == 0
        summary = json.loads((run_dir / "summary.json").read_text())
        agent = OmegaConf.load(run_dir / "config.yaml").agent
    collector = MADE[-1]
    starts = np.asarray(collector.step_starts)[args.prefill:]  # learning phase only
    periods = np.diff(starts) * 1e3  # ms
    late = sum(b - a > (1 + collector.late_tolerance) * collector.period for a, b in zip(starts, starts[1:]))
    owed = int(collector.ratio_steps * args.train_ratio / (agent.batch_size * agent.batch_length))
    print(f"size {args.size}, {args.hz:g} Hz (period {1e3 / args.hz:.1f} ms), env step sleep {args.sleep * 1e3:g} ms, "
          f"switch interval {sys.getswitchinterval() * 1e3:g} ms, {len(starts)} steps while learning")
    print(f"period ms: median {np.median(periods):.1f}, p90 {np.percentile(periods, 90):.1f}, "
          f"p99 {np.percentile(periods, 99):.1f}, max {periods.max():.1f}; periods over 110%: {late} "
          f"({100 * late / max(len(periods), 1):.1f}%); collect/late_steps (whole run) {collector.late_steps}")
    print(f"updates {summary['updates']} (owed by the ratio: {owed}), wall {summary['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
