"""reverie's current DreamerV3 update vs the official JAX code's, side by side in one run of this script
(docs/speed.md).

    git clone https://github.com/danijar/dreamerv3 ~/.cache/reverie/dreamerv3
    git -C ~/.cache/reverie/dreamerv3 checkout e3f0224
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_jax.py --source ~/.cache/reverie/dreamerv3
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_jax.py --source DIR --rounds 3 --seconds 150

Run from the repository root. Compares ``agent=dreamerv3_2025`` (reverie/agents/dreamer2025.py) with the code it
reimplements, danijar/dreamerv3 at e3f0224, at matched small widths: deter 64, hidden 64, 16 x 16 latents, 8 GRU
blocks, units 64 (the official ``dmc_proprio`` preset is size1m: units 64), 1-layer encoder, decoder, policy and
value MLPs (reward and continue heads: 1 layer on both sides by default); batch 16 x 64, horizon 15, float32 on
both sides (official ``--jax.compute_dtype float32``). Steps:

1. makes sure the official code's dependencies are installed in a throwaway venv OUTSIDE the repository
   (``--venv``, default ~/.cache/reverie/jax-venv; ``--python``, default python3.11) with the pinned
   versions of ``JAX_PACKAGES`` (the newest jax, 0.7+, fails at parameter init of this commit with ``TypeError: jit()
   takes 1 positional argument but 5 were given``); skipped when the venv already imports them;
2. per round, runs the official DreamerV3 (``dreamerv3/main.py`` of ``--source``) on DMC proprio
   cartpole_swingup (``--configs dmc_proprio``, 4 envs, CPU) through bench/dreamerv3_launcher.py, which wraps
   ``embodied.jax.Agent.train`` with a timer that also blocks on the updated parameters, and stops the run after
   ``--seconds``; the first ``--skip`` updates (the jit compile takes about a minute) are not counted;
3. per round, times reverie's ``DreamerV3_2025.update`` (built from its config, as ``reverie train`` builds it)
   in this process on a replay batch shaped like DMC cartpole_swingup (vector obs (5,), 1 continuous action,
   16 x 64) for ``--seconds``, after ``--skip`` untimed updates;
4. the rounds alternate (JAX, reverie, JAX, reverie, ...) so slow drift of a shared machine hits both sides;
   prints each round's medians, then both pooled medians and the ratio JAX / reverie (> 1: reverie is faster),
   in wall seconds per update and in process CPU seconds per update (JAX uses more than one thread: it may use
   more CPU seconds than wall seconds).

Pin both sides to the same cores (e.g. ``taskset -c 0``) for a per-core comparison; the official run needs
``MUJOCO_GL=egl`` (its DMC env renders a frame every step even for proprio; set here unless already set). Not
like for like beyond the update itself: the JAX run also steps 4 envs and its replay between updates (not timed);
reverie's side times the update alone on a fixed synthetic batch.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT  # this tree's reverie, not an installed one (see bench/vs_sheeprl.py)
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import statistics
import subprocess
from pathlib import Path

import numpy as np
import torch

from bench.batches import stored_latents
from bench.peer_venv import outside_repo, run_steps, timed_peer_run
from bench.timing import time_calls
from reverie.runtime.cpu_memory import keep_freed_memory
from reverie.types import ActionSpec

COMMIT = "e3f0224"
# Versions that run danijar/dreamerv3 e3f0224 on CPU (Python 3.11).
JAX_PACKAGES = ["jax==0.4.33", "jaxlib==0.4.33", "chex==0.1.87", "optax==0.2.4", "numpy<2", "elements==3.22.4",
                "ninjax==3.6.3", "portal==3.8.3", "granular==0.24.2", "scope==0.8.1", "einops", "jaxtyping", "av",
                "tqdm", "colored_traceback", "mujoco<4", "dm_control==1.0.50", "gym==0.22.0"]
# Matched widths. Official flags (dreamerv3/configs.yaml: dmc_proprio = size1m, units 64) ...
JAX_FLAGS = ["--configs", "dmc_proprio", "--task", "dmc_cartpole_swingup", "--jax.platform", "cpu",
             "--jax.compute_dtype", "float32", "--run.envs", "4", "--run.log_every", "30",
             "--run.report_every", "100000", "--run.save_every", "100000",
             "--agent.dyn.rssm.deter", "64", "--agent.dyn.rssm.hidden", "64", "--agent.dyn.rssm.stoch", "16",
             "--agent.dyn.rssm.classes", "16", "--agent.enc.simple.layers", "1", "--agent.dec.simple.layers", "1",
             "--agent.policy.layers", "1", "--agent.value.layers", "1"]
# ... and reverie's config keys for the same widths (reverie/configs/agent/dreamerv3_2025.yaml, size/size1m.yaml).
REVERIE_OVERRIDES = ["agent=dreamerv3_2025", "size=size1m", "size.deter=64", "size.hidden=64", "size.units=64",
                     "size.stoch=16", "size.classes=16", "size.blocks=8", "agent.module.enc_layers=1",
                     "agent.module.dec_layers=1", "agent.module.actor_layers=1", "agent.module.critic_layers=1",
                     "agent.module.reward_layers=1", "agent.module.cont_layers=1", "agent.module.horizon=15",
                     "agent.module.precision=float32"]
LAUNCHER = Path(__file__).resolve().with_name("dreamerv3_launcher.py")
GET_SOURCE = ("git clone https://github.com/danijar/dreamerv3 {dir} && git -C {dir} checkout " + COMMIT)


def check_source(source: Path) -> Path:
    """The official source folder; raises FileNotFoundError naming the git command when it is not one."""
    source = outside_repo(source, "--source")
    if not (source / "dreamerv3" / "main.py").exists() or not (source / "embodied" / "jax" / "agent.py").exists():
        raise FileNotFoundError(f"--source {source} is not a checkout of danijar/dreamerv3 (no dreamerv3/main.py or "
                                f"embodied/jax/agent.py); get it with:\n  {GET_SOURCE.format(dir=source)}")
    return source


def ensure_jax_venv(venv: Path, python_exe: str) -> Path:
    """Install ``JAX_PACKAGES`` into ``venv`` unless it imports them already; returns its python.

    Raises:
        ValueError: ``venv`` inside this repository.
        RuntimeError: a venv or pip step failed (its output is printed).
    """
    venv = outside_repo(venv, "--venv")
    python = venv / "bin" / "python"
    probe = "import jax, elements, ninjax, dm_control; print(jax.__version__)"
    if python.exists():
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == "0.4.33":
            print(f"[vs_jax] {venv}: jax {done.stdout.strip()} already installed")
            return python
    steps = [] if python.exists() else [[python_exe, "-m", "venv", str(venv)]]
    steps += [[str(python), "-m", "pip", "install", "-q", *JAX_PACKAGES]]
    run_steps(steps, "vs_jax")
    return python


def time_jax(python: Path, source: Path, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per official update (after ``--skip``), from one official run of ``--seconds``."""
    def command(folder: Path, out: Path) -> list[str]:  # the official logdir goes into the temporary folder
        return [str(python), str(LAUNCHER), "--source", str(source), "--out", str(out), "--skip", str(args.skip),
                "--max-seconds", str(args.seconds), "--", "--logdir", str(folder / "logdir"), *JAX_FLAGS]

    env = os.environ | {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return timed_peer_run(command, env, args.seconds + 900, "the official run", "vs_jax_", hint="; raise --seconds")


def cartpole_swingup_batch(T: int, B: int, seed: int = 0,
                           latents: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None) -> dict[str, np.ndarray]:
    """A replay batch shaped like DMC proprio cartpole_swingup: ``vector`` (T, B, 5) (position 3 + velocity 2),
    ``prev_action`` (T, B, 1) in [-1, 1], rewards in [0, 1]; DMC episodes never terminate. ``latents``: the agent's
    :meth:`replay_latent_spec` (replay context): stored posteriors on every row, normal ``deter`` and one-hot
    ``stoch`` ``(T, B, S, K)``, ``has_posterior`` true (the official train batch has ``batch_length + 1`` rows of
    which the first is context, ``dreamerv3/main.py:187``)."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    batch = {"vector": rng.normal(size=(T, B, 5)).astype(np.float32),
             "prev_action": rng.uniform(-1, 1, size=(T, B, 1)).astype(np.float32) * ~is_first[..., None],
             "reward": rng.random((T, B)).astype(np.float32), "is_first": is_first,
             "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}
    batch.update(stored_latents(T, B, latents or {}, rng))
    return batch


def time_reverie(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per ``DreamerV3_2025.update`` at the matched widths (after ``--skip``), on a batch of
    ``batch_length`` trained rows plus the replay context's row (official default ``replay_context: 1``)."""
    from reverie.agents.build import build_agent
    from reverie.configs.compose import load_config

    torch.manual_seed(0)
    cfg = load_config(REVERIE_OVERRIDES)
    agent = build_agent(cfg.agent, {"vector": (5,)}, ActionSpec(False, 1))
    batch = cartpole_swingup_batch(cfg.agent.batch_length + agent.replay_context, cfg.agent.batch_size,
                                   latents=agent.replay_latent_spec())
    return time_calls(lambda: agent.update(batch), args.skip, max_seconds=args.seconds)


def summary(times: list[float], cpu_times: list[float]) -> str:
    return (f"wall median {statistics.median(times):.3f} s/update (n={len(times)}, min {min(times):.3f}, "
            f"max {max(times):.3f}); CPU median {statistics.median(cpu_times):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=Path.home() / ".cache" / "reverie" / "dreamerv3",
                        help=f"checkout of danijar/dreamerv3 at {COMMIT} (outside the repository)")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "reverie" / "jax-venv",
                        help="throwaway venv for the official code")
    parser.add_argument("--python", default="python3.11", help="interpreter that creates --venv")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (each: JAX, then reverie)")
    parser.add_argument("--seconds", type=float, default=120.0, help="timed seconds per side and round")
    parser.add_argument("--skip", type=int, default=5, help="first updates per side and round left out")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (reverie's side)")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.skip < 0:
        parser.error("config error: --rounds >= 1, --seconds > 0 and --skip >= 0 are needed")
    source = check_source(args.source)  # before anything is installed
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as reverie train does on CPU (reverie/runtime/cpu_memory.py)
    python = ensure_jax_venv(args.venv, args.python)
    print(f"[vs_jax] official {source} vs reverie agent=dreamerv3_2025 (torch {torch.__version__}, "
          f"{args.threads} thread(s)); float32 both; deter 64, hidden 64, 16x16 latents, units 64, 1-layer MLPs; "
          f"batch 16 x 64, horizon 15; {args.rounds} round(s) of {args.seconds:.0f} s per side, first {args.skip} "
          f"updates left out; CPU affinity {sorted(os.sched_getaffinity(0))}", flush=True)
    pooled: dict[str, tuple[list[float], list[float]]] = {"jax": ([], []), "reverie": ([], [])}
    for round_ in range(1, args.rounds + 1):
        for side in ("jax", "reverie"):
            times, cpu_times = time_jax(python, source, args) if side == "jax" else time_reverie(args)
            print(f"round {round_} {side:<8} {summary(times, cpu_times)}", flush=True)
            pooled[side][0].extend(times)
            pooled[side][1].extend(cpu_times)
    (jax_wall, jax_cpu), (rev_wall, rev_cpu) = ((statistics.median(t) for t in pooled[s]) for s in ("jax", "reverie"))
    print("\npooled medians, s/update   JAX wall  reverie wall  ratio |  JAX CPU  reverie CPU  ratio  "
          "(ratio = JAX/reverie, > 1: reverie faster)")
    print(f"{'':26} {jax_wall:8.3f}  {rev_wall:12.3f} {jax_wall / rev_wall:5.2f}x | {jax_cpu:8.3f}  {rev_cpu:11.3f} "
          f"{jax_cpu / rev_cpu:5.2f}x")


if __name__ == "__main__":
    main()
