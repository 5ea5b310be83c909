"""ms per update with and without the decoder: the representation objectives side by side, in one process, updates
alternated (docs/representation.md "Update time").

    taskset -c 1 .venv/bin/python bench/representation.py                           # exp=dmc_cpu env=dmc_vision
    taskset -c 1 .venv/bin/python bench/representation.py --agent dreamerv3_2025    # the current official agent
    .venv/bin/python bench/representation.py --part model --rounds 8                # the world-model step alone

The agents are built from the composed config (``exp=dmc_cpu env=dmc_vision`` by default: size xxs, batch 16 x 32,
imagination from the last 8 rows, train_ratio 128, one thread) with ``agent.module.representation`` set to each of
``--objectives`` (reconstruction, r2, infonce), all from the same seed, for DMC vision's spaces (image uint8
(3, 64, 64), one action in [-1, 1]; cartpole_swingup's) without building an env. Every round runs one update of
each objective, in an order that alternates (A B C, C B A, ...), on the same random batch, so every objective sees
the same machine at nearly the same moment (docs/speed.md: a shared CPU drifts by 10% within minutes). Printed:
the median wall ms and CPU ms per update of each objective and the median of the per-round ratios
reconstruction / objective (> 1: the objective's update is faster).

``--part model`` times ``update_model`` (the world-model step alone: the part the decoder is in; DreamerV3 2023)
instead of the whole ``update``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

OBJECTIVES = ("reconstruction", "r2", "infonce")


def make_batch(T: int, B: int, action_dim: int, seed: int = 0, with_latents: dict | None = None
               ) -> dict[str, np.ndarray]:
    """A DMC vision replay batch ``(T, B, ...)``: random pixels, actions in ``[-1, 1]``, ``is_first`` at t = 0."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    batch = {"image": rng.integers(0, 256, (T, B, 3, 64, 64), dtype=np.uint8),
             "prev_action": rng.uniform(-1, 1, (T, B, action_dim)).astype(np.float32),
             "reward": rng.uniform(0, 1, (T, B)).astype(np.float32), "is_first": is_first,
             "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}
    for key, (shape, dtype) in (with_latents or {}).items():  # the 2025 agent's replay context: no stored latent
        batch[key] = np.zeros((T, B, *shape), dtype)
    return batch


def build(overrides: list[str], representation: str):
    """The agent of ``overrides`` + ``agent.module.representation=<representation>`` and its config."""
    from reverie.agents.build import build_agent
    from reverie.configs.compose import load_config
    from reverie.types import ActionSpec

    cfg = load_config([*overrides, f"agent.module.representation={representation}"])
    torch.manual_seed(0)
    return build_agent(cfg.agent, {"image": (3, 64, 64)}, ActionSpec(False, 1)), cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default="dreamerv3", choices=["dreamerv3", "dreamerv3_2025"])
    parser.add_argument("--exp", default="dmc_cpu", help="the exp preset (default dmc_cpu, the CPU size)")
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    parser.add_argument("--part", default="update", choices=["update", "model"],
                        help="the whole update, or the world-model step alone (update_model)")
    parser.add_argument("--rounds", type=int, default=12, help="timed updates per objective")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates per objective first")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the preset's `threads`)")
    parser.add_argument("overrides", nargs="*", help="further Hydra overrides, e.g. size=xs agent.batch_length=64")
    args = parser.parse_args()
    overrides = [f"exp={args.exp}", "env=dmc_vision", f"agent={args.agent}", *args.overrides]
    agents, cfg = {}, None
    for name in args.objectives:
        agents[name], cfg = build(overrides, name)
    threads = args.threads or int(cfg.get("threads") or 0) or torch.get_num_threads()
    torch.set_num_threads(threads)
    from reverie.runtime.cpu_memory import keep_freed_memory

    keep_freed_memory()
    T = int(cfg.agent.batch_length) + int(cfg.agent.module.get("replay_context", 0) or 0)
    B = int(cfg.agent.batch_size)
    first = next(iter(agents.values()))
    latents = first.replay_latent_spec() if hasattr(first, "replay_latent_spec") else {}
    batch = make_batch(T, B, 1, with_latents=latents)
    steps = {name: getattr(agent, "update_model" if args.part == "model" else "update")
             for name, agent in agents.items()}
    for step in steps.values():
        for _ in range(args.warmup):
            step(batch)
    wall: dict[str, list[float]] = {n: [] for n in steps}
    cpu: dict[str, list[float]] = {n: [] for n in steps}
    names = list(steps)
    for i in range(args.rounds):
        for name in names if i % 2 == 0 else reversed(names):
            start, cpu_start = time.perf_counter(), time.process_time()
            steps[name](batch)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - cpu_start)
    params = {n: sum(p.numel() for p in a.wm.parameters()) for n, a in agents.items()}
    size = cfg.size
    print(f"{args.agent}, exp={args.exp} env=dmc_vision {' '.join(args.overrides)}: deter {size.deter}, units "
          f"{size.units}, cnn_depth {size.cnn_depth}, batch {B} x {T}, {args.part}, {threads} thread(s), precision "
          f"{first.compute_dtype}, {args.rounds} rounds")
    for name in names:
        line = (f"  {name:15s} {statistics.median(wall[name]) * 1e3:8.1f} ms wall, "
                f"{statistics.median(cpu[name]) * 1e3:8.1f} ms CPU per {args.part}; world model "
                f"{params[name] / 1e6:.2f} M parameters")
        if "reconstruction" in wall and name != "reconstruction":
            for kind, times in (("wall", wall), ("CPU", cpu)):
                ratios = [a / b for a, b in zip(times["reconstruction"], times[name])]
                line += (f"; reconstruction / {name} ({kind}): median {statistics.median(ratios):.3f} "
                         f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
        print(line)


if __name__ == "__main__":
    main()
