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

Wiring (docs/speed.md, "Data-parallel training"): ``reverie train ... trainer.nproc=N`` checks the config
(:func:`trainer_settings`), creates the run directory and runs torchrun (:func:`launch`); each rank's
``reverie.train.train`` calls :func:`init_process_group`, seeds with :func:`rank_seed`, keeps its replay shard in
:func:`rank_path` and its checkpoints in :func:`checkpoint_dir`, broadcasts the agent, shares the loop's decisions
(:func:`broadcast_int`, :func:`agree`) and leaves with :func:`destroy_process_group`; the agents call
:func:`average_gradients` after each backward, :func:`all_finite` before each optimiser step and
:func:`all_gather_cat` for the return percentiles.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

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


def rank_path(path: str | Path, info: DistInfo) -> Path:
    """``path`` for one process; ``path/rank<r>`` with several (each rank's replay shard, its own files)."""
    return Path(path) / f"rank{info.rank}" if info.distributed else Path(path)


class SignalFlag:
    """While active, SIGINT and SIGTERM set :attr:`raised` instead of raising ``KeyboardInterrupt``.

    With several ranks an exception in the middle of an update would leave the others waiting in a collective;
    a flag that the loop shares through :func:`agree` once per env step stops every rank after the same step.
    Main thread only (Python's rule for signal handlers); elsewhere it installs nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.raised = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        self.raised = True

    def install(self) -> SignalFlag:
        """Put the flag's handler in place (main thread only); :meth:`restore` puts the previous ones back."""
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def __enter__(self) -> SignalFlag:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.restore()


def checkpoint_dir(run_dir: str | Path, info: DistInfo) -> Path:
    """Where this rank's checkpoints go: ``run_dir/checkpoints`` for rank 0 (the run's checkpoint, with the agent,
    what ``reverie eval`` and ``load_run`` read), ``run_dir/rank<r>/checkpoints`` for the other ranks (their
    replay, RNG, env and loop state; the agent is rank 0's)."""
    run_dir = Path(run_dir)
    return run_dir / "checkpoints" if info.is_main else run_dir / f"rank{info.rank}" / "checkpoints"


def load_rank_checkpoint(run_dir: str | Path, info: DistInfo) -> dict[str, Any] | None:
    """This rank's checkpoint to resume from, or None for a fresh run; every rank resumes the same env step.

    Rank 0 takes its newest readable checkpoint (:func:`reverie.checkpoint.load_checkpoint`) and tells the others
    its env step; rank ``r`` loads its own checkpoint of that step and rank 0's agent of that step (the replicas
    are identical; the digest stored by rank ``r`` is checked against it with :func:`check_digest`).

    Raises:
        RuntimeError: rank 0 has a checkpoint at a step for which rank ``r`` has none (its files were removed or
            the run was started with fewer processes); the message names the file and the fix.
    """
    from reverie.checkpoint import list_checkpoints, load_checkpoint

    run_dir = Path(run_dir)
    if not info.distributed:
        return load_checkpoint(run_dir) if list_checkpoints(run_dir / "checkpoints") else None
    saved = None
    if info.is_main and list_checkpoints(run_dir / "checkpoints"):
        saved = load_checkpoint(run_dir)
    step = broadcast_int(-1 if saved is None else int(saved["counters"]["env_steps"]), info)
    if step < 0 or info.is_main:
        return saved
    mine = checkpoint_dir(run_dir, info) / f"ckpt_{step:010d}.pt"
    if not mine.is_file():
        raise RuntimeError(f"rank {info.rank}: rank 0 resumes from env step {step}, but {mine} is missing; every "
                           f"rank needs its own checkpoint of that step (resume with the run's trainer.nproc, and "
                           f"keep the rank<r>/ folders), or start a new run in another run_dir")
    saved = load_checkpoint(mine)
    saved["agent"] = load_checkpoint(run_dir / "checkpoints" / mine.name)["agent"]
    return saved


def check_digest(module: nn.Module, expected: str | None, info: DistInfo) -> None:
    """Raise unless ``module``'s :func:`param_digest` equals ``expected`` (None: nothing to check).

    Raises:
        RuntimeError: the replica this rank saved differs from rank 0's agent of the same step.
    """
    if expected is not None and param_digest(module) != expected:
        raise RuntimeError(f"rank {info.rank}: its saved agent digest differs from rank 0's checkpoint of the same "
                           f"step; the replicas had diverged before that checkpoint, so it cannot be resumed exactly")


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
