"""Where one DreamerV3 update spends its time: phases, top torch ops, and (optionally) py-spy Python frames.

    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_update.py --size xs             # phases + top ops
    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_update.py --size s --updates 2 --top 20
    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_update.py --size xs --py-spy    # + Python-level hot frames
    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_update.py --size xs --compile   # the agent's compile option on
    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_update.py --size xs --flops     # + FLOPs by module, time floor
    .venv/bin/python bench/profile_update.py --trace trace.json                       # + a Chrome trace
    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_update.py --agent dreamerv3_2025 --py-spy --flops

(Not named ``profile.py``: run as a script from bench/, that name would shadow the standard library's ``profile``,
which ``cProfile`` imports, in every other script there.)

Run from the repository root. The update is reverie's full one (world model + imagination + actor + critic) on
CartPole-sized vector inputs, batch 16 x 64, horizon 15 (the shapes of bench/run.py and bench/vs_sheeprl.py).
``--agent dreamerv3_2025``: the current official agent's update at bench/vs_jax.py's matched widths and batch (DMC
cartpole_swingup shapes, 16 x 64 trained rows plus the replay context's row; ``--size`` and ``--compile`` are not
read, ``--precision`` and ``--kernels`` are), its phases being the world model's loss (of it the observe scan), the
imagination rollout and its heads, the imagination and replay value losses, the one backward pass, the gradient
norm, the LaProp step.

Reports, per profiled update (after one untimed warm-up update):
1. phases: wall ms of each part of the update, measured by wrapping the agent's own methods on the instance
   (nothing in the package is changed): world-model forward (of it: the observe scan), the three backward
   passes, gradient clipping, optimiser steps, the imagination rollout, and the rest;
2. the top ``--top`` torch ops by self CPU time (``torch.profiler``), with call counts: many calls of cheap ops
   is per-step Python/dispatcher overhead, few calls of costly ops is arithmetic;
3. with ``--py-spy`` (``pip install py-spy``, or the ``bench`` extra): the script re-runs itself under
   ``py-spy record`` and prints, for the samples taken inside ``DreamerV3.update``, the Python functions with the
   most samples (own and inclusive): where interpreter time goes;
4. with ``--flops``: GFLOP per update by module and the floor they put on the update time at this CPU's measured
   single-thread matmul rate (how far overhead removal alone can go);
5. with ``--rollout`` (the 2023 agent): the no-grad imagination rollout alone (``dynamics.imagine`` from the
   batch's posterior starts, as the update calls it): its median wall ms and its top ops by input shape.
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
import collections
import functools
import shutil
import statistics
import subprocess
import tempfile
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.agents.dreamer import DreamerV3
from reverie.runtime.precision import autocast
from reverie.types import ActionSpec

from bench.run import SIZES, cartpole_batch, sized
from bench.timing import time_calls


class PhaseTimer:
    """Wall-clock seconds per named phase, accumulated over calls (and a ``record_function`` range per call)."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            with record_function(name):
                out = fn(*args, **kwargs)
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return out
        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(agent: DreamerV3, timer: PhaseTimer) -> None:
    """Wrap the agent's phases on the instance (and backward/clip globally, for this process only)."""
    agent.wm.loss = timer.wrap("wm forward (loss)", agent.wm.loss)
    agent.wm.dynamics.observe = timer.wrap("  of it: observe scan", agent.wm.dynamics.observe)
    agent.wm.dynamics.imagine = timer.wrap("imagine rollout", agent.wm.dynamics.imagine)
    for name in ("model_opt", "actor_opt", "critic_opt"):
        opt = getattr(agent, name)
        opt.step = timer.wrap(f"optimiser step ({name})", opt.step)
    names = iter(())  # backward calls of one update, in order: world model, actor, critic

    original_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        name = next(names, "backward (other)")
        return timer.wrap(name, original_backward)(self, *args, **kwargs)

    def new_update():
        nonlocal names
        names = iter(("backward world model", "backward actor", "backward critic"))

    torch.Tensor.backward = backward
    nn.utils.clip_grad_norm_ = timer.wrap("clip_grad_norm_ (x3)", nn.utils.clip_grad_norm_)
    update = agent.update

    def timed_update(batch):
        new_update()
        return timer.wrap("UPDATE (total)", update)(batch)

    agent.update = timed_update


def instrument_2025(agent, timer: PhaseTimer) -> None:
    """The phases of ``DreamerV3_2025.update`` (reverie/agents/dreamer2025.py), wrapped on the instance (and the
    backward pass and gradient norm globally, for this process only)."""
    agent.wm.loss = timer.wrap("wm forward (loss)", agent.wm.loss)
    agent.wm.dynamics.observe = timer.wrap("  of it: observe scan", agent.wm.dynamics.observe)
    agent._imagine = timer.wrap("imagine (rollout + heads)", agent._imagine)
    agent.wm.dynamics.imagine = timer.wrap("  of it: rollout", agent.wm.dynamics.imagine)
    agent._imagination_losses = timer.wrap("imagination losses (fwd)", agent._imagination_losses)
    agent._replay_value_loss = timer.wrap("replay value loss (fwd)", agent._replay_value_loss)
    agent.opt.step = timer.wrap("LaProp step (with AGC)", agent.opt.step)
    torch.Tensor.backward = timer.wrap("backward", torch.Tensor.backward)
    nn.utils.clip_grad_norm_ = timer.wrap("grad norm", nn.utils.clip_grad_norm_)
    agent.update = timer.wrap("UPDATE (total)", agent.update)


def build_2025(precision: str, kernels: str):
    """``agent=dreamerv3_2025`` at bench/vs_jax.py's widths (``--precision`` and ``--kernels`` as given) and its
    batch: ``(agent, batch)``."""
    from bench.vs_jax import REVERIE_OVERRIDES, cartpole_swingup_batch
    from reverie.agents.build import build_agent
    from reverie.configs.compose import load_config

    torch.manual_seed(0)
    cfg = load_config([*REVERIE_OVERRIDES, f"agent.module.precision={precision}", f"agent.module.kernels={kernels}"])
    agent = build_agent(cfg.agent, {"vector": (5,)}, ActionSpec(False, 1))
    batch = cartpole_swingup_batch(cfg.agent.batch_length + agent.replay_context, cfg.agent.batch_size,
                                   latents=agent.replay_latent_spec())
    return agent, batch


def build(size: str, precision: str, compile_: bool) -> DreamerV3:
    torch.manual_seed(0)
    return DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **sized(size, precision=precision, compile=compile_))


def run_py_spy(args: argparse.Namespace) -> None:
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(exe):
        print("py-spy: not installed (pip install py-spy); skipped")
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "stacks.txt")
        cmd = [exe, "record", "--format", "raw", "--rate", "200", "--output", raw, "--", sys.executable,
               os.path.abspath(__file__), "--size", args.size, "--updates", str(args.updates),
               "--precision", args.precision, "--threads", str(args.threads), "--agent", args.agent,
               "--kernels", args.kernels, "--no-torch-profiler"]
        if args.compile:
            cmd.append("--compile")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(raw):
            print(f"py-spy: failed ({done.stderr.strip().splitlines()[-1:] or done.returncode}); "
                  f"it needs ptrace rights (run as the same user, or with CAP_SYS_PTRACE)")
            return
        own, inclusive, total = collections.Counter(), collections.Counter(), 0
        with open(raw) as f:
            for line in f:
                stack, _, count = line.rstrip().rpartition(" ")
                frames = stack.split(";")
                if not any(fr.startswith(("DreamerV3.update ", "DreamerV3_2025.update ")) for fr in frames):
                    continue  # start-up, imports, agent construction
                frames = [fr for fr in frames if "bench/profile_update.py" not in fr]  # the timing wrappers
                n = int(count)
                total += n
                own[frames[-1]] += n
                for fr in set(frames):
                    inclusive[fr] += n
    print(f"\npy-spy: {total} samples inside the agent's update (warm-up update included)")
    print("  own samples (where the interpreter was when sampled):")
    for frame, n in own.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {frame[:150]}")
    print("  inclusive samples in reverie code:")
    shown = 0
    for frame, n in inclusive.most_common():
        if "reverie/" in frame and shown < args.top:
            print(f"  {100 * n / total:5.1f}%  {frame[:150]}")
            shown += 1


def report_flops(agent, batch, top: int) -> None:
    """FLOPs of one update by module (``torch.utils.flop_counter``) and the floor they put on its time here."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, depth=2) as counter:
        agent.update(batch)
    total = counter.get_total_flops()
    x, w = torch.randn(1024, 1280), torch.randn(1280, 256)  # the shape of the heads' first layers in imagination
    for _ in range(3):
        x @ w
    start, n = time.process_time(), 30
    for _ in range(n):
        x @ w
    rate = 2 * 1024 * 1280 * 256 * n / (time.process_time() - start)
    print(f"\nFLOPs: {total / 1e9:.1f} GFLOP/update (matmuls and convolutions); this CPU's matmul rate "
          f"{rate / 1e9:.0f} GFLOP/s per thread (1024x1280 @ 1280x256, CPU time) -> floor "
          f"{total / rate / torch.get_num_threads() * 1e3:.0f} ms/update at {torch.get_num_threads()} thread(s)")
    print(f"{'module (by class path)':<40} {'GFLOP':>8} {'share':>7}")
    counts = {k: sum(v.values()) for k, v in counter.get_flop_counts().items() if k != "Global"}
    for name, flops in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{name:<40} {flops / 1e9:8.1f} {100 * flops / total:6.1f}%")


def report_rollout(agent: DreamerV3, batch: dict, top: int, repeats: int = 7) -> None:
    """Median wall ms of the no-grad rollout of ``agent``'s update on ``batch`` and its top ops by input shape."""
    estimator = agent._estimator()
    data = agent._inputs(batch)
    with autocast(agent.device, agent.compute_dtype), torch.no_grad():
        _, post, _, _ = agent.wm.loss(data)
        start, _ = agent._posterior_starts(post, data)

    def rollout() -> None:
        with autocast(agent.device, agent.compute_dtype), torch.no_grad():
            agent._rollout(start, estimator)

    walls, _ = time_calls(rollout, warmup=1, max_calls=repeats)
    print(f"\nimagination rollout alone ({start['deter'].shape[0]} starts, horizon {agent.horizon}): median "
          f"{statistics.median(walls) * 1e3:.1f} ms wall over {repeats} rollouts without the profiler")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        rollout()
    print(f"{'op':<28} {'self ms':>8} {'calls':>6}  input shapes (one rollout under the profiler: the ops' own time, "
          f"not the Python between them)")
    ops = [e for e in prof.key_averages(group_by_input_shape=True) if "::" in e.key]  # not the phase ranges
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"{e.key[:28]:<28} {e.self_cpu_time_total / 1e3:8.2f} {e.count:6d}  {e.input_shapes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="xs", choices=sorted(SIZES))
    parser.add_argument("--updates", type=int, default=2, help="profiled updates (after one warm-up)")
    parser.add_argument("--precision", default="float32", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--top", type=int, default=15, help="rows of the op and py-spy tables")
    parser.add_argument("--compile", action="store_true", help="DreamerV3(compile=True)")
    parser.add_argument("--agent", default="dreamerv3", choices=["dreamerv3", "dreamerv3_2025"],
                        help="dreamerv3_2025: the current official agent at bench/vs_jax.py's widths and batch")
    parser.add_argument("--kernels", default="auto", choices=["auto", "off"], help="agent.module.kernels (2025 agent)")
    parser.add_argument("--trace", default=None, help="also write a Chrome trace JSON here")
    parser.add_argument("--py-spy", action="store_true", help="also sample Python frames with py-spy")
    parser.add_argument("--flops", action="store_true", help="also count FLOPs per module and the time floor")
    parser.add_argument("--rollout", action="store_true", help="also time and profile the imagination rollout alone")
    parser.add_argument("--no-torch-profiler", action="store_true", help=argparse.SUPPRESS)  # py-spy child run
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)

    timer = PhaseTimer()
    if args.agent == "dreamerv3_2025":
        agent, batch = build_2025(args.precision, args.kernels)
        instrument_2025(agent, timer)
        what = f"agent=dreamerv3_2025 at bench/vs_jax.py's widths, precision={args.precision} kernels={args.kernels}"
    else:
        agent = build(args.size, args.precision, args.compile)
        batch = cartpole_batch(64, 16)
        instrument(agent, timer)
        what = f"size={args.size} precision={args.precision} compile={args.compile}"
    agent.update(batch)  # warm-up (and compilation with --compile)
    timer.reset()
    if args.no_torch_profiler:
        for _ in range(args.updates):
            agent.update(batch)
        return
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        walls, _ = time_calls(lambda: agent.update(batch), warmup=0, max_calls=args.updates)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {what}; B16 x T64, H15; "
          f"{args.updates} profiled update(s)")
    print(f"median {statistics.median(walls) * 1e3:.0f} ms/update under the profiler (it adds overhead; "
          f"bench/run.py gives the clean figure)\n")
    total = timer.seconds["UPDATE (total)"]
    print(f"{'phase':<36} {'ms/update':>10} {'share':>7} {'calls/update':>13}")
    for name, sec in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
        print(f"{name:<36} {sec * 1e3 / args.updates:10.1f} {100 * sec / total:6.1f}% "
              f"{timer.calls[name] / args.updates:13.0f}")
    accounted = sum(v for k, v in timer.seconds.items() if k != "UPDATE (total)" and not k.startswith("  "))
    print(f"{'rest (heads, losses, returns, ...)':<36} {(total - accounted) * 1e3 / args.updates:10.1f} "
          f"{100 * (total - accounted) / total:6.1f}%")
    phases = tuple(timer.seconds)  # the phase ranges are not ops
    events = [e for e in prof.key_averages() if e.key not in phases]
    self_total = sum(e.self_cpu_time_total for e in events)
    print(f"\ntop {args.top} torch ops by self CPU time (sum over all ops: {self_total / 1e3 / args.updates:.0f} "
          f"ms/update of {total * 1e3 / args.updates:.0f} ms wall; the gap is Python between ops)")
    print(f"{'op':<52} {'self ms/upd':>11} {'share':>7} {'calls/upd':>10} {'us/call':>8}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
        ms = e.self_cpu_time_total / 1e3 / args.updates
        print(f"{e.key[:52]:<52} {ms:11.1f} {100 * e.self_cpu_time_total / self_total:6.1f}% "
              f"{e.count / args.updates:10.0f} {e.self_cpu_time_total / max(e.count, 1):8.1f}")
    calls = sum(e.count for e in events) / args.updates
    print(f"ops dispatched per update: {calls:.0f}")
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"Chrome trace: {args.trace}")
    if args.flops:
        report_flops(agent, batch, args.top)
    if args.rollout and args.agent == "dreamerv3":
        report_rollout(agent, batch, args.top)
    elif args.rollout:
        print("\n--rollout: only for --agent dreamerv3 (the 2025 agent's rollout is in its 'of it: rollout' phase)")
    if args.py_spy:
        run_py_spy(args)


if __name__ == "__main__":
    main()
