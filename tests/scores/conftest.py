"""Writers of small synthetic score files in both official formats and of fake reverie runs."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

REAL_REFERENCE_DIR = Path(os.environ.get("REVERIE_REFERENCE_SCORES") or "/nonexistent")
"""The official files, where present (tests/scores/test_reference_files.py skips without them)."""


def write_official(path: Path, runs: list[dict]) -> Path:
    """Gzipped JSON list of runs, as danijar/dreamerv3 ships them (NaN written as the bare token NaN)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(runs, f)
    return path


def current_run(task: str, seed: int, xs: list[int], ys: list[float], method: str = "dreamerv3") -> dict:
    """Current format: integer seed, one (frames, return) pair per finished episode."""
    return {"task": task, "method": method, "seed": seed, "xs": xs, "ys": ys}


def binned_run(task: str, seed: int, ys: list[float], width: float = 10_000.0, start: float = 10_000.0) -> dict:
    """2023 format: string seed, xs on a regular grid of bins starting at ``start``."""
    return {"task": task, "method": "dreamerv3", "seed": str(seed),
            "xs": [start + i * width for i in range(len(ys))], "ys": ys}


def make_run(root: Path, name: str, records: list[tuple[int, float]], env_id: str = "CartPole-v1",
             action_repeat: int = 1, seed: int = 0, mode: str = "train", frames: bool = True,
             env: dict | None = None, metadata: dict | None = None) -> Path:
    """A reverie run directory: ``config.yaml`` and ``scores.jsonl`` with ``(step, return)`` episodes.

    ``env`` replaces the config's env section (default ``{id: env_id, action_repeat}``); ``metadata`` is written
    as ``env_metadata.json`` (none by default: the suite then comes from ``config.yaml``).
    """
    run = root / name
    run.mkdir(parents=True)
    env = env if env is not None else {"id": env_id, "action_repeat": action_repeat}
    (run / "config.yaml").write_text(json.dumps({"exp_name": "test", "seed": seed, "env": env}), encoding="utf-8")
    if metadata is not None:
        (run / "env_metadata.json").write_text(json.dumps(metadata), encoding="utf-8")
    with open(run / "scores.jsonl", "w", encoding="utf-8") as f:
        for step, ret in records:
            rec = {"step": step, "return": ret, "length": 10, "mode": mode}
            if frames:
                rec["frames"] = step * action_repeat
            f.write(json.dumps(rec) + "\n")
    return run


def make_dmc_run(root: Path, name: str, seed: int, evals: list[tuple[int, list[float]]],
                 train: list[tuple[int, float]] = (), task: str = "cartpole_swingup") -> Path:
    """A DMC proprio run (action repeat 2, ``env_metadata.json`` as training writes it): ``evals`` are
    ``(frames, [returns of that evaluation's episodes])``, ``train`` are ``(frames, return)`` training episodes."""
    env = {"suite": "dmc", "task": task, "action_repeat": 2, "image": False, "proprio": True}
    metadata = {"suite": "dmc", "task": task, "action_repeat": 2, "frames_per_agent_step": 2,
                "observations": ["vector"], "num_envs": 4}
    run = make_run(root, name, [], seed=seed, env=env, metadata=metadata)
    rows = [(f, r, "train") for f, r in train] + [(f, r, "eval") for f, rs in evals for r in rs]
    with open(run / "scores.jsonl", "w", encoding="utf-8") as f:
        for frames, ret, mode in sorted(rows):
            f.write(json.dumps({"step": frames // 2, "frames": frames, "return": ret, "length": 500,
                                "mode": mode}) + "\n")
    return run


@pytest.fixture
def reference_dir(tmp_path: Path) -> Path:
    """A reference folder with both formats for atari100k on Pong and Boxing, 2 seeds each.

    Current format (episodes; window [390k, 400k] frames):
      pong  seed 0: ends 380k (-21, out), 390k (10, in), 395k (12, in), 400k (14, in), 400_004 (21, out) -> 12
      pong  seed 1: 392k (16), 399k (18)                                                                -> 17
      boxing seed 0: 395k (50); seed 1: 391k (70), 396k (90)                                            -> 50, 80
    2023 format (10k bins labelled 10k..400k; [x, x + 10k)): bins 380k, 390k, 400k hold (a, b, c):
      pong  seed 0: (5, 15, 99) seed 1: (7, 17, 99)  -> window [390k, 400k] uses bin 390k only: 15, 17
      boxing seed 0: (60, 70, 0) seed 1: (62, NaN, 0) -> seed 1 has no bin in the window (NaN)
    """
    root = tmp_path / "reference"
    write_official(root / "dreamerv3" / "atari100k-dreamerv3.json.gz", [
        current_run("atari_pong", 0, [380_000, 390_000, 395_000, 400_000, 400_004], [-21, 10, 12, 14, 21]),
        current_run("atari_pong", 1, [100_000, 392_000, 399_000], [-20, 16, 18]),
        current_run("atari_boxing", 0, [200_000, 395_000], [0, 50]),
        current_run("atari_boxing", 1, [391_000, 396_000], [70, 90]),
    ])
    pad = [0.0] * 37  # bins 10k .. 370k

    def bins(a, b, c):
        return pad + [a, b, c]

    write_official(root / "dreamerv3-2023" / "atari100k_dreamerv3.json.gz", [
        binned_run("atari_pong", 0, bins(5, 15, 99)),
        binned_run("atari_pong", 1, bins(7, 17, 99)),
        binned_run("atari_boxing", 0, bins(60, 70, 0)),
        binned_run("atari_boxing", 1, bins(62, float("nan"), 0)),
    ])
    return root
