"""The training loop: collect -> add -> ratio -> update -> log / eval / checkpoint.

It owns time (env steps, the train_ratio clock, log/eval/save clocks) and knows agents only through the
:class:`reverie.agents.base.Agent` protocol, so every agent shares it unchanged (DESIGN.md section 1).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import hydra.utils
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from reverie.checkpoint import save_checkpoint
from reverie.envs import make_vector_env, write_env_metadata
from reverie.envs.stepper import VectorStepper
from reverie.evaluate import evaluate, record_episode
from reverie.logging import Logger
from reverie.progress import Progress
from reverie.replay import Replay
from reverie.replay.cycle import make_schedule
from reverie.types import ActionSpec


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from the run seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_agent(agent_cfg: DictConfig, obs_shapes: dict[str, tuple[int, ...]], spec: ActionSpec) -> Any:
    """Instantiate ``agent_cfg.module`` (a ``_target_`` block) with the env's observation shapes and actions."""
    factory = hydra.utils.instantiate(agent_cfg.module, _partial_=True, _convert_="all")
    return factory(obs_shapes=obs_shapes, action_spec=spec)


def random_actions(rng: np.random.Generator, spec: ActionSpec, n: int) -> np.ndarray:
    """Uniform random policy: one-hot ``(N, A)`` for discrete, ``U[-1, 1]^A`` for continuous. float32."""
    if spec.discrete:
        return np.eye(spec.dim, dtype=np.float32)[rng.integers(spec.dim, size=n)]
    return rng.uniform(-1.0, 1.0, size=(n, spec.dim)).astype(np.float32)


class Clock:
    """Fires when ``step`` crosses a multiple of ``every`` (never when ``every <= 0``)."""

    def __init__(self, every: int):
        self.every, self.last = int(every or 0), 0

    def __call__(self, step: int) -> bool:
        if self.every <= 0 or step // self.every == self.last // self.every:
            return False
        self.last = step
        return True


def train(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Train the configured agent on the configured env and return a summary.

    Args:
        cfg: the resolved root config (``reverie/configs/config.yaml`` plus overrides).
        run_dir: where ``config.yaml``, ``metrics.jsonl``, ``scores.jsonl``, ``tb/``, ``checkpoints/`` and
            ``videos/`` go.

    Returns:
        ``{"env_steps", "updates", "eval_return" (the last evaluation's mean), "evals": [(env_step, wall_s,
        mean_return), ...], "wall_s", "interrupted"}``. Ctrl-C or SIGTERM stops collection, writes the
        metrics and a checkpoint, and returns with ``interrupted`` True.
    """
    run_dir = Path(run_dir)
    tc, ac = cfg.train, cfg.agent
    seed_everything(cfg.seed)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    rng = np.random.default_rng(cfg.seed)

    # --- envs, agent, replay ---
    stepper = VectorStepper(make_vector_env(cfg.env, cfg.seed))
    n, spec = stepper.num_envs, stepper.action_spec
    obs_space = stepper.env.single_observation_space
    obs_shapes = {k: tuple(s.shape) for k, s in obs_space.spaces.items()}
    agent = build_agent(ac, obs_shapes, spec)
    replay_dir = cfg.replay.directory or str(run_dir / "replay")
    replay = Replay(int(cfg.replay.capacity), n, Replay.spec_for(obs_space, spec.dim), storage=cfg.replay.storage,
                    directory=replay_dir, seed=cfg.seed)
    ratio = make_schedule(ac)  # train_ratio clock (DreamerV3) or episode cycle (agent.schedule: episodes, PlaNet)
    repeat = int(cfg.env.get("action_repeat", 1) or 1)
    logger = Logger(run_dir, backends=list(cfg.logger.backends), config=OmegaConf.to_container(cfg, resolve=True),
                    wandb_kwargs={k: v for k, v in cfg.logger.items() if k != "backends"})
    write_env_metadata(cfg.env, run_dir)  # env_metadata.json: protocol settings and simulator versions
    print(f"[reverie] {n} env(s) x {spec}; obs {obs_shapes}; {ratio} with batch {ac.batch_size}x{ac.batch_length} "
          f"({tc.steps} env steps, prefill {tc.prefill}); run dir {run_dir}")

    env_steps = updates = 0
    evals: list[tuple[int, float, float]] = []
    last_return = float("nan")
    log_clock, eval_clock, ckpt_clock = Clock(tc.log_every), Clock(tc.eval_every), Clock(tc.checkpoint_every)
    start = time.time()

    def checkpoint() -> None:
        save_checkpoint(run_dir / "checkpoints", env_steps, {
            "agent": agent.state_dict(), "obs_shapes": obs_shapes, "action_spec": spec,
            "config": OmegaConf.to_container(cfg, resolve=True),
            "counters": {"env_steps": env_steps, "updates": updates}, "ratio": ratio.state_dict()})

    written = {"step": -1}  # env step of the last metrics row

    def write_metrics() -> None:
        written["step"] = env_steps
        elapsed = max(time.time() - start, 1e-9)
        logger.write(env_steps, {"updates": updates, "frames": env_steps * repeat, "wall_s": elapsed,
                                 "fps/env_steps": env_steps / elapsed, "fps/updates": updates / elapsed})

    def run_eval() -> float:
        result = evaluate(agent, cfg.env, int(tc.eval_episodes), cfg.seed, mode=tc.eval_mode)
        for ret, length in zip(result["returns"], result["lengths"]):
            logger.episode(env_steps, env_steps * repeat, ret, length, mode="eval")
        evals.append((env_steps, time.time() - start, result["mean"]))
        logger.scalars({"eval/return_mean": result["mean"], "eval/return_std": result["std"]})
        return result["mean"]

    row, state = stepper.reset(), None
    interrupted = False
    previous_sigterm = _sigterm_as_interrupt()
    try:
        with Progress(int(tc.steps), enabled=bool(tc.progress)) as progress:
            while env_steps < tc.steps:
                # --- act: random policy during prefill, then the agent's exploration policy ---
                if env_steps < tc.prefill:
                    action = random_actions(rng, spec, n)
                else:
                    action, state = agent.act(row, state, "explore")
                # --- add row t = (obs_t, reward_t, flags_t, action_t) and step the envs ---
                replay.add({**row, "action": action})
                row, episodes = stepper.step(action)
                env_steps += n
                for ep in episodes:
                    last_return = ep["return"]
                    logger.episode(env_steps, env_steps * repeat, ep["return"], ep["length"], mode="train")
                # --- train: updates owed by the train_ratio clock once prefill is done ---
                if env_steps >= tc.prefill and replay.num_rows > ac.batch_length:
                    for _ in range(ratio(n, len(episodes))):
                        logger.scalars(agent.update(replay.sample(int(ac.batch_size), int(ac.batch_length))))
                        updates += 1
                # --- log / eval / checkpoint clocks ---
                stop = False
                if eval_clock(env_steps):
                    mean_return = run_eval()
                    stop = tc.stop_return is not None and mean_return >= tc.stop_return
                if log_clock(env_steps) or stop:
                    write_metrics()
                if ckpt_clock(env_steps):
                    checkpoint()
                progress.update(env_steps, {"updates": updates, "last_return": last_return})
                if stop:
                    break
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see _sigterm_as_interrupt)
        interrupted = True
        print(f"\n[reverie] interrupted at env step {env_steps}: writing metrics and a checkpoint", flush=True)
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)

    # --- final evaluation (unless the last step just had one), checkpoint and video ---
    if not interrupted and not (evals and evals[-1][0] == env_steps):
        run_eval()
    final = evals[-1][2] if evals else float("nan")
    if logger.pending or written["step"] != env_steps:  # no second, empty row when the loop just wrote one
        write_metrics()
    checkpoint()
    if tc.video and not interrupted:
        frames, _ = record_episode(agent, cfg.env, cfg.seed, mode=tc.eval_mode)
        if frames is not None:
            logger.video("eval/episode", frames, env_steps)
    stepper.close()
    logger.close()
    wall = time.time() - start
    summary = {"env_steps": env_steps, "updates": updates, "eval_return": final, "evals": evals, "wall_s": wall,
               "interrupted": interrupted}
    print(f"[reverie] {'interrupted' if interrupted else 'done'}: {env_steps} env steps, {updates} updates, "
          f"last eval return {final:.1f}, {wall / 60:.2f} min; run dir {run_dir}")
    return summary


def _sigterm_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt (main thread only) so a killed run still saves; returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
