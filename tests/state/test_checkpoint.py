import pytest
import torch

from reverie.state.checkpoint import find_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def test_keeps_newest_k_and_loads_the_newest(tmp_path):
    for step in (5, 100, 20, 7):
        save_checkpoint(tmp_path / "checkpoints", step, {"step": step, "x": torch.tensor([step])}, keep=2)
    names = [p.name for p in list_checkpoints(tmp_path / "checkpoints")]
    assert names == ["ckpt_0000000020.pt", "ckpt_0000000100.pt"]  # oldest removed, ordered by step
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    assert load_checkpoint(tmp_path)["step"] == 100  # a run directory resolves to its newest checkpoint
    assert find_checkpoint(tmp_path / "checkpoints" / "ckpt_0000000020.pt").name == "ckpt_0000000020.pt"


def test_missing_checkpoint_error_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        find_checkpoint(tmp_path)


# ---------------------------------------------------------------------------------------- issue 6: crash safety
import json  # noqa: E402

import numpy as np  # noqa: E402

from reverie.state.checkpoint import replay_dir_for  # noqa: E402
from reverie.replay import Replay  # noqa: E402


def filled_replay(storage, directory, rows=30, seed=0):
    spec = {"image": ((3, 8, 8), np.uint8), "action": ((2,), np.float32), "reward": ((), np.float32),
            "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}
    replay = Replay(40, 2, spec, storage=storage, directory=directory, seed=seed)  # 20 rows: wraps at 30
    rng = np.random.default_rng(seed)
    for t in range(rows):
        replay.add({"image": rng.integers(0, 256, (2, 3, 8, 8), dtype=np.uint8),
                    "action": rng.normal(size=(2, 2)).astype(np.float32), "reward": np.full(2, t, np.float32),
                    "is_first": np.array([t % 7 == 0] * 2), "is_last": np.zeros(2, bool),
                    "is_terminal": np.zeros(2, bool)})
    return replay


def replay_contents(replay):
    return ({k: np.array(v) for k, v in replay.arrays.items()}, replay.cursor, len(replay),
            replay.rng.bit_generator.state)


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_save_restore_twice_leaves_the_replay_unchanged(tmp_path, storage):
    original = filled_replay(storage, tmp_path / "live0")
    want = replay_contents(original)
    ckpts = tmp_path / "checkpoints"
    save_checkpoint(ckpts, 30, {"step": 30}, replay=original)
    for i in (1, 2):  # restore into a fresh buffer (memmap: the run's live folder) and save the same step again
        restored = filled_replay(storage, tmp_path / "live", rows=0, seed=99)
        restored.load(load_checkpoint(tmp_path)["replay_dir"])
        got = replay_contents(restored)
        assert got[1:] == want[1:] and len(restored) == 40  # cursor, length (no duplicates), sampler RNG
        for key in want[0]:
            np.testing.assert_array_equal(got[0][key], want[0][key], err_msg=f"round {i}: {key}")
        save_checkpoint(ckpts, 30, {"step": 30}, replay=restored)
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt_0000000030.pt", "ckpt_0000000030.replay"]


def test_truncated_checkpoint_is_detected_and_the_previous_one_used(tmp_path):
    replay = filled_replay("memory", None)
    for step in (10, 20):
        save_checkpoint(tmp_path / "checkpoints", step, {"step": step, "w": torch.arange(1000)}, replay=replay)
    newest = tmp_path / "checkpoints" / "ckpt_0000000020.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a write cut short
    with pytest.warns(UserWarning, match="ckpt_0000000020.pt is unreadable"):
        payload = load_checkpoint(tmp_path)
    assert payload["step"] == 10 and payload["checkpoint_path"].endswith("ckpt_0000000010.pt")


def test_partial_replay_snapshot_falls_back_and_nothing_readable_raises(tmp_path):
    replay = filled_replay("memory", None)
    for step in (10, 20):
        save_checkpoint(tmp_path / "checkpoints", step, {"step": step}, replay=replay)
    image = replay_dir_for(tmp_path / "checkpoints" / "ckpt_0000000020.pt") / "image.npy"
    image.write_bytes(image.read_bytes()[:1000])
    with pytest.warns(UserWarning, match="partial write"):
        assert load_checkpoint(tmp_path)["step"] == 10
    (tmp_path / "checkpoints" / "ckpt_0000000010.pt").write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="no readable checkpoint"):
        load_checkpoint(tmp_path)


def test_keep_removes_old_replay_snapshots_and_leftovers(tmp_path):
    replay = filled_replay("memory", None)
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "ckpt_0000000005.replay.tmp").mkdir()  # left by a run killed while writing a snapshot
    for step in (10, 20, 30):
        save_checkpoint(ckpts, step, {"step": step}, keep=2, replay=replay)
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "ckpt_0000000020.pt", "ckpt_0000000020.replay", "ckpt_0000000030.pt", "ckpt_0000000030.replay"]
    meta = json.loads((ckpts / "ckpt_0000000030.replay" / "replay.json").read_text())
    assert meta["sizes"]["image"] == (ckpts / "ckpt_0000000030.replay" / "image.npy").stat().st_size
    with pytest.raises(ValueError, match="checkpoint_keep"):
        save_checkpoint(ckpts, 40, {}, keep=0)


def test_pruning_removes_an_unreadable_checkpoint_before_any_readable_one(tmp_path, capsys):
    """Issue 20: keep=2 with ckpt 30 truncated: writing 40 keeps 20 and 40 (the newest two readable), not 30."""
    ckpts = tmp_path / "checkpoints"
    replay = filled_replay("memory", None)
    for step in (10, 20, 30):
        save_checkpoint(ckpts, step, {"step": step}, keep=3, replay=replay)
    bad = ckpts / "ckpt_0000000030.pt"
    bad.write_bytes(bad.read_bytes()[:50])
    save_checkpoint(ckpts, 40, {"step": 40}, keep=2, replay=replay)
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "ckpt_0000000020.pt", "ckpt_0000000020.replay", "ckpt_0000000040.pt", "ckpt_0000000040.replay"]
    assert "removing unreadable checkpoint" in capsys.readouterr().out and "ckpt_0000000030.pt" not in str(
        list_checkpoints(ckpts))
