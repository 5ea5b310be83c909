"""Data-parallel learning, the process group: one process per device, launched by ``torchrun``.

Each rank collects with its own envs into its own replay (its shard of the data, seeded by :func:`rank_seed`),
samples its own batch ``(T, B, ...)`` and runs the agent's update; after each backward pass the gradients are
averaged over ranks (:func:`reverie.runtime.collectives.average_gradients`) before clipping and the optimiser step.
Since every loss is a mean over equal-sized batches, the averaged gradient equals the single-process gradient on
the concatenated batch ``(T, nproc * B, ...)``, so every rank takes the same optimiser step and the replicas stay
identical (they start identical through :func:`reverie.runtime.collectives.broadcast_module`). Rank 0 alone logs,
evaluates and writes the run's checkpoint (:attr:`DistInfo.is_main`). Backend: gloo on CPU, nccl on CUDA.

Why not ``torch.nn.parallel.DistributedDataParallel``: DreamerV3 updates three modules with three optimisers from
three backward passes per update, restricted with ``backward(inputs=...)``, one of them through the world model
into the actor (continuous actions). DDP's reducer expects one forward through its wrapper and one backward
reaching every parameter (or ``find_unused_parameters`` on every step); explicit averaging after each backward does
the same collective work (one flat all-reduce per optimiser) without those constraints.

Wiring (docs/speed.md, "Data-parallel training"): ``reverie train ... trainer.nproc=N`` checks the config
(:func:`trainer_settings`), creates the run directory and runs torchrun (:mod:`reverie.runtime.launch`); each
rank's ``reverie.train.train`` calls :func:`init_process_group`, seeds with :func:`rank_seed`, keeps its replay
shard in :func:`rank_path` and its checkpoints in :func:`reverie.state.ranks.checkpoint_dir`, shares the loop's
decisions (:mod:`reverie.runtime.collectives`) and leaves with :func:`destroy_process_group`.
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
        """Rank 0: the one process that logs, evaluates and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def default_backend(device: str | torch.device) -> str:
    """``"nccl"`` for CUDA devices, ``"gloo"`` otherwise (CPU)."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def launched_by_torchrun(env: dict[str, str] | None = None) -> bool:
    """True when ``torchrun`` (or an equivalent launcher) set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
    rendezvous address in the environment."""
    env = os.environ if env is None else env
    return all(k in env for k in TORCHRUN_VARS)


def init_process_group(device: str = "cpu", backend: str | None = None, init_method: str | None = None,
                       rank: int | None = None, world_size: int | None = None,
                       timeout_s: float | None = None) -> DistInfo:
    """Join the process group of this run and return this process's :class:`DistInfo`.

    Without ``torchrun`` variables and without explicit ``rank``/``world_size`` it returns the single-process
    info (rank 0 of 1, no process group), so callers need no special case. Under ``torchrun`` a CUDA ``device``
    becomes ``cuda:<LOCAL_RANK>`` (one GPU per process).

    Args:
        device: the run's device (``cfg.device``): ``"cpu"``, ``"cuda"``, ``"cuda:0"``.
        backend: ``"gloo"`` or ``"nccl"``; None picks :func:`default_backend`.
        init_method: rendezvous URL (``"env://"`` under torchrun; ``"file:///tmp/x"`` or ``"tcp://host:port"``
            for processes started otherwise, e.g. by tests).
        rank, world_size: given with ``init_method`` when not launched by torchrun.
        timeout_s: how long a collective waits for the other ranks before failing (None: torch's default, 30
            minutes for gloo). Rank 0 evaluates while the others wait, so this bounds an evaluation's length.

    Raises:
        ValueError: ``nccl`` asked for a CPU device, or only one of ``rank``/``world_size`` given.
        RuntimeError: a CUDA device under torchrun with fewer visible GPUs than ``LOCAL_RANK + 1``.
    """
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
    """Seed of rank ``rank``'s envs and replay sampling: ``seed + 10_000 * rank`` (rank 0 keeps the run seed, so a
    one-process run is unchanged; ranks never share env or sampling streams for runs with nearby seeds)."""
    return int(seed) + 10_000 * int(rank)


def rank_path(path: str | Path, info: DistInfo) -> Path:
    """``path`` for one process; ``path/rank<r>`` with several (each rank's replay shard, its own files)."""
    return Path(path) / f"rank{info.rank}" if info.distributed else Path(path)

def trainer_settings(trainer: Mapping[str, Any] | None, device: str) -> tuple[int, str | None]:
    """Validate the ``trainer`` config block and return ``(nproc, backend)``.

    Args:
        trainer: ``cfg.trainer`` (``nproc``, ``backend``; None or a missing key: one process, default backend).
        device: ``cfg.device``.

    Raises:
        ValueError: ``nproc`` not an integer >= 1; ``backend`` not null/gloo/nccl; ``nccl`` on a non-CUDA device;
            several processes on one CUDA device count larger than the visible GPUs; torch without distributed
            support, or without gloo on CPU.
    """
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
