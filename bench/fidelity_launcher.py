"""Runs one whole official DreamerV3 training run without changing its code (started by bench/fidelity.py).

Runs INSIDE the official code's throwaway JAX venv and imports only the official packages from ``--source``, never
reverie. Two things are switched off by replacing classes before the run starts, so that the run needs no
TensorFlow and prints no per-step report:

* the TensorBoard output of the official logger (``TensorBoardOutput``; the 2023 code writes its summaries through
  TensorFlow, which the venv does not install): a no-op output takes its place. The JSONL outputs that hold the
  episode returns (``scores.jsonl``, ``metrics.jsonl``) are untouched.

and one output is added to the official logger: ``episodes.jsonl`` in the logdir, one line per finished episode
(``{"step": frames, "episode/score", "episode/length", "time": unix seconds}``). The official JSONL output keeps one
value per name and step, so of several envs that end an episode at the same step (DMC's fixed 500-step episodes:
every env at once) its ``scores.jsonl`` keeps only the last one; ``episodes.jsonl`` keeps them all.

Then it calls the official entry point with the flags after ``--``:

* ``--version 2023``: ``dreamerv3/train.py`` ``main(argv)`` of danijar/dreamerv3 at 8fa35f8;
* ``--version 2025``: ``dreamerv3/main.py`` ``main(argv)`` at e3f0224.

    <venv>/bin/python bench/fidelity_launcher.py --source <checkout> --version 2023 -- --logdir <dir> ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


class _NoOutput:
    """Takes the place of the official TensorBoard output: accepts every write, keeps nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, summaries):
        pass

    def wait(self):
        pass


class _EpisodeLines:
    """A logger output that writes every ``episode/score`` summary as its own line of ``<logdir>/episodes.jsonl``,
    with the ``episode/length`` added just before it (the official loops add an episode's length, then its score)."""

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        self._path = os.path.join(logdir, "episodes.jsonl")

    def __call__(self, summaries):
        lines, length = [], None
        for step, name, value in summaries:
            if name == "episode/length":
                length = int(value)
            elif name == "episode/score":
                lines.append(json.dumps({"step": int(step), "episode/score": float(value), "episode/length": length,
                                         "time": round(time.time(), 1)}))
                length = None
        if lines:
            with open(self._path, "a") as f:
                f.write("\n".join(lines) + "\n")

    def wait(self):
        pass


def _add_episode_lines(logger_cls, logdir: str) -> None:
    """Every official Logger built from now on also writes :class:`_EpisodeLines`."""
    original = logger_cls.__init__

    def init(self, step, outputs, multiplier=1):
        original(self, step, [*outputs, _EpisodeLines(logdir)], multiplier)

    logger_cls.__init__ = init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="checkout of danijar/dreamerv3 at the version's commit")
    parser.add_argument("--version", required=True, choices=["2023", "2025"])
    parser.add_argument("flags", nargs="*", help="the official script's flags (after --)")
    args = parser.parse_args()
    source = os.path.abspath(args.source)
    logdir = args.flags[args.flags.index("--logdir") + 1]
    if args.version == "2023":
        sys.path.insert(0, os.path.join(source, "dreamerv3"))  # its `embodied` package lives inside dreamerv3/
        sys.path.insert(0, source)
        import embodied

        embodied.logger.TensorBoardOutput = _NoOutput
        _add_episode_lines(embodied.Logger, logdir)
        from dreamerv3 import train as entry
    else:
        sys.path.insert(0, source)
        import elements

        elements.logger.TensorBoardOutput = _NoOutput
        _add_episode_lines(elements.Logger, logdir)
        from dreamerv3 import main as entry
    entry.main(args.flags)


if __name__ == "__main__":
    main()
