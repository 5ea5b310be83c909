"""Starting a data-parallel run: ``reverie train ... trainer.nproc=N`` runs ``N`` copies of itself through torchrun."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys

import torch.distributed as dist

from reverie.runtime.signals import SignalFlag

def torchrun_command(nproc: int, args: list[str], module: str = "reverie", shutdown_timeout_s: int = 600) -> list[str]:
    """``python -m torch.distributed.run --standalone ... -m <module> <args>`` for ``nproc`` local processes (no
    ``torchrun`` on PATH needed); ``shutdown_timeout_s`` lets the ranks checkpoint after a signal (torchrun: 30 s).
    Raises ValueError for ``nproc < 1``, RuntimeError when ``torch.distributed.run`` is not importable."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if not dist.is_available() or importlib.util.find_spec("torch.distributed.run") is None:
        raise RuntimeError("trainer.nproc > 1 needs torchrun (torch.distributed.run), which this torch install lacks; "
                           "install a torch build with distributed support or set trainer.nproc=1")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--shutdown-timeout={int(shutdown_timeout_s)}", "-m", module, *args]


def launch(nproc: int, args: list[str]) -> int:
    """Run ``reverie <args>`` in ``nproc`` processes through torchrun and return its exit status (130 after a
    forwarded SIGINT/SIGTERM). torchrun gets its own session so a Ctrl-C reaches it once, through this process.
    Raises RuntimeError when torchrun is unavailable."""
    proc = subprocess.Popen(torchrun_command(nproc, args), start_new_session=True)
    forwarded = []

    def forward(signum, frame):
        forwarded.append(signum)
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in SignalFlag.SIGNALS}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 130 if forwarded else code
