"""Replay memory and checkpoint IO (issue 6). Prints numbers; not part of `make test`.

    .venv/bin/python bench/replay_memory.py                          # 1e6 64x64x3 frames, memmap (12.3 GB disk)
    .venv/bin/python bench/replay_memory.py --frames 200000 --dir /tmp/replay_bench
    .venv/bin/python bench/replay_memory.py --storage memory --frames 100000   # the contrast: RSS grows

Reports:
- resident memory (VmRSS, and its anonymous / file-backed parts from /proc/self/status) every 10% while
  inserting ``--frames`` uint8 (3, 64, 64) frames into a replay of that capacity, sampling a 16 x 64 batch
  every 64 inserts as training would;
- checkpoint write time: ``save_checkpoint`` with the replay snapshot (file to file copy), GB/s;
- checkpoint read time: ``load_checkpoint`` + ``Replay.load`` into a fresh buffer in the same folder (what a
  resumed run does), GB/s.
The page cache is not dropped between write and read (needs root), so read numbers can be cache-warm.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from reverie.state.checkpoint import load_checkpoint, save_checkpoint
from reverie.replay import Replay

SPEC = {"image": ((3, 64, 64), np.uint8), "action": ((18,), np.float32), "reward": ((), np.float32),
        "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}


def rss() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile of this process in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000, help="frames inserted (= replay capacity)")
    parser.add_argument("--envs", type=int, default=16, help="parallel env columns (frames per add)")
    parser.add_argument("--storage", default="memmap", choices=("memmap", "memory"))
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temp dir, removed at the end)")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="reverie_replay_bench_")
    os.makedirs(root, exist_ok=True)
    n = args.envs
    replay = Replay(args.frames, n, SPEC, storage=args.storage, directory=os.path.join(root, "live"), seed=0)
    frame_bytes = int(np.prod(SPEC["image"][0]))
    total_gb = replay.capacity * replay.row_bytes / n / 1e9
    print(f"[bench] {args.storage} replay: {replay.capacity:,} frames x {frame_bytes:,} bytes (uint8 3x64x64) "
          f"+ action/reward/flags = {total_gb:.2f} GB; {n} envs per add; folder {root}")
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, (64, n, 3, 64, 64), dtype=np.uint8)  # reused frames: the bench measures memory
    row = {"action": np.zeros((n, 18), np.float32), "reward": np.zeros(n, np.float32),
           "is_first": np.zeros(n, bool), "is_last": np.zeros(n, bool), "is_terminal": np.zeros(n, bool)}
    adds = replay.length
    print(f"{'frames':>12} {'VmRSS MiB':>10} {'anon MiB':>9} {'file MiB':>9} {'s':>7}")
    start = time.time()
    base = rss()
    print(f"{0:>12,} {base['VmRSS']:>10.0f} {base['RssAnon']:>9.0f} {base['RssFile']:>9.0f} {0:>7.1f}")
    peak = base["VmRSS"]
    for i in range(adds):
        row["image"] = block[i % 64]
        replay.add(row)
        if i % 64 == 63 and replay.num_rows > 65:
            replay.sample(16, 64)
        if (i + 1) % max(1, adds // 10) == 0 or i + 1 == adds:
            now = rss()
            peak = max(peak, now["VmRSS"])
            print(f"{(i + 1) * n:>12,} {now['VmRSS']:>10.0f} {now['RssAnon']:>9.0f} {now['RssFile']:>9.0f} "
                  f"{time.time() - start:>7.1f}", flush=True)
    insert_s = time.time() - start
    print(f"[bench] inserted {adds * n:,} frames in {insert_s:.1f} s ({adds * n / insert_s:,.0f} frames/s); "
          f"VmRSS {base['VmRSS']:.0f} -> peak {peak:.0f} MiB")

    ckpts = os.path.join(root, "checkpoints")
    t = time.time()
    save_checkpoint(ckpts, adds * n, {"step": adds * n}, replay=replay)
    write_s = time.time() - t
    print(f"[bench] checkpoint write (replay snapshot, fsync'ed): {write_s:.1f} s, {total_gb / write_s:.2f} GB/s; "
          f"VmRSS {rss()['VmRSS']:.0f} MiB")
    cursor, stored = replay.cursor, len(replay)
    del replay  # a resumed run rebuilds its replay in the same folder, then loads the snapshot over it
    fresh = Replay(args.frames, n, SPEC, storage=args.storage, directory=os.path.join(root, "live"), seed=1)
    t = time.time()
    payload = load_checkpoint(ckpts)
    fresh.load(payload["replay_dir"])
    read_s = time.time() - t
    assert fresh.cursor == cursor and len(fresh) == stored
    print(f"[bench] checkpoint read (verify + Replay.load): {read_s:.1f} s, {total_gb / read_s:.2f} GB/s; "
          f"VmRSS {rss()['VmRSS']:.0f} MiB")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
