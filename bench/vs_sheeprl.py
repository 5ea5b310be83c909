"""reverie's DreamerV3 update vs sheeprl 0.8.4's, side by side in one run of this script (docs/speed.md).

    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_sheeprl.py                     # xs and s, 1 thread
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_sheeprl.py --sizes xs --updates 10 --threads 2
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_sheeprl.py --compile           # reverie also with compile=True

Run from the repository root. Steps:
1. makes sure sheeprl is installed in a throwaway venv OUTSIDE the repository (``--venv``, default
   ~/.cache/reverie/sheeprl-venv): ``python -m venv``, then ``pip install torch==<this torch>`` first (so the CPU build
   already here is reused and no CUDA build is pulled), then ``pip install sheeprl==0.8.4``; skipped when the venv
   already has both versions;
2. per size, runs sheeprl's own DreamerV3 (``sheeprl.cli.run()``) on CartPole-v1 vector observations through
   bench/sheeprl_launcher.py, which wraps sheeprl's gradient-step function ``train`` with a timer and stops the
   run after ``--warmup`` + ``--updates`` steps or ``--max-seconds``; sheeprl's algorithm is unchanged;
3. times reverie's full update (world model + imagination + actor + critic) at the same sizes on a batch of the
   same shape, in this process, with the same thread count and float32 (sheeprl's ``fabric.precision=32-true``);
4. prints both medians and the ratio sheeprl / reverie (> 1: reverie is faster), in wall ms/update and in process
   CPU ms/update (which other jobs on a shared machine inflate less than wall time).

Sizes (sheeprl ``algo=dreamer_v3_<X>`` vs reverie ``size=<x>``): dense units, MLP layers, recurrent (deter) size,
32 x 32 latents, batch 16 x 64 (``per_rank_batch_size``/``per_rank_sequence_length`` of ``exp=dreamer_v3``),
horizon 15: xs = 256/1/256, s = 512/2/512. Both time the update alone, not batch sampling or env steps.
Numbers on a shared machine are inflated by whatever else runs; compare the ratio, and re-run for the spread.
"""

from __future__ import annotations

import os
import sys

# `python bench/<script>.py` puts bench/ first on the import path, so the installed `reverie` (maybe another
# checkout's, through an editable install) would be imported. The repository root goes there instead, so this
# tree's `reverie` and `bench` are the ones imported.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import statistics
import subprocess
from pathlib import Path

import torch

from bench.peer_venv import outside_repo, run_steps, timed_peer_run
from bench.run import cartpole_batch, sized
from bench.timing import time_calls
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec

SHEEPRL_VERSION = "0.8.4"
SHEEPRL_ALGO = {"xs": "dreamer_v3_XS", "s": "dreamer_v3_S", "m": "dreamer_v3_M", "l": "dreamer_v3_L",
                "xl": "dreamer_v3_XL"}
# The comparison's setup: CartPole-v1 vector obs, no CNN, CPU, nothing written that is not needed. sync_env: the envs
# step in this process (no worker processes competing for the CPU; env steps are not timed either way).
SHEEPRL_OVERRIDES = ["exp=dreamer_v3", "env=gym", "env.id=CartPole-v1", "algo.cnn_keys.encoder=[]",
                     "algo.cnn_keys.decoder=[]", "algo.mlp_keys.encoder=[vector]", "algo.mlp_keys.decoder=[vector]",
                     "fabric.accelerator=cpu", "env.capture_video=False", "algo.run_test=False", "buffer.memmap=False",
                     "checkpoint.save_last=False", "env.sync_env=True"]
LAUNCHER = Path(__file__).resolve().with_name("sheeprl_launcher.py")


def venv_versions(python: Path) -> tuple[str, str] | None:
    """``(torch, sheeprl)`` versions installed in the venv of ``python``, or None if either is missing."""
    if not python.exists():
        return None
    probe = "import torch, importlib.metadata as m; print(torch.__version__, m.version('sheeprl'))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return tuple(done.stdout.split()) if done.returncode == 0 else None  # type: ignore[return-value]


def ensure_sheeprl(venv: Path, torch_version: str, sheeprl_version: str) -> Path:
    """Install torch, then sheeprl, into ``venv`` unless they are there already; returns its python.

    Raises:
        ValueError: ``venv`` inside this repository (it must stay a throwaway outside it).
        RuntimeError: a pip step failed (its output is printed).
    """
    venv = outside_repo(venv, "--venv")
    python = venv / "bin" / "python"
    have = venv_versions(python)
    if have and have[0].split("+")[0] == torch_version and have[1] == sheeprl_version:
        print(f"[vs_sheeprl] {venv}: torch {have[0]}, sheeprl {have[1]} already installed")
        return python
    steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps += [[str(python), "-m", "pip", "install", "-q", f"torch=={torch_version}"],
              [str(python), "-m", "pip", "install", "-q", f"sheeprl=={sheeprl_version}"]]
    run_steps(steps, "vs_sheeprl")
    return python


def time_sheeprl(python: Path, size: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per sheeprl DreamerV3 update (after ``--warmup``), from one bounded sheeprl run."""
    def command(folder: Path, out: Path) -> list[str]:  # sheeprl's logs/ and hydra outputs go into the folder
        return [str(python), str(LAUNCHER), "--out", str(out), "--warmup", str(args.warmup), "--updates",
                str(args.updates), "--max-seconds", str(args.max_seconds), "--threads", str(args.threads), "--",
                *SHEEPRL_OVERRIDES, f"algo={SHEEPRL_ALGO[size]}", "algo.total_steps=1000000"]

    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    return timed_peer_run(command, env, args.max_seconds + 600, f"sheeprl run for size {size}", "vs_sheeprl_")


def time_reverie(size: str, args: argparse.Namespace, compile_: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per reverie DreamerV3 update at ``size`` (after ``--warmup``), batch 16 x 64, H 15,
    in ``--precision`` (float32 by default, as sheeprl's ``32-true``)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **sized(size, horizon=15, precision=args.precision,
                                                                     compile=compile_))
    batch = cartpole_batch(64, 16)
    return time_calls(lambda: agent.update(batch), args.warmup, args.updates, args.max_seconds)


def summary(times: list[float], cpu_times: list[float]) -> str:
    return (f"wall median {statistics.median(times) * 1e3:7.0f} ms/update (n={len(times)}, min {min(times) * 1e3:.0f}, "
            f"max {max(times) * 1e3:.0f}); CPU median {statistics.median(cpu_times) * 1e3:7.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["xs", "s"], choices=sorted(SHEEPRL_ALGO))
    parser.add_argument("--updates", type=int, default=8, help="timed updates per side and size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates first (each side)")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="time bound per side and size")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "reverie" / "sheeprl-venv",
                        help="throwaway sheeprl venv")
    parser.add_argument("--compile", action="store_true", help="also time reverie with compile=True")
    parser.add_argument("--precision", default="float32", choices=["float32", "auto", "bfloat16"],
                        help="reverie's precision (float32 matches sheeprl's fabric.precision=32-true)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)
    torch_version = torch.__version__.split("+")[0]
    python = ensure_sheeprl(args.venv, torch_version, SHEEPRL_VERSION)
    print(f"[vs_sheeprl] torch {torch.__version__}, {args.threads} thread(s), CPU, sheeprl 32-true, reverie "
          f"{args.precision}; CartPole-v1 vector obs; "
          f"batch 16 x 64, horizon 15; {args.warmup} warm-up + up to {args.updates} timed updates per side")
    rows = []
    for size in args.sizes:
        theirs = time_sheeprl(python, size, args)
        print(f"sheeprl {SHEEPRL_VERSION:<7} {SHEEPRL_ALGO[size]:<14} {summary(*theirs)}", flush=True)
        variants = [("reverie", False)] + ([("reverie compile", True)] if args.compile else [])
        for label, compile_ in variants:
            mine = time_reverie(size, args, compile_)
            print(f"{label:<15} size={size:<9} {summary(*mine)}", flush=True)
            rows.append((size, label, *(statistics.median(t) for t in (*theirs, *mine))))
    print("\nmedians, ms/update   sheeprl wall  reverie wall  ratio |  sheeprl CPU  reverie CPU  ratio  (ratio = "
          "sheeprl/reverie, > 1: reverie faster)")
    for size, label, wall_theirs, cpu_theirs, wall_mine, cpu_mine in rows:
        print(f"{size:<4} {label:<15} {wall_theirs * 1e3:12.0f}  {wall_mine * 1e3:12.0f} "
              f"{wall_theirs / wall_mine:5.2f}x |"
              f" {cpu_theirs * 1e3:11.0f}  {cpu_mine * 1e3:11.0f} {cpu_theirs / cpu_mine:5.2f}x")


if __name__ == "__main__":
    main()
