"""Collectives of data-parallel learning: what the ranks exchange during a run (no-ops in one process)."""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from reverie.runtime.process_group import DistInfo

def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy ``module``'s parameters and buffers from rank ``src`` to every rank (in place; no-op alone)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src)


def average_gradients(params: Iterable[torch.Tensor], info: DistInfo | None = None) -> None:
    """Replace each ``.grad`` by its mean over ranks with one flat all-reduce per dtype (no-op alone). Call it
    between backward and clipping with the same ``params`` in the same order on every rank; a ``.grad`` None on
    every rank stays None, on some ranks counts as zeros."""
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
    """Every rank's same-shaped ``tensor`` concatenated along ``dim`` (e.g. for return percentiles); gradients
    flow into this rank's part only."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    parts[dist.get_rank()] = tensor  # keeps this rank's autograd graph
    return torch.cat(parts, dim)


def _comm_device(info: DistInfo) -> torch.device:
    """Where small tensors for collectives live: the GPU for nccl (it only moves CUDA tensors), else the CPU."""
    return info.device if info.backend == "nccl" else torch.device("cpu")


def all_finite(loss: torch.Tensor) -> bool:
    """True when the scalar ``loss`` is finite on every rank (True alone): a shared skip decision keeps the replicas
    equal."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    flag = torch.isfinite(loss.detach().float()).to(torch.int32).reshape(1)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def agree(flags: Mapping[str, bool], info: DistInfo) -> dict[str, bool]:
    """Each flag set when set on any rank (same keys in the same order everywhere): all ranks stop together."""
    if not info.distributed:
        return dict(flags)
    values = torch.tensor([int(bool(v)) for v in flags.values()], dtype=torch.int32, device=_comm_device(info))
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return {k: bool(v) for k, v in zip(flags, values.tolist())}


def broadcast_int(value: int, info: DistInfo, src: int = 0) -> int:
    """Rank ``src``'s ``value`` on every rank (the updates owed, so every rank runs the same updates)."""
    if not info.distributed:
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device(info))
    dist.broadcast(tensor, src)
    return int(tensor.item())


def param_digest(module: nn.Module) -> str:
    """SHA-256 of ``module``'s parameters and buffers (names, dtypes, shapes, bytes): equal when the replicas are
    bit-identical; checked on resume."""
    h = hashlib.sha256()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # (numel,) -> (numel * itemsize,) bytes
    return h.hexdigest()

