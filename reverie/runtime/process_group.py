"""Data-parallel learning, the process group: one process per device, launched by ``torchrun``.

Each rank collects into its own replay shard and samples its own batch ``(T, B, ...)``; gradients are averaged
after each backward (:func:`reverie.runtime.collectives.average_gradients`), which equals one process on
``(T, nproc * B, ...)``, so the replicas stay identical. Rank 0 alone logs, evaluates and checkpoints. Backend: gloo
on CPU, nccl on CUDA. Wiring and why not ``DistributedDataParallel``: docs/speed.md, "Data-parallel training".
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: ``rank`` of ``world_size`` processes, ``local_rank`` on its node, its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: a single process, no process group

    @property
    def is_main(self) -> bool:
        """Rank 0: logs, evaluates and checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def default_backend(device: str | torch.device) -> str:
    """``"nccl"`` for CUDA devices, ``"gloo"`` otherwise (CPU)."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def launched_by_torchrun(env: dict[str, str] | None = None) -> bool:
    """True when the environment holds every one of :data:`TORCHRUN_VARS`."""
    env = os.environ if env is None else env
    return all(k in env for k in TORCHRUN_VARS)


def init_process_group(device: str = "cpu", backend: str | None = None, init_method: str | None = None,
                       rank: int | None = None, world_size: int | None = None,
                       timeout_s: float | None = None) -> DistInfo:
    """Join the run's process group (a no-op outside torchrun without ``rank``/``world_size``) and return this
    process's :class:`DistInfo`. ``timeout_s`` bounds a collective's wait, so rank 0's evaluation (None: torch's).
    Raises ValueError for ``nccl`` on CPU or only one of ``rank``/``world_size``, RuntimeError for too few GPUs."""
    if (rank is None) != (world_size is None):
        raise ValueError("init_process_group: give both rank and world_size, or neither (torchrun sets them)")
    if rank is None and not launched_by_torchrun():
        return DistInfo(device=torch.device(device))
    rank = int(os.environ["RANK"]) if rank is None else rank
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device(device)
    backend = backend or default_backend(dev)
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError(f"backend 'nccl' needs a CUDA device, got device={device!r}; use backend 'gloo' on CPU")
    if dev.type == "cuda":
        if torch.cuda.device_count() <= local_rank:
            raise RuntimeError(f"rank {rank} (local rank {local_rank}) needs GPU {local_rank}, but only "
                               f"{torch.cuda.device_count()} are visible; start fewer processes (--nproc_per_node)")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        timeout = None if timeout_s is None else datetime.timedelta(seconds=float(timeout_s))
        dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=world_size,
                                timeout=timeout)
    return DistInfo(rank, world_size, local_rank, dev, backend)


def destroy_process_group() -> None:
    """Leave the process group (no-op for a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_seed(seed: int, rank: int) -> int:
    """``seed + 10_000 * rank``: rank 0 keeps the run seed; nearby run seeds never share a rank's streams."""
    return int(seed) + 10_000 * int(rank)


def rank_path(path: str | Path, info: DistInfo) -> Path:
    """``path`` for one process; ``path/rank<r>`` with several (each rank's replay shard, its own files)."""
    return Path(path) / f"rank{info.rank}" if info.distributed else Path(path)

def trainer_settings(trainer: Mapping[str, Any] | None, device: str) -> tuple[int, str | None]:
    """Validate ``cfg.trainer`` and return ``(nproc, backend)``. Raises ValueError for a bad ``nproc`` or
    ``backend``, ``nccl`` off CUDA, more processes than GPUs, or a torch without distributed (or gloo) support."""
    trainer = dict(trainer or {})
    raw = trainer.get("nproc", 1)
    if isinstance(raw, bool) or not isinstance(raw, int) and not (isinstance(raw, str) and raw.strip().isdigit()):
        raise ValueError(f"trainer.nproc must be an integer >= 1 (processes, one per device), got {raw!r}; e.g. "
                         f"trainer.nproc=2")
    nproc = int(raw)
    if nproc < 1:
        raise ValueError(f"trainer.nproc must be >= 1, got {nproc}; 1 trains in this process, 2+ start torchrun")
    backend = trainer.get("backend")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"trainer.backend must be null (gloo on CPU, nccl on CUDA), 'gloo' or 'nccl', got {backend!r}")
    dev = torch.device(device)
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError(f"trainer.backend=nccl needs device=cuda, got device={device!r}; use trainer.backend=gloo "
                         f"(or null) on CPU")
    if nproc > 1:
        if not dist.is_available():
            raise ValueError("trainer.nproc > 1 needs torch.distributed, which this torch build lacks; install a torch "
                             "build with distributed support or set trainer.nproc=1")
        if (backend or default_backend(dev)) == "gloo" and not dist.is_gloo_available():
            raise ValueError("trainer.nproc > 1 on CPU needs the gloo backend, which this torch build lacks; set "
                             "trainer.nproc=1")
        if dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() < nproc:
            raise ValueError(f"trainer.nproc={nproc} needs one GPU per process, but {torch.cuda.device_count()} are "
                             f"visible; set trainer.nproc <= {torch.cuda.device_count()}")
    return nproc, backend
