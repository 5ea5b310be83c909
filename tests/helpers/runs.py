"""Runs of `reverie train exp=debug` for the tests, and their files."""

from __future__ import annotations

import json
from pathlib import Path

from reverie.cli import main

#: metrics whose values depend on the wall clock (everything else in a seeded run is reproducible)
TIMING_KEYS = {"wall_s", "fps/env_steps", "fps/updates"}


def train(tmp_path: Path, name: str, *overrides: str) -> Path:
    """``reverie train exp=debug run_dir=<tmp_path>/<name> <overrides>``, which must succeed; the run directory."""
    run_dir = tmp_path / name
    assert main(["train", "exp=debug", f"run_dir={run_dir}", *overrides]) == 0
    return run_dir


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    """``metrics.jsonl`` rows without the wall-clock fields."""
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]
