"""Data-parallel learning with ``torch.distributed``: one process per device, launched by ``torchrun``.

Each rank collects with its own envs into its own replay (its shard of the data, seeded by :func:`rank_seed`),
samples its own batch ``(T, B, ...)``, and runs the agent's update; after each backward pass the gradients are
averaged over ranks (:func:`average_gradients`) before clipping and the optimiser step. Since every loss is a mean
over equal-sized batches, the averaged gradient equals the single-process gradient on the concatenated batch
``(T, nproc * B, ...)``, so every rank takes the same optimiser step and the replicas stay identical (they start
identical through :func:`broadcast_module`). Rank 0 alone logs, evaluates and writes checkpoints (:attr:`DistInfo.
is_main`). Backend: gloo on CPU, nccl on CUDA (:func:`default_backend`).

Why not ``torch.nn.parallel.DistributedDataParallel``: DreamerV3 updates three modules with three optimisers from
three backward passes per update, two of them restricted with ``backward(inputs=...)`` and one through the world
model into the actor (continuous actions). DDP's reducer expects one forward through its wrapper and one backward
reaching every parameter (or ``find_unused_parameters`` on every step); explicit averaging after each backward does
the same collective work (one flat all-reduce per optimiser) without those constraints.

Wiring (a few lines, see docs/speed.md): ``info = init_process_group(cfg.device)`` at the start of a run,
``broadcast_module(agent)`` after building the agent, ``average_gradients(params, info)`` between each
``backward`` and ``clip_grad_norm_``, ``rank_seed(cfg.seed, info.rank)`` for envs and replay, logging only where
``info.is_main``, and :func:`destroy_process_group` at the end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

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
                       rank: int | None = None, world_size: int | None = None) -> DistInfo:
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
        dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=world_size)
    return DistInfo(rank, world_size, local_rank, dev, backend)


def destroy_process_group() -> None:
    """Leave the process group (no-op for a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s envs and replay sampling: ``seed + 10_000 * rank`` (rank 0 keeps the run seed, so a
    one-process run is unchanged; ranks never share env or sampling streams for runs with nearby seeds)."""
    return int(seed) + 10_000 * int(rank)


def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy ``module``'s parameters and buffers from rank ``src`` to every rank (in place; no-op alone)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src)


def average_gradients(params: Iterable[torch.Tensor], info: DistInfo | None = None) -> None:
    """Replace each parameter's ``.grad`` by its mean over ranks (in place; no-op for a single process).

    All gradients go into one flat buffer and one all-reduce (per dtype), so the cost is one collective per call
    however many tensors a module has. A parameter whose ``.grad`` is None on every rank stays None (as in a
    single process, the optimiser then skips it); None on some ranks only counts as zeros there. Call it between
    ``loss.backward()`` and ``clip_grad_norm_``, with the same ``params`` in the same order on every rank.

    Args:
        params: the parameters one optimiser steps (e.g. ``agent.wm.parameters()``).
        info: from :func:`init_process_group`; None reads the default process group.
    """
    if info is not None and not info.distributed:
        return
    if not (dist.is_available() and dist.is_initialized()):
        return
    world = dist.get_world_size()
    if world == 1:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    device = params[0].device
    has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=device)
    dist.all_reduce(has_grad, op=dist.ReduceOp.MAX)
    used = [p for p, flag in zip(params, has_grad.tolist()) if flag]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])  # k x (numel_i,) -> (sum numel_i,)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world)
        offset = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


def all_gather_cat(tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank along ``dim`` (rank order); ``tensor`` itself for one process.

    For statistics that must see the whole global batch rather than a mean of per-rank values, e.g. the 5th/95th
    return percentiles of DreamerV3's return normaliser. Every rank's ``tensor`` must have the same shape (equal
    per-rank batches). Gradients flow only into this rank's own part, not into the copies from other ranks.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    parts[dist.get_rank()] = tensor  # keeps this rank's autograd graph
    return torch.cat(parts, dim)


def torchrun_command(nproc: int, args: list[str], module: str = "reverie") -> list[str]:
    """The command line that starts ``nproc`` processes of ``python -m <module> <args>`` on this machine:
    ``torchrun --standalone --nproc_per_node <nproc> -m reverie train ...``.

    Raises:
        ValueError: ``nproc < 1``.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    return ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m", module, *args]
