"""Exact comparison of nested run state (checkpoint payloads, replay arrays) for the resume-style tests."""

import json

import numpy as np
import torch

from reverie.state.checkpoint import list_checkpoints, load_checkpoint


def assert_same(a, b, path="state"):
    """Recursive exact equality of nested dicts/lists of tensors, arrays and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def final_state(run_dir):
    """Everything that must match exactly: the newest checkpoint's payload, its replay files, the replay's metadata
    and the counters (wall time left out)."""
    payload = load_checkpoint(run_dir)
    replay = {p.stem: np.load(p) for p in sorted((list_checkpoints(run_dir / "checkpoints")[-1]
                                                  .with_suffix(".replay")).glob("*.npy"))}
    replay_json = list_checkpoints(run_dir / "checkpoints")[-1].with_suffix(".replay") / "replay.json"
    meta = json.loads(replay_json.read_text())
    counters = {k: v for k, v in payload["counters"].items() if k != "wall_s"}
    return payload, replay, meta, counters
