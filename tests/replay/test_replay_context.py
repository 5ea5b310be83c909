"""The replay's side of the current official replay (danijar/dreamerv3 e3f0224, embodied/core/replay.py): optional
latent keys, the write-back into sampled rows, the online queue, and both in snapshots (exact resume)."""

import numpy as np
import pytest

from reverie.replay import Replay, is_latent_key, latent_key

N, D = 2, 3


def make(capacity=40, online_window=0, storage="memory", directory=None):
    spec = {"vector": ((1,), np.float32), "action": ((1,), np.float32), "reward": ((), np.float32),
            "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool),
            "posterior_deter": ((D,), np.float32), "has_posterior": ((), bool)}
    return Replay(capacity, N, spec, storage=storage, directory=directory, seed=0,
                  optional=("posterior_deter", "has_posterior"), online_window=online_window)


def add(replay, count):
    """Rows whose vector is ``10 * absolute position + column``."""
    for _ in range(count):
        a = replay.added
        replay.add({"vector": (10.0 * a + np.arange(N, dtype=np.float32))[:, None],
                    "action": np.zeros((N, 1), np.float32), "reward": np.zeros(N, np.float32),
                    "is_first": np.zeros(N, bool), "is_last": np.zeros(N, bool), "is_terminal": np.zeros(N, bool)})


def starts_of(batch):
    """Each window's (column, absolute start) read back from its contents."""
    first = batch["vector"][0, :, 0].astype(int)  # (B,)
    return [(int(v % 10), int(v // 10)) for v in first]


def test_rows_without_latents_get_zeros_flagged_absent():
    replay = make()
    add(replay, 3)
    replay.add({"vector": np.zeros((N, 1), np.float32), "action": np.zeros((N, 1), np.float32),
                "reward": np.zeros(N, np.float32), "is_first": np.zeros(N, bool), "is_last": np.zeros(N, bool),
                "is_terminal": np.zeros(N, bool), "posterior_deter": np.ones((N, D), np.float32),
                "has_posterior": np.ones(N, bool)})
    assert not replay.arrays["has_posterior"][:3].any() and not replay.arrays["posterior_deter"][:3].any()
    assert replay.arrays["has_posterior"][3].all() and (replay.arrays["posterior_deter"][3] == 1).all()
    assert latent_key("deter") == "posterior_deter" and is_latent_key("posterior_deter")  # the names of before
    assert is_latent_key("has_posterior") and is_latent_key("posterior_history") and not is_latent_key("vector")
    with pytest.raises(ValueError, match="optional keys"):
        Replay(8, 1, {**make().spec}, optional=("nope",))


def test_write_lands_in_the_sampled_rows_and_skips_overwritten_ones():
    replay = make(capacity=20)  # 10 rows per column
    add(replay, 6)
    batch = replay.sample(3, 4, index=True)
    assert [(c, s) for c, s in zip(batch["replay_column"], batch["replay_start"])] == starts_of(batch)
    # rows 1..3 of the windows (0, 0) and (1, 2) (overlapping windows: the later write wins, as official)
    values = {"posterior_deter": np.arange(3 * 2 * D, dtype=np.float32).reshape(3, 2, D) + 1,
              "has_posterior": np.ones((3, 2), bool)}
    assert replay.write(np.array([0, 1]), np.array([0, 2]) + 1, values) == 6
    for b, (col, start) in enumerate([(0, 0), (1, 2)]):
        for t in range(3):
            np.testing.assert_array_equal(replay.arrays["posterior_deter"][start + 1 + t, col],
                                          values["posterior_deter"][t, b])
    assert replay.arrays["has_posterior"].sum() == 6 and not replay.arrays["has_posterior"][0].any()
    # overwritten rows are skipped: after 10 more adds the first 6 absolute positions are gone
    add(replay, 10)
    before = replay.arrays["posterior_deter"].copy()
    assert replay.write(np.array([0]), np.array([4]), {"posterior_deter": np.full((4, 1, D), 7, np.float32)}) == 2
    changed = np.argwhere((replay.arrays["posterior_deter"] != before).any(-1))
    assert [tuple(x) for x in changed] == [(6, 0), (7, 0)]  # absolute 6 and 7 (rows 6, 7); 4 and 5 were overwritten
    with pytest.raises(ValueError, match="shape"):
        replay.write(np.array([0]), np.array([10]), {"posterior_deter": np.zeros((2, 2, D), np.float32)})


def test_online_queue_trains_fresh_windows_first_as_the_official_replay():
    replay = make(capacity=40, online_window=3)
    add(replay, 7)  # official replay.py:108-113: queued at 4 and 7 rows, the window ending at the newest row
    assert list(replay.queue) == [(0, 1), (1, 1), (0, 4), (1, 4)]
    replay.sample(4, 3)  # a report's sample ...
    assert len(replay.queue) == 4  # ... leaves the queue alone
    batch = replay.sample(3, 3, online=True)
    assert starts_of(batch)[:3] == [(0, 1), (1, 1), (0, 4)]
    rng_state = replay.rng.bit_generator.state
    batch = replay.sample(3, 3, online=True)  # one queued window, two uniform ones
    assert starts_of(batch)[0] == (1, 4) and not replay.queue
    expected = np.random.default_rng()
    expected.bit_generator.state = rng_state
    cols, pos = expected.integers(0, N, size=2), expected.integers(0, 7 - 3 + 1, size=2)
    assert starts_of(batch)[1:] == list(zip(cols.tolist(), pos.tolist()))


def test_online_windows_overwritten_before_they_are_drawn_are_dropped():
    replay = make(capacity=16, online_window=3)  # 8 rows per column
    add(replay, 13)  # queued at 4, 7, 10, 13 rows: starts 1, 4, 7, 10; rows 5..12 stored, start >= 6 valid
    batch = replay.sample(4, 3, online=True)
    assert starts_of(batch)[:4] == [(0, 7), (1, 7), (0, 10), (1, 10)]


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_snapshot_keeps_queue_counter_and_latents_so_sampling_continues_exactly(tmp_path, storage):
    replay = make(capacity=40, online_window=3, storage=storage, directory=tmp_path / "a")
    add(replay, 10)
    replay.sample(2, 3, online=True)
    batch = replay.sample(2, 3, index=True)
    replay.write(batch["replay_column"], batch["replay_start"], {"posterior_deter": np.ones((3, 2, D), np.float32),
                                                                 "has_posterior": np.ones((3, 2), bool)})
    replay.save(tmp_path / "snap")
    other = make(capacity=40, online_window=3, storage=storage, directory=tmp_path / "b")
    add(other, 2)
    other.load(tmp_path / "snap")
    assert other.added == replay.added == 10 and list(other.queue) == list(replay.queue)
    for key in replay.arrays:
        np.testing.assert_array_equal(other.arrays[key], replay.arrays[key], err_msg=key)
    for r in (replay, other):
        add(r, 4)
    for _ in range(3):
        a, b = replay.sample(3, 3, online=True), other.sample(3, 3, online=True)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
