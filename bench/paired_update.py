"""ms per DreamerV3 update of one reverie checkout, or paired A/B timing of two, in one process, updates alternated.

    git worktree add --detach /tmp/before HEAD~1                     # a checkout of the previous commit
    taskset -c 1 .venv/bin/python bench/paired_update.py /tmp/before . --size xs --threads 1
    taskset -c 1 .venv/bin/python bench/paired_update.py /tmp/before . --config continuous --kernels off
    taskset -c 1 .venv/bin/python bench/paired_update.py . --config continuous --size xxs --length 32 --imag-last 8
                                                                     # one tree, the widths of exp=dmc_cpu
    .venv/bin/python bench/paired_update.py /tmp/before . --preset "exp=atari_cpu agent=dreamerv3_2025" --pairs 4
                                                                     # any preset's agent, on images

Why: on a shared or virtualised machine the speed of the CPU drifts by 10% and more within minutes, so two
separate runs of ``bench/update_time.py`` cannot resolve a change of a few percent. Here both trees' agents are
built in the same process (each tree's ``reverie`` imported in turn under the same name), with the same batch,
seed, threads and allocator settings (:mod:`reverie.runtime.cpu_memory`), and their updates alternate (A B, B A,
A B, ...), so both see the same machine at nearly the same moment. Printed: the median ms/update of each, and the
median of the per-pair ratios A/B (> 1: B is faster) with its range.

Configs: ``discrete`` (CartPole-sized: vector obs (4,), 2 one-hot actions) and ``continuous`` (DMC
cartpole_swingup from proprio: vector obs (5,), one action in [-1, 1]); batch 16 x ``--length`` (64), horizon 15,
the ``--size`` preset, imagination from every row (or the last ``--imag-last``). ``--kernels auto|off``
is ``agent.module.kernels`` for a tree with ``reverie/models/kernels/``; for an older tree, ``off`` turns its
fast paths off one by one where it had switches (``onehot_gather=False``, the fused and deferred-weight scans, the
actor tape), which leaves the few it had no switch for (the two-hot and straight-through nodes, the sampler).

``--preset "OVERRIDES"``: the agent that ``reverie train OVERRIDES`` builds (each tree's own config composer), on a
batch of 64x64 images of its batch size and length (plus the replay context's rows and stored latents): 18
discrete actions for an Atari suite, one continuous action (cartpole_swingup's) otherwise; ``--size``,
``--config``, ``--length``, ``--imag-last`` and ``--kernels`` are not read (set them as overrides).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import statistics
import sys
import time
from functools import partial

import numpy as np
import torch
import yaml

from batches import stored_latents  # bench/ is the script's first import path


def make_batch(config: str, T: int = 64, B: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """A replay batch ``(T, B, ...)`` of the config's shapes, ``is_first`` at t = 0 and at 2% of the rest."""
    rng = np.random.default_rng(seed)
    is_first = rng.random((T, B)) < 0.02
    is_first[0] = True
    if config == "discrete":
        obs, action = rng.normal(size=(T, B, 4)), np.eye(2)[rng.integers(2, size=(T, B))]
    else:
        obs, action = rng.normal(size=(T, B, 5)), rng.uniform(-1.0, 1.0, size=(T, B, 1))
    return {"vector": obs.astype(np.float32), "prev_action": (action * ~is_first[..., None]).astype(np.float32),
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": rng.random((T, B)) < 0.02}


def image_batch(T: int, B: int, discrete: bool, latents: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A replay batch of uint8 64x64 images ``(T, B, 3, 64, 64)``, ``is_first`` at t = 0, 18 one-hot actions
    (``discrete``) or one in [-1, 1], and the agent's stored latents (``replay_latent_spec``: ``has_posterior``
    true, one-hot ``(S, K)`` stochs, normal rest)."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    action = np.eye(18)[rng.integers(18, size=(T, B))] if discrete else rng.uniform(-1.0, 1.0, size=(T, B, 1))
    batch = {"image": rng.integers(0, 256, size=(T, B, 3, 64, 64), dtype=np.uint8),
             "prev_action": (action * ~is_first[..., None]).astype(np.float32),
             "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
             "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}
    batch.update(stored_latents(T, B, latents, rng))
    return batch


@contextlib.contextmanager
def tree_imports(root: str):
    """Imports of ``reverie`` inside the block come from the checkout ``root`` (earlier imports of it are dropped);
    yields ``root`` as an absolute path."""
    for name in [n for n in sys.modules if n.split(".")[0] == "reverie"]:
        del sys.modules[name]
    root = os.path.abspath(root)
    sys.path.insert(0, root)
    try:
        yield root
    finally:
        sys.path.remove(root)


def load_preset(root: str, overrides: str, precision: str):
    """``root``'s agent for ``reverie train <overrides>`` (with ``agent.module.precision``) and its image batch."""
    with tree_imports(root):
        cfg = importlib.import_module("reverie.configs.compose").load_config(
            [*overrides.split(), f"agent.module.precision={precision}"])
        ActionSpec = importlib.import_module("reverie.types").ActionSpec
        discrete = cfg.env.get("suite") == "atari"
        torch.manual_seed(0)
        agent = importlib.import_module("reverie.agents.build").build_agent(
            cfg.agent, {"image": (3, 64, 64)}, ActionSpec(discrete, 18 if discrete else 1))
        T = cfg.agent.batch_length + int(cfg.agent.module.get("replay_context", 0) or 0)
        latents = agent.replay_latent_spec() if hasattr(agent, "replay_latent_spec") else {}
        return agent, image_batch(T, cfg.agent.batch_size, discrete, latents)


def load(root: str, size: str, precision: str, config: str, kernels: str, imag_last: int = 0):
    """Build ``root``'s agent with ``root``'s own ``reverie`` (:func:`tree_imports`)."""
    with tree_imports(root) as root:
        DreamerV3 = importlib.import_module("reverie.agents.dreamer").DreamerV3
        ActionSpec = importlib.import_module("reverie.types").ActionSpec
        with open(os.path.join(root, "reverie", "configs", "size", f"{size}.yaml")) as f:
            s = yaml.safe_load(f)
        shapes = {"vector": (4,) if config == "discrete" else (5,)}
        spec = ActionSpec(config == "discrete", 2 if config == "discrete" else 1)
        extra = {"imag_last": imag_last} if imag_last else {}
        torch.manual_seed(0)
        if "dynamics" in inspect.signature(DreamerV3).parameters:  # reverie/models/dynamics and kernels/
            rssm = importlib.import_module("reverie.models.dynamics").CategoricalRSSM
            dynamics = partial(rssm, deter=s["deter"], stoch=s["stoch"], classes=s["classes"], units=s["units"],
                               kernels=kernels)
            agent = DreamerV3(shapes, spec, dynamics=dynamics, units=s["units"], layers=s["layers"],
                              precision=precision, kernels=kernels, **extra)
        else:  # the layout before: the fast paths' own switches
            agent = DreamerV3(shapes, spec, deter=s["deter"], stoch=s["stoch"], classes=s["classes"],
                              units=s["units"], layers=s["layers"], precision=precision,
                              onehot_gather=kernels == "auto", **extra)
            if kernels == "off":
                agent.wm.rssm.fused_observe = agent.wm.rssm.defer_weight_grads = False
                agent.compiled = True  # only read to decide the actor tape: no tape
        return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", help="one checkout, or two (A, e.g. a worktree of the previous commit, "
                                                   "then B, e.g. .) for a paired comparison")
    parser.add_argument("--size", default="xs")
    parser.add_argument("--config", default="discrete", choices=["discrete", "continuous"])
    parser.add_argument("--kernels", default="auto", choices=["auto", "off"])
    parser.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--length", type=int, default=64, help="batch_length T (batch 16 x T)")
    parser.add_argument("--imag-last", type=int, default=0, help="imagine from the last K rows (0: every row)")
    parser.add_argument("--pairs", type=int, default=16, help="timed updates per tree")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--preset", default="", help="overrides of `reverie train` whose agent to time on images")
    args = parser.parse_args()
    if len(args.trees) > 2:
        parser.error("give one tree or two")
    torch.set_num_threads(args.threads)
    if args.preset:  # each tree's agent on its own batch (a tree may differ in the replay context's rows and keys)
        loaded = [load_preset(root, args.preset, args.precision) for root in args.trees]
        agents, batches = [agent for agent, _ in loaded], [batch for _, batch in loaded]
    else:
        agents = [load(root, args.size, args.precision, args.config, args.kernels, args.imag_last)
                  for root in args.trees]
        batches = [make_batch(args.config, T=args.length)] * len(agents)
    # the last tree's module; the setting is process-wide, so every tree runs with it
    from reverie.runtime.cpu_memory import keep_freed_memory

    keep_freed_memory()
    for agent, batch in zip(agents, batches):  # warm-up
        agent.update(batch)
        agent.update(batch)
    times: list[list[float]] = [[] for _ in agents]
    for i in range(args.pairs):
        for j in range(len(agents)) if i % 2 == 0 else reversed(range(len(agents))):
            start = time.perf_counter()
            agents[j].update(batches[j])
            times[j].append(time.perf_counter() - start)
    head = (f"{args.config}, size {args.size}, batch 16 x {args.length}, kernels {args.kernels}, {args.precision}, "
            f"{args.threads} thread(s), {args.pairs} updates per tree")
    if args.preset:
        T, B = batches[-1]["is_first"].shape
        head = (f"preset {args.preset!r}, batch {B} x {T}, {args.precision}, {args.threads} thread(s), "
                f"{args.pairs} updates per tree")
    if len(agents) == 1:
        print(f"{head}: {statistics.median(times[0]) * 1e3:.1f} ms per update (min {min(times[0]) * 1e3:.1f})")
        return
    ratios = [a / b for a, b in zip(*times)]
    print(f"{head}: A {statistics.median(times[0]) * 1e3:.1f} ms, B {statistics.median(times[1]) * 1e3:.1f} ms per "
          f"update; paired ratio A/B median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
