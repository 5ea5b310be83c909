"""Replay unit behaviour: layout, validation, ring order, exact windows, storage equivalence, save/load."""

import numpy as np
import pytest

from reverie.replay import Replay

A = 2


def spec(image=False):
    out = {"vector": ((1,), np.float32)}
    if image:
        out["image"] = ((3, 4, 4), np.uint8)
    out.update(
        {"action": ((A,), np.float32), "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool),
         "is_terminal": ((), bool)}
    )
    return out


def row(k, n=2, first=False, image=False):
    """Row k for n envs: vector = 10 * k + env, action = [k, env] + 1, is_first per ``first``."""
    out = {
        "vector": (10.0 * k + np.arange(n, dtype=np.float32))[:, None],
        "action": np.stack([np.full(n, k + 1.0), np.arange(n) + 1.0], 1).astype(np.float32),
        "reward": np.full(n, float(k), np.float32),
        "is_first": np.full(n, first),
        "is_last": np.zeros(n, bool),
        "is_terminal": np.zeros(n, bool),
    }
    if image:
        out["image"] = np.full((n, 3, 4, 4), k % 256, np.uint8)
    return out


def fill(replay, rows, start=0, **kw):
    for k in range(start, start + rows):
        replay.add(row(k, replay.num_envs, first=(k == 0), **kw))


def test_layout_and_lengths():
    replay = Replay(capacity=11, num_envs=2, spec=spec(image=True))
    assert replay.length == 5 and replay.capacity == 10 and len(replay) == 0
    assert replay.arrays["image"].shape == (5, 2, 3, 4, 4) and replay.arrays["image"].dtype == np.uint8
    assert replay.arrays["vector"].shape == (5, 2, 1) and replay.arrays["is_first"].dtype == bool
    fill(replay, 3, image=True)
    assert (replay.num_rows, len(replay), replay.cursor) == (3, 6, 3)
    fill(replay, 4, start=3, image=True)
    assert (replay.num_rows, len(replay), replay.cursor, replay.wrapped) == (5, 10, 2, True)
    # Ring order: rows 0-1 were overwritten by k=5,6.
    assert replay.arrays["vector"][:, 0, 0].tolist() == [50, 60, 20, 30, 40]


def test_constructor_errors(tmp_path):
    with pytest.raises(ValueError, match=r"leaves 1 rows per env; need at least 2: set replay.capacity >= 8"):
        Replay(capacity=7, num_envs=4, spec=spec())
    with pytest.raises(ValueError, match=r"lacks keys \['is_terminal'\]"):
        Replay(10, 1, {k: v for k, v in spec().items() if k != "is_terminal"})
    with pytest.raises(ValueError, match="set replay.directory="):
        Replay(10, 1, spec(), storage="memmap")
    with pytest.raises(ValueError, match="replay.storage must be one of"):
        Replay(10, 1, spec(), storage="disk")
    with pytest.raises(ValueError, match="'prev_action' is computed"):
        Replay(10, 1, {**spec(), "prev_action": ((A,), np.float32)})


def test_add_validation():
    replay = Replay(10, 2, spec(image=True))
    good = row(0, image=True)
    with pytest.raises(KeyError, match=r"lacks keys \['reward'\]"):
        replay.add({k: v for k, v in good.items() if k != "reward"})
    with pytest.raises(ValueError, match=r"'action' has shape \(2, 3\), expected \(N, \.\.\.\) = \(2, 2\)"):
        replay.add({**good, "action": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="'image' has dtype float32, which does not cast to uint8"):
        replay.add({**good, "image": good["image"].astype(np.float32)})
    assert replay.num_rows == 0  # nothing written by a failed add
    replay.add({**good, "extra": np.zeros(5)})  # extra keys ignored
    assert replay.num_rows == 1 and "extra" not in replay.arrays


def test_before_wrap_full_window_is_everything_in_order():
    replay = Replay(20, 2, spec(), seed=1)
    fill(replay, 6)
    out = replay.sample(batch=8, length=6)
    assert out["vector"].shape == (6, 8, 1) and out["prev_action"].shape == (6, 8, A)
    cols = out["vector"][0, :, 0].astype(int)  # row 0 vector = env index
    np.testing.assert_array_equal(out["vector"][:, :, 0], 10 * np.arange(6)[:, None] + cols[None, :])
    # prev_action: 0 at row 0 (is_first), else the previous row's action [k, env + 1].
    np.testing.assert_array_equal(out["prev_action"][0], 0)
    np.testing.assert_array_equal(out["prev_action"][1:, :, 0], np.broadcast_to(np.arange(1, 6)[:, None], (5, 8)))
    np.testing.assert_array_equal(out["prev_action"][1:, :, 1], np.broadcast_to(cols + 1.0, (5, 8)))
    with pytest.raises(ValueError, match="replay holds 6 rows per env but a window of length 7 needs 7"):
        replay.sample(1, 7)


def test_after_wrap_windows_never_cross_the_cursor():
    replay = Replay(10, 1, spec(), seed=0)  # L = 10
    fill(replay, 27)  # stored k = 17..26, cursor at row 7 holds k = 17 (oldest)
    out = replay.sample(batch=4, length=9)  # only one valid start: k = 18..26, previous row k = 17
    np.testing.assert_array_equal(out["vector"][:, :, 0], np.broadcast_to(10.0 * np.arange(18, 27)[:, None], (9, 4)))
    np.testing.assert_array_equal(out["prev_action"][:, :, 0], np.broadcast_to(np.arange(18, 27)[:, None], (9, 4)))
    with pytest.raises(ValueError, match=r"needs 11 \(one more for the previous action once wrapped\).*capacity"):
        replay.sample(1, 10)
    # Every start position is reachable, and none joins newest (26) to oldest (17).
    starts = replay.sample(batch=2000, length=2)["vector"][0, :, 0] / 10
    assert sorted(set(starts.astype(int).tolist())) == list(range(18, 26))


def test_prev_action_zero_where_is_first():
    replay = Replay(10, 1, spec(), seed=0)
    for k in range(5):
        replay.add(row(k, 1, first=k in (0, 3)))
    out = replay.sample(batch=3, length=5)
    np.testing.assert_array_equal(out["prev_action"][:, 0, 0], [0, 1, 2, 0, 4])


def test_sample_rng_is_seeded():
    a, b, c = (Replay(40, 2, spec(), seed=s) for s in (5, 5, 6))
    for replay in (a, b, c):
        fill(replay, 20)
    va, vb, vc = (r.sample(16, 3)["vector"] for r in (a, b, c))
    np.testing.assert_array_equal(va, vb)
    assert not np.array_equal(va, vc)


def test_memmap_equals_memory(tmp_path):
    memory = Replay(12, 2, spec(image=True), seed=3)
    memmap = Replay(12, 2, spec(image=True), storage="memmap", directory=tmp_path / "mm", seed=3)
    assert isinstance(memmap.arrays["image"], np.memmap)
    assert sorted(p.name for p in (tmp_path / "mm").iterdir()) == sorted(f"{k}.npy" for k in spec(image=True))
    for replay in (memory, memmap):
        fill(replay, 9, image=True)
    x, y = memory.sample(32, 4), memmap.sample(32, 4)
    assert x.keys() == y.keys() and x["image"].dtype == np.uint8
    for key in x:
        np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_save_load_round_trip(tmp_path, storage):
    kwargs = {"storage": storage, "directory": tmp_path / "live"} if storage == "memmap" else {}
    replay = Replay(12, 2, spec(image=True), seed=9, **kwargs)
    fill(replay, 8, image=True)
    replay.sample(4, 2)  # advance the rng
    replay.save(tmp_path / "saved")
    restored = Replay(12, 2, spec(image=True), seed=0)
    restored.load(tmp_path / "saved")
    assert (restored.cursor, restored.fill, restored.wrapped) == (2, 6, True)
    for key in replay.arrays:
        np.testing.assert_array_equal(restored.arrays[key], replay.arrays[key])
    x, y = replay.sample(16, 3), restored.sample(16, 3)
    for key in x:
        np.testing.assert_array_equal(x[key], y[key])


def test_memmap_save_into_own_directory_and_state_dict(tmp_path):
    replay = Replay(12, 2, spec(), storage="memmap", directory=tmp_path, seed=2)
    fill(replay, 4)
    replay.save(tmp_path)  # flushes, no copy over its own open files
    state = replay.state_dict()
    assert state["files"]["vector"] == str(tmp_path / "vector.npy")
    other = Replay(12, 2, spec(), seed=0)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.arrays["action"], replay.arrays["action"])
    np.testing.assert_array_equal(other.sample(8, 2)["vector"], replay.sample(8, 2)["vector"])
    loaded = Replay(12, 2, spec(), seed=0)
    loaded.load(tmp_path)
    assert (loaded.cursor, loaded.fill) == (4, 4)


def test_load_rejects_other_layout(tmp_path):
    replay = Replay(12, 2, spec())
    fill(replay, 2)
    replay.save(tmp_path)
    with pytest.raises(ValueError, match="does not match this buffer.*num_envs=2 rows=6.*num_envs=3 rows=4"):
        Replay(12, 3, spec()).load(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing replay.json"):
        Replay(12, 2, spec()).load(tmp_path / "nothing")


def test_spec_for_dict_space():
    from gymnasium import spaces

    space = spaces.Dict({"image": spaces.Box(0, 255, (3, 64, 64), np.uint8), "vector": spaces.Box(-1, 1, (4,))})
    got = Replay.spec_for(space, action_dim=3)
    assert got == {
        "image": ((3, 64, 64), np.dtype(np.uint8)),
        "vector": ((4,), np.dtype(np.float32)),
        "action": ((3,), np.dtype(np.float32)),
        "reward": ((), np.dtype(np.float32)),
        "is_first": ((), np.dtype(bool)),
        "is_last": ((), np.dtype(bool)),
        "is_terminal": ((), np.dtype(bool)),
    }
    with pytest.raises(ValueError, match="needs a Dict observation space"):
        Replay.spec_for(spaces.Box(-1, 1, (4,)), 3)


# ------------------------------------------------------------- issue 20: a snapshot holds only the filled rows
def snapshot_bytes(directory, key):
    """(file size, header size) of a saved key's .npy file."""
    from reverie.replay.files import npy_rows

    path = directory / f"{key}.npy"
    return path.stat().st_size, npy_rows(str(path))[1]


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_snapshot_size_is_the_filled_rows_not_the_capacity(tmp_path, storage):
    kwargs = {"storage": storage, "directory": tmp_path / "live"} if storage == "memmap" else {}
    replay = Replay(20_000, 2, spec(image=True), seed=1, **kwargs)  # 10,000 rows per env, 3 filled, then 7
    per_row = 2 * 3 * 4 * 4  # N x one uint8 (3, 4, 4) image
    fill(replay, 3, image=True)
    replay.save(tmp_path / "a")
    fill(replay, 4, start=3, image=True)
    replay.save(tmp_path / "b")
    size_a, header_a = snapshot_bytes(tmp_path / "a", "image")
    size_b, header_b = snapshot_bytes(tmp_path / "b", "image")
    assert size_a - header_a == 3 * per_row and size_b - header_b == 7 * per_row
    assert np.load(tmp_path / "b" / "vector.npy").shape == (7, 2, 1)
    restored = Replay(20_000, 2, spec(image=True), seed=0)
    restored.load(tmp_path / "a")
    assert (restored.cursor, restored.fill, restored.wrapped) == (3, 3, False)
    partial = Replay(20_000, 2, spec(image=True), seed=1)
    fill(partial, 3, image=True)
    for key in replay.arrays:  # every row equal to a buffer that was only ever given those 3 rows (zeros after)
        np.testing.assert_array_equal(restored.arrays[key], partial.arrays[key], err_msg=key)


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_wrapped_buffer_round_trips_exactly(tmp_path, storage):
    kwargs = {"storage": storage, "directory": tmp_path / "live"} if storage == "memmap" else {}
    replay = Replay(10, 2, spec(image=True), seed=4, **kwargs)  # 5 rows per env
    fill(replay, 13, image=True)  # wrapped twice, cursor at row 3
    replay.sample(3, 2)
    replay.save(tmp_path / "s")
    assert np.load(tmp_path / "s" / "image.npy").shape == (5, 2, 3, 4, 4)  # all rows, in storage order
    restored = Replay(10, 2, spec(image=True), seed=0, storage=storage,
                      directory=tmp_path / "other" if storage == "memmap" else None)
    restored.load(tmp_path / "s")
    assert (restored.cursor, restored.fill, restored.wrapped) == (3, 5, True)
    for key in replay.arrays:
        np.testing.assert_array_equal(restored.arrays[key], replay.arrays[key], err_msg=key)
    x, y = replay.sample(16, 4), restored.sample(16, 4)
    for key in x:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_load_drops_rows_written_after_the_snapshot(tmp_path, storage):
    """A live buffer that moved on past its snapshot (a run killed after its checkpoint) is loaded back to exactly
    the snapshot: the later rows are zero again, so it samples as the buffer that was saved."""
    kwargs = {"storage": storage, "directory": tmp_path / "live"} if storage == "memmap" else {}
    replay = Replay(40, 2, spec(), seed=6, **kwargs)
    fill(replay, 5)
    replay.save(tmp_path / "s")
    want = {k: np.array(v) for k, v in replay.arrays.items()}
    x = replay.sample(8, 3)
    fill(replay, 9, start=5)  # rows 5..13 past the snapshot
    replay.load(tmp_path / "s")
    for key in want:
        np.testing.assert_array_equal(replay.arrays[key], want[key], err_msg=key)
    y = replay.sample(8, 3)
    for key in x:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def test_empty_buffer_saves_and_loads(tmp_path):
    replay = Replay(12, 2, spec(image=True), storage="memmap", directory=tmp_path / "live")
    replay.save(tmp_path / "s")
    assert np.load(tmp_path / "s" / "image.npy").shape == (0, 2, 3, 4, 4)
    restored = Replay(12, 2, spec(image=True))
    restored.load(tmp_path / "s")
    assert (restored.cursor, len(restored)) == (0, 0)


@pytest.mark.parametrize("first, second", [(3, 2), (4, 3), (5, 5)])
def test_extend_equals_adding_row_by_row(first, second):
    """K rows at once (wrapping over the oldest, as a full buffer does) leave the buffer as K adds would."""
    added, extended = Replay(10, 2, spec()), Replay(10, 2, spec())
    rows = [row(k, first=(k % 3 == 0)) for k in range(first + second)]
    for r in rows:
        added.add(r)
    for block in (rows[:first], rows[first:]):
        extended.extend({key: np.stack([r[key] for r in block]) for key in spec()})
    assert (extended.cursor, extended.fill, extended.wrapped) == (added.cursor, added.fill, added.wrapped)
    for key in spec():
        np.testing.assert_array_equal(extended.arrays[key], added.arrays[key], err_msg=key)
    for buffer in (added, extended):  # loading an empty snapshot zeroes every row either one wrote
        buffer.load_state_dict(Replay(10, 2, spec()).state_dict())
        assert not any(array.any() for array in buffer.arrays.values())
    with pytest.raises(ValueError, match=r"6 rows per env, expected 1..5"):
        extended.extend({key: np.stack([row(k)[key] for k in range(6)]) for key in spec()})
    with pytest.raises(ValueError, match=r"'vector' has shape \(1, 3, 1\), expected"):
        extended.extend({**{key: np.stack([r[key] for r in rows[:1]]) for key in spec()},
                         "vector": np.zeros((1, 3, 1), np.float32)})


def test_sample_at_reads_the_given_windows_and_refuses_windows_outside_the_stored_rows():
    replay = Replay(64, 2, spec())
    fill(replay, 10)
    batch = replay.sample(2, 4, index=True, at=(np.array([1, 0]), np.array([6, 0])))
    assert batch["replay_column"].tolist() == [1, 0] and batch["replay_start"].tolist() == [6, 0]
    np.testing.assert_array_equal(batch["reward"][:, 0], replay.arrays["reward"][6:10, 1])
    np.testing.assert_array_equal(batch["reward"][:, 1], replay.arrays["reward"][0:4, 0])
    with pytest.raises(ValueError, match=r"must start within the stored rows \[0, 6\] of columns 0..1"):
        replay.sample(1, 4, at=(np.array([0]), np.array([7])))
    with pytest.raises(ValueError, match="stored rows"):
        replay.sample(1, 4, at=(np.array([2]), np.array([0])))
