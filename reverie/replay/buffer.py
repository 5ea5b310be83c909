"""Ring-buffer replay with one contiguous time stream per env, sampled as time-first ``(T, B, ...)`` windows.

Storage: one ``(L, N, ...)`` array per key, ``L = capacity // N``; ``add`` writes row ``cursor`` for all ``N`` envs
and the cursor wraps, so column ``n`` is env ``n``'s stream (oldest row at ``cursor`` once wrapped, at 0 before).
A window starts at time-order position ``p >= 1`` once wrapped (row ``p - 1`` gives ``prev_action``; no window joins
the newest row to the oldest), ``p >= 0`` before. Windows may cross episodes; ``is_first`` marks each crossing.
``added`` counts rows ever written per column: absolute position ``a`` is row ``a % L``, stored while
``a >= added - fill``. The online queue (``replay.py:108-118``, ``:151-168``) and the write-back (``Replay.update``,
``replay.py:130-149``) follow danijar/dreamerv3 e3f0224 ``embodied/core/replay.py``. Snapshots hold the filled rows
only, the counter and the queue, so a resumed run samples exactly as the uninterrupted one.
"""

from __future__ import annotations

import json
import mmap
import os
from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

from reverie.replay.files import bytes_per_row, copy_range, fsync_path, npy_rows, write_rows
from reverie.types import FLAG_KEYS

Spec = dict[str, tuple[tuple[int, ...], np.dtype]]
REQUIRED_KEYS = ("action", "reward", *FLAG_KEYS)
STORAGES = ("memory", "memmap")
MIN_ROWS = 2
#: replay-context latents (``replay_context: 1``): ``posterior_<name>`` per ``context_spec()`` entry and
#: ``has_posterior``; optional keys, training state rather than data (a dataset read leaves them out).
LATENT_PREFIX = "posterior_"
LATENT_FLAG = "has_posterior"
META_FILE = "replay.json"
RELEASE_BYTES = 128 << 20  # memmap: unmap touched pages after about this many bytes written or read


def latent_key(name: str) -> str:
    """``posterior_<name>``: the replay key of the dynamics' ``context_spec()`` entry ``name``."""
    return LATENT_PREFIX + name


def is_latent_key(key: str) -> bool:
    """Whether a replay key is a stored replay-context latent (``posterior_...`` or ``has_posterior``)."""
    return key == LATENT_FLAG or key.startswith(LATENT_PREFIX)


def _file_name(key: str) -> str:
    return f"{key}.npy"


class Replay:
    """Time-first replay buffer for ``N = num_envs`` parallel envs, ``L = capacity // N >= 2`` rows per env.

    ``spec``: key -> ``(shape, dtype)`` of one env's value, with ``action``, ``reward``, ``is_first``, ``is_last``,
    ``is_terminal`` (:meth:`spec_for`; images stay uint8). ``storage``: ``"memory"`` or ``"memmap"`` (``.npy`` files
    in ``directory``). ``seed``: the sampler's generator. ``optional``: keys :meth:`add` and :meth:`extend` may lack
    (zeros; the replay-context latents). ``online_window``: ``W > 0`` queues, every ``W`` rows, each column's window
    of ``W`` rows ending at its newest row; 0: off.

    Raises ValueError: too small a capacity, a missing required key, ``prev_action`` in the spec, an unknown storage,
    memmap without a directory, an optional key not in the spec or a negative ``online_window``.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        spec: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        storage: str = "memory",
        directory: str | os.PathLike | None = None,
        seed: int = 0,
        optional: Iterable[str] = (),
        online_window: int = 0,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        rows = int(capacity) // int(num_envs)
        if rows < MIN_ROWS:
            raise ValueError(
                f"replay.capacity={capacity} with {num_envs} envs leaves {rows} rows per env; need at least "
                f"{MIN_ROWS}: set replay.capacity >= {MIN_ROWS * num_envs}"
            )
        missing = [key for key in REQUIRED_KEYS if key not in spec]
        if missing:
            raise ValueError(f"replay spec lacks keys {missing}; build it with Replay.spec_for(obs_space, action_dim)")
        if "prev_action" in spec:
            raise ValueError("'prev_action' is computed by Replay.sample and must not be in the spec")
        if storage not in STORAGES:
            raise ValueError(f"replay.storage must be one of {STORAGES}, got {storage!r}")
        if storage == "memmap" and directory is None:
            raise ValueError("replay.storage='memmap' needs a directory: set replay.directory=/path/to/replay")
        optional = tuple(optional)
        unknown = [key for key in optional if key not in spec]
        if unknown:
            raise ValueError(f"replay optional keys {unknown} are not in the spec {sorted(spec)}")
        if int(online_window) < 0:
            raise ValueError(f"online_window must be >= 0 (0: no online queue), got {online_window}")
        self.optional = optional
        self.online_window = int(online_window)
        self.queue: deque[tuple[int, int]] = deque()  # (column, absolute start) of fresh windows, oldest first
        self.added = 0  # rows ever written per column (absolute position of the next row)
        self.spec: Spec = {key: (tuple(int(d) for d in shape), np.dtype(dtype)) for key, (shape, dtype) in spec.items()}
        self.num_envs = int(num_envs)
        self.length = rows  # L
        self.storage = storage
        self.directory = None if directory is None else os.fspath(directory)
        self.cursor = 0  # next row to write
        self.fill = 0  # rows stored, <= L
        self._wrapped = False  # the cursor has passed the last row at least once
        self._high = 0  # rows [_high, L) were never written since the buffer was built or loaded: still zeros
        self.rng = np.random.default_rng(seed)
        self.arrays: dict[str, np.ndarray] = {}
        row_bytes = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in self.spec.values())
        self.row_bytes = row_bytes * self.num_envs  # bytes written per add() (all N envs)
        self._touched = 0  # memmap: bytes written or read through the mapping since the last release_memory()
        if storage == "memmap":
            os.makedirs(self.directory, exist_ok=True)
        for key, (shape, dtype) in self.spec.items():
            full = (self.length, self.num_envs, *shape)
            if storage == "memmap":
                path = os.path.join(self.directory, _file_name(key))
                self.arrays[key] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=full)
            else:
                self.arrays[key] = np.zeros(full, dtype)

    @staticmethod
    def spec_for(obs_space, action_dim: int) -> Spec:
        """Spec of one env's Dict observation space plus ``action`` ``(A,)`` float32, ``reward`` ``()`` float32 and
        the ``()`` bool flags. Raises ValueError when ``obs_space`` is not a Dict space."""
        subspaces = getattr(obs_space, "spaces", None)
        if not isinstance(subspaces, Mapping):
            raise ValueError(f"Replay.spec_for needs a Dict observation space (from reverie.envs), got {obs_space!r}")
        spec: Spec = {name: (tuple(space.shape), np.dtype(space.dtype)) for name, space in subspaces.items()}
        spec["action"] = ((int(action_dim),), np.dtype(np.float32))
        spec["reward"] = ((), np.dtype(np.float32))
        for key in FLAG_KEYS:
            spec[key] = ((), np.dtype(bool))
        return spec

    @property
    def capacity(self) -> int:
        """Steps the buffer can hold: ``L * N``."""
        return self.length * self.num_envs

    @property
    def num_rows(self) -> int:
        """Rows stored per env (``<= L``)."""
        return self.fill

    @property
    def wrapped(self) -> bool:
        """True once the cursor has wrapped: the buffer is full and each ``add`` overwrites the oldest row."""
        return self._wrapped

    def __len__(self) -> int:
        """Steps stored: ``num_rows * N``."""
        return self.fill * self.num_envs

    def add(self, step: Mapping[str, np.ndarray]) -> None:
        """Write one row, every spec key -> ``(N, *shape)``, at the cursor (overwriting the oldest once full).
        Raises KeyError for a missing key, ValueError for a wrong shape or a dtype that does not cast ``same_kind``."""
        step = self._with_optional(step, (self.num_envs,))
        missing = [key for key in self.spec if key not in step]
        if missing:
            raise KeyError(f"Replay.add: step lacks keys {missing}; every row needs {sorted(self.spec)}")
        values = {}
        for key, (shape, dtype) in self.spec.items():
            value = np.asarray(step[key])
            want = (self.num_envs, *shape)
            if value.shape != want:
                raise ValueError(f"Replay.add: {key!r} has shape {value.shape}, expected (N, ...) = {want}")
            if not np.can_cast(value.dtype, dtype, casting="same_kind"):
                raise ValueError(f"Replay.add: {key!r} has dtype {value.dtype}, which does not cast to {dtype}")
            values[key] = value
        for key, value in values.items():
            self.arrays[key][self.cursor] = value
        self._advance(1)
        W = self.online_window
        if W and self.added >= W and (self.added - 1) % W == 0:  # official replay.py:108-118
            self.queue.extend((col, self.added - W) for col in range(self.num_envs))

    def _with_optional(self, step: Mapping[str, np.ndarray], lead: tuple[int, ...]) -> Mapping[str, np.ndarray]:
        """``step`` with zeros ``(*lead, *shape)`` for the optional keys it lacks."""
        absent = [key for key in self.optional if key not in step]
        if not absent:
            return step
        return {**step, **{key: np.zeros((*lead, *self.spec[key][0]), self.spec[key][1]) for key in absent}}

    def _advance(self, count: int) -> None:
        """Bookkeeping after ``count`` rows were written from the cursor on (wrapping)."""
        self._high = max(self._high, min(self.cursor + count, self.length))
        self._wrapped = self._wrapped or self.cursor + count >= self.length
        self.cursor = (self.cursor + count) % self.length
        self.fill = min(self.fill + count, self.length)
        self.added += count
        self._touch(self.row_bytes * count)

    def extend(self, steps: Mapping[str, np.ndarray]) -> None:
        """Write ``K`` rows, every spec key -> ``(K, N, *shape)``, ``1 <= K <= L``, as ``K`` calls of :meth:`add`
        would; the same errors, and ValueError for ``K`` outside ``1..L``."""
        if "reward" in steps:
            steps = self._with_optional(steps, (len(np.asarray(steps["reward"])), self.num_envs))
        missing = [key for key in self.spec if key not in steps]
        if missing:
            raise KeyError(f"Replay.extend: steps lack keys {missing}; every row needs {sorted(self.spec)}")
        count = len(np.asarray(steps["reward"]))
        if not 1 <= count <= self.length:
            raise ValueError(f"Replay.extend: {count} rows per env, expected 1..{self.length} (rows per env)")
        for key, (shape, dtype) in self.spec.items():
            value = np.asarray(steps[key])
            if value.shape != (count, self.num_envs, *shape):
                raise ValueError(f"Replay.extend: {key!r} has shape {value.shape}, expected (K, N, ...) = "
                                 f"{(count, self.num_envs, *shape)}")
            if not np.can_cast(value.dtype, dtype, casting="same_kind"):
                raise ValueError(f"Replay.extend: {key!r} has dtype {value.dtype}, which does not cast to {dtype}")
        rows = (self.cursor + np.arange(count)) % self.length  # (K,) physical rows, wrapping
        for key in self.spec:
            self.arrays[key][rows] = steps[key]
        self._advance(count)

    def sample(self, batch: int, length: int, online: bool = False, index: bool = False,
               at: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Sample ``B = batch`` windows of ``T = length`` rows, uniform over valid (column, start) pairs.

        Returns every spec key as ``(T, B, *shape)`` plus ``prev_action`` ``(T, B, A)`` float32 (0 where
        ``is_first`` and at the very first row). ``online``: queued windows first, oldest first and each once
        (official ``Replay._sample``, ``mode='train'``); False leaves the queue alone. ``index``: also
        ``replay_column``, ``replay_start`` ``(B,)`` int64 (column, absolute first row), what :meth:`write` takes.
        ``at``: ``(columns (B,), starts (B,))`` to read instead of drawing (no generator use).
        Raises ValueError for ``batch`` or ``length`` < 1, or fewer stored rows than a window needs.
        """
        if batch < 1 or length < 1:
            raise ValueError(f"batch and length must be >= 1, got batch={batch} length={length}")
        offset = 1 if self._wrapped else 0  # first valid start position, see the module docstring
        starts = self.fill - length + 1 - offset  # number of valid start positions per column
        if starts < 1:
            within_capacity = length + offset <= self.length
            raise ValueError(
                f"replay holds {self.fill} rows per env but a window of length {length} needs {length + offset}"
                f"{' (one more for the previous action once wrapped)' if offset else ''}: collect more steps first"
                f"{'' if within_capacity else f' or raise replay.capacity (rows per env: {self.length})'}"
            )
        base = self.added - self.fill  # absolute position of time-order position 0
        if at is not None:
            cols, pos = np.asarray(at[0], np.int64), np.asarray(at[1], np.int64) - base
            if cols.shape != (batch,) or pos.shape != (batch,) or (cols < 0).any() or (cols >= self.num_envs).any() \
                    or (pos < offset).any() or (pos >= offset + starts).any():
                raise ValueError(f"sample(at=...): {batch} windows of {length} rows must start within the stored "
                                 f"rows [{base + offset}, {base + offset + starts - 1}] of columns "
                                 f"0..{self.num_envs - 1}")
            online = False
        queued_cols, queued_pos = [], []
        while online and self.queue and len(queued_cols) < batch:
            col, start = self.queue.popleft()
            if offset <= start - base and start + length <= self.added:  # still stored (else dropped, as official)
                queued_cols.append(col)
                queued_pos.append(start - base)
        if at is None:
            rest = batch - len(queued_cols)
            cols = np.concatenate([np.asarray(queued_cols, np.int64),
                                   self.rng.integers(0, self.num_envs, size=rest)])  # (B,)
            pos = np.concatenate([np.asarray(queued_pos, np.int64),
                                  offset + self.rng.integers(0, starts, size=rest)])  # (B,) time-order start positions
        oldest = self.cursor if self._wrapped else 0
        tpos = pos[None, :] + np.arange(length)[:, None]  # (T, B) time-order positions
        rows = (oldest + tpos) % self.length  # (T, B) physical rows
        out = {key: array[rows, cols[None, :]] for key, array in self.arrays.items()}
        # a read fault maps up to 64 KiB around it (fault-around): count 64 KiB per sampled step and key
        self._touch(batch * length * len(self.arrays) * (64 << 10))
        prev = self.arrays["action"][(rows - 1) % self.length, cols[None, :]]  # (T, B, A)
        keep = ~out["is_first"] & (tpos > 0)  # (T, B); tpos 0 only exists before wrapping
        out["prev_action"] = (prev * keep[..., None]).astype(np.float32)
        if index:
            out["replay_column"], out["replay_start"] = cols.astype(np.int64), (base + pos).astype(np.int64)
        return out

    def write(self, column: np.ndarray, start: np.ndarray, values: Mapping[str, np.ndarray]) -> int:
        """Write ``values`` (key -> ``(T, B, *shape)``) into sampled windows' rows (official ``Replay.update``,
        ``replay.py:130-149``): ``column`` ``(B,)``, ``start`` ``(B,)`` the absolute position of ``values``' first row.
        Skips rows overwritten since the sample; returns the rows written (``<= T * B``). Raises KeyError for a key
        not in the spec, ValueError for a shape other than ``(T, B, *shape)``."""
        column, start = np.asarray(column, np.int64), np.asarray(start, np.int64)
        unknown = [key for key in values if key not in self.spec]
        if unknown:
            raise KeyError(f"Replay.write: keys {unknown} are not stored; the spec has {sorted(self.spec)}")
        if not values:
            return 0
        T = len(next(iter(values.values())))
        for key, value in values.items():
            want = (T, len(column), *self.spec[key][0])
            if np.shape(value) != want:
                raise ValueError(f"Replay.write: {key!r} has shape {np.shape(value)}, expected (T, B, ...) = {want}")
        apos = start[None, :] + np.arange(T)[:, None]  # (T, B) absolute positions
        keep = (apos >= self.added - self.fill) & (apos < self.added)  # (T, B) rows still stored
        rows, cols = apos[keep] % self.length, np.broadcast_to(column[None, :], apos.shape)[keep]
        for key, value in values.items():
            self.arrays[key][rows, cols] = np.asarray(value)[keep]
        self._touch(int(keep.sum()) * sum(int(np.asarray(v[0, 0]).nbytes) for v in values.values()))
        return int(keep.sum())

    def state_dict(self) -> dict:
        """Counters, RNG state and the data: ``"arrays"`` (memory, not copies) or flushed ``"files"`` (memmap)."""
        state = {
            "cursor": self.cursor,
            "fill": self.fill,
            "wrapped": self._wrapped,
            "rng": self.rng.bit_generator.state,
            "num_envs": self.num_envs,
            "length": self.length,
            "spec": {key: (list(shape), dtype.str) for key, (shape, dtype) in self.spec.items()},
            "added": self.added,
            "queue": [[int(col), int(start)] for col, start in self.queue],
        }
        if self.storage == "memmap":
            for array in self.arrays.values():
                array.flush()
            state["files"] = {key: os.path.abspath(array.filename) for key, array in self.arrays.items()}
        else:
            state["arrays"] = self.arrays
        return state

    def _check_layout(self, state: Mapping) -> None:
        spec = {key: (list(shape), np.dtype(dtype).str) for key, (shape, dtype) in state["spec"].items()}
        mine = {key: (list(shape), dtype.str) for key, (shape, dtype) in self.spec.items()}
        if (state["num_envs"], state["length"]) != (self.num_envs, self.length) or spec != mine:
            raise ValueError(
                "replay state does not match this buffer: saved "
                f"num_envs={state['num_envs']} rows={state['length']} spec={spec}, this buffer "
                f"num_envs={self.num_envs} rows={self.length} spec={mine}; build the Replay with the saved settings"
            )

    def _is_own_file(self, key: str, path: str) -> bool:
        return self.storage == "memmap" and os.path.abspath(self.arrays[key].filename) == os.path.abspath(path)

    def _restore(self, sources: Mapping[str, str | np.ndarray], state: Mapping) -> None:
        """Copy rows ``[0, fill)`` of each source (array or ``.npy`` path; our own memmap file is left alone), zero
        the rows this buffer wrote past ``fill``, take the state's counters and RNG."""
        fill = int(state["fill"])
        own = all(isinstance(src, str) and self._is_own_file(key, src) for key, src in sources.items())
        for key, source in sources.items():
            array = self.arrays[key]
            if isinstance(source, str):
                if self._is_own_file(key, source):
                    continue
                rows, offset = npy_rows(source)
                if rows < fill:
                    raise ValueError(f"saved replay file {source!r} holds {rows} rows, the replay had {fill}: a "
                                     f"partial write")
                if fill and self.storage == "memmap":
                    array.flush()
                    copy_range(source, offset, array.filename, int(array.offset), fill * bytes_per_row(array))
                elif fill:
                    array[:fill] = np.load(source, mmap_mode="r")[:fill]
            else:
                array[:fill] = source[:fill]
            if self._high > fill:  # rows this buffer wrote itself: zero again, as in the buffer that was saved
                array[fill:self._high] = 0
        self.cursor, self.fill, self._wrapped = int(state["cursor"]), fill, bool(state["wrapped"])
        # snapshots written before the counter existed: any count that agrees with the cursor (no queue then)
        self.added = int(state.get("added", self.length + self.cursor if self._wrapped else fill))
        self.queue = deque((int(col), int(start)) for col, start in state.get("queue", []))
        self.rng.bit_generator.state = state["rng"]
        self._high = self.length if own else fill

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict`; ValueError when its ``num_envs``, rows per env or spec differ."""
        self._check_layout(state)
        self._restore(state["files"] if "files" in state else state["arrays"], state)

    def save(self, directory: str | os.PathLike) -> dict:
        """Write the filled rows, ``(fill, N, ...)`` per key in storage order, as ``<key>.npy`` plus ``replay.json``
        (counters, RNG, layout, ``"sizes"``), all fsync'ed; returns that metadata. Into its own directory a memmap
        buffer only flushes."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        state = self.state_dict()
        for key, array in self.arrays.items():
            path = os.path.join(directory, _file_name(key))
            if self.storage == "memmap" and os.path.exists(path) and os.path.samefile(path, array.filename):
                array.flush()
            else:
                write_rows(array, path, self.fill)
            fsync_path(path)
        meta = {k: v for k, v in state.items() if k not in ("arrays", "files")}
        meta["keys"] = list(self.arrays)
        meta["sizes"] = {key: os.path.getsize(os.path.join(directory, _file_name(key))) for key in self.arrays}
        meta_path = os.path.join(directory, META_FILE)
        with open(meta_path, "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        return meta

    @staticmethod
    def verify(directory: str | os.PathLike) -> dict:
        """Return ``replay.json`` of a complete :meth:`save` in ``directory``. Raises FileNotFoundError for a missing
        file, ValueError for an unreadable ``replay.json`` or a file size other than recorded (a partial write)."""
        directory = os.fspath(directory)
        meta_path = os.path.join(directory, META_FILE)
        if not os.path.exists(meta_path):
            raise FileNotFoundError(f"no saved replay in {directory!r} (missing {META_FILE}); was Replay.save run?")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as err:
            raise ValueError(f"replay metadata {meta_path!r} is unreadable ({err}): the save was interrupted") from err
        for key in meta["keys"]:
            path = os.path.join(directory, _file_name(key))
            if not os.path.exists(path):
                raise FileNotFoundError(f"saved replay {directory!r} lacks {_file_name(key)}")
            want = meta.get("sizes", {}).get(key)
            if want is not None and os.path.getsize(path) != want:
                raise ValueError(f"saved replay file {path!r} has {os.path.getsize(path)} bytes, expected {want}: "
                                 f"a partial write")
        return meta

    def load(self, directory: str | os.PathLike) -> None:
        """Load a :meth:`save` into this same-layout buffer; rows written past the saved ones are zeroed, so it
        samples exactly as the saved one. Raises FileNotFoundError (no complete save), ValueError (other layout,
        truncated file)."""
        directory = os.fspath(directory)
        meta = self.verify(directory)
        self._check_layout(meta)
        self._restore({key: os.path.abspath(os.path.join(directory, _file_name(key))) for key in meta["keys"]}, meta)

    def _touch(self, nbytes: int) -> None:
        if self.storage == "memmap":
            self._touched += nbytes
            if self._touched >= RELEASE_BYTES:
                self.release_memory()

    def release_memory(self) -> None:
        """Memmap: unmap touched pages (``madvise(MADV_DONTNEED)``) so resident memory stays flat; called after
        ``RELEASE_BYTES`` touched. A no-op for memory storage."""
        self._touched = 0
        if self.storage != "memmap":
            return
        for array in self.arrays.values():
            raw = getattr(array, "_mmap", None)
            if raw is not None and hasattr(raw, "madvise"):
                raw.madvise(mmap.MADV_DONTNEED)
