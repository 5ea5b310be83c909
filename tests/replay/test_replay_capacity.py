"""Images stay uint8 and a full buffer evicts oldest first (issue 6)."""

import numpy as np
import pytest

from reverie.replay import Replay

SPEC = {"image": ((3, 64, 64), np.uint8), "index": ((), np.int64), "action": ((1,), np.float32),
        "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_capacity_1000_after_20000_image_inserts(tmp_path, storage):
    replay = Replay(1000, 1, SPEC, storage=storage, directory=tmp_path, seed=0)
    image = np.zeros((1, 3, 64, 64), np.uint8)
    flags = np.zeros(1, bool)
    for i in range(20_000):
        image[:] = i % 251
        replay.add({"image": image, "index": np.array([i]), "action": np.zeros((1, 1), np.float32),
                    "reward": np.zeros(1, np.float32), "is_first": flags, "is_last": flags, "is_terminal": flags})
    assert len(replay) == 1000 and replay.capacity == 1000
    frames = replay.arrays["image"]
    assert frames.dtype == np.uint8 and frames.nbytes // 1000 == 12_288  # 64 * 64 * 3 bytes a frame
    if storage == "memmap":
        assert (tmp_path / "image.npy").stat().st_size < 1000 * 12_288 + 4096  # data + .npy header
    # the 1,000 newest remain, in insert order from the cursor: 19,000 .. 19,999; everything older was evicted
    order = np.roll(np.arange(1000), -replay.cursor)
    stored = replay.arrays["index"][order, 0]
    np.testing.assert_array_equal(stored, np.arange(19_000, 20_000))
    np.testing.assert_array_equal(frames[order, 0, 0, 0, 0], np.arange(19_000, 20_000) % 251)
    batch = replay.sample(8, 16)
    assert batch["image"].dtype == np.uint8 and batch["image"].shape == (16, 8, 3, 64, 64)
    assert batch["index"].min() >= 19_000 and np.all(np.diff(batch["index"], axis=0) == 1)


def test_memmap_release_keeps_data(tmp_path):
    replay = Replay(100, 1, SPEC, storage="memmap", directory=tmp_path, seed=0)
    flags = np.zeros(1, bool)
    for i in range(150):
        if i % 7 == 0:
            replay.release_memory()  # unmap often: the data must survive it
        replay.add({"image": np.full((1, 3, 64, 64), i % 256, np.uint8), "index": np.array([i]),
                    "action": np.zeros((1, 1), np.float32), "reward": np.zeros(1, np.float32),
                    "is_first": flags, "is_last": flags, "is_terminal": flags})
    order = np.roll(np.arange(100), -replay.cursor)
    np.testing.assert_array_equal(replay.arrays["index"][order, 0], np.arange(50, 150))
    np.testing.assert_array_equal(replay.arrays["image"][order, 0, 1, 2, 3], np.arange(50, 150) % 256)
