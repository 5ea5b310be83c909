"""Collectives of data-parallel learning: what the ranks exchange during a run (no-ops in one process).

The agents call :func:`average_gradients` after each backward pass (through ``WorldModelAgent._step``),
:func:`all_finite` before each optimiser step and :func:`all_gather_cat` for the return percentiles; the loop calls
:func:`broadcast_module` once, :func:`broadcast_int` for the updates owed and :func:`agree` for stopping; the
checkpoints of ranks > 0 hold :func:`param_digest`. See :mod:`reverie.runtime.process_group` for the setup.
"""

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


def _comm_device(info: DistInfo) -> torch.device:
    """Where small tensors for collectives live: the GPU for nccl (it only moves CUDA tensors), else the CPU."""
    return info.device if info.backend == "nccl" else torch.device("cpu")


def all_finite(loss: torch.Tensor) -> bool:
    """True when ``loss`` (a scalar) is finite on every rank; True without any communication for one process
    (the caller checks its own loss there).

    DreamerV3 skips an optimiser step whose loss or gradient is non-finite; the averaged gradient norm is the same
    on every rank, but the losses are not, so the decision is shared, or one rank would step while another skips
    and the replicas would part.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    flag = torch.isfinite(loss.detach().float()).to(torch.int32).reshape(1)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def agree(flags: Mapping[str, bool], info: DistInfo) -> dict[str, bool]:
    """Each flag set when it is set on any rank (one small all-reduce; ``flags`` itself for one process).

    The training loop calls it once per env step so that every rank stops (interrupt, ``stop_return`` reached on
    rank 0's evaluation) after the same env step, and their checkpoints match. Same keys in the same order on
    every rank.
    """
    if not info.distributed:
        return dict(flags)
    values = torch.tensor([int(bool(v)) for v in flags.values()], dtype=torch.int32, device=_comm_device(info))
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return {k: bool(v) for k, v in zip(flags, values.tolist())}


def broadcast_int(value: int, info: DistInfo, src: int = 0) -> int:
    """Rank ``src``'s ``value`` on every rank (``value`` itself for one process). The loop uses it for the number
    of updates owed, so an update schedule that counts episodes (PlaNet) runs the same updates on every rank."""
    if not info.distributed:
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device(info))
    dist.broadcast(tensor, src)
    return int(tensor.item())


def param_digest(module: nn.Module) -> str:
    """SHA-256 of ``module``'s parameters and buffers (names, dtypes, shapes, bytes), in registration order.

    Equal on two ranks exactly when their replicas are bit-identical; stored in the checkpoints of ranks > 0 and
    checked against rank 0's agent on resume.
    """
    h = hashlib.sha256()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # (numel,) -> (numel * itemsize,) bytes
    return h.hexdigest()

