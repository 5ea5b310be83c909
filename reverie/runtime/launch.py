"""Starting a data-parallel run: ``reverie train ... trainer.nproc=N`` runs ``N`` copies of itself through torchrun."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys

import torch.distributed as dist

from reverie.runtime.signals import SignalFlag

def torchrun_command(nproc: int, args: list[str], module: str = "reverie", shutdown_timeout_s: int = 600) -> list[str]:
    """The command line that starts ``nproc`` processes of ``python -m <module> <args>`` on this machine:
    ``python -m torch.distributed.run --standalone --nproc-per-node <nproc> ... -m reverie train ...`` (what the
    ``torchrun`` script runs, with this interpreter, so no ``torchrun`` on PATH is needed).

    ``shutdown_timeout_s``: how long torchrun lets the ranks write their final checkpoint after it forwards a
    SIGINT/SIGTERM, before it kills them (torchrun's own default is 30 s).

    Raises:
        ValueError: ``nproc < 1``.
        RuntimeError: ``torch.distributed.run`` (torchrun) is not importable.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if not dist.is_available() or importlib.util.find_spec("torch.distributed.run") is None:
        raise RuntimeError("trainer.nproc > 1 needs torchrun (torch.distributed.run), which this torch install lacks; "
                           "install a torch build with distributed support or set trainer.nproc=1")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--shutdown-timeout={int(shutdown_timeout_s)}", "-m", module, *args]


def launch(nproc: int, args: list[str]) -> int:
    """Run ``reverie <args>`` in ``nproc`` processes through torchrun and wait; returns torchrun's exit status.

    torchrun runs in its own session, so a Ctrl-C in the terminal reaches it once, forwarded by this process
    (SIGINT and SIGTERM are forwarded); it passes the signal on to the ranks, which stop after the same env step
    and checkpoint (see :class:`SignalFlag`). Returns 130 after a forwarded SIGINT/SIGTERM.

    Raises:
        RuntimeError: torchrun is unavailable (see :func:`torchrun_command`).
    """
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
