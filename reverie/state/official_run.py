"""``reverie import-official``: an official DreamerV3 checkpoint as a reverie run folder.

The official parameters (:func:`reverie.agents.official.read_official_checkpoint`: 2025 ``ckpt/<stamp>/agent.pkl``,
2023 ``checkpoint.ckpt``) go through :func:`reverie.agents.official.load_official` into the agent the config builds
(``agent=dreamerv3_2025`` or ``dreamerv3``, with the official run's sizes and env) and are written as
``checkpoints/best.pt`` and ``ckpt_0000000000.pt`` with ``config.yaml``, readable as any run's weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from reverie.agents.official import dmc_layout, load_official, read_official_checkpoint
from reverie.configs.compose import ConfigError, check_setup, load_config, make_run_dir
from reverie.state.checkpoint import save_best, save_checkpoint

AGENTS = {"2025": "dreamerv3_2025", "2023": "dreamerv3"}


def import_official(checkpoint: str | Path, overrides: list[str], root: str | Path = "runs") -> Path:
    """Write the run folder of an official checkpoint and return it; raises ConfigError (nothing written) for a
    missing or unreadable checkpoint, an agent not of the checkpoint's version, an env or agent that cannot be
    built, or parameters that do not fit (naming the first misfit and what to set)."""
    try:
        version, params = read_official_checkpoint(checkpoint)
    except (FileNotFoundError, ValueError, OSError) as err:
        raise ConfigError(f"import-official error: {err}") from err
    cfg = load_config(overrides)
    if cfg.agent.name != AGENTS[version]:
        raise ConfigError(f"import-official error: {checkpoint} is a checkpoint of the {version} official code, "
                          f"whose reverie agent is agent={AGENTS[version]}; this config has agent={cfg.agent.name}")
    agent, obs_shapes, spec = check_setup(cfg)
    try:
        load_official(agent, params, official_layout(cfg, params))
    except (KeyError, ValueError) as err:
        message = err.args[0] if err.args else str(err)
        raise ConfigError(f"import-official error: {message} (set the official run's sizes, e.g. "
                          f"agent.module.dynamics.deter=..., and its env)") from err
    run_dir = make_run_dir(cfg, root, kind="_official")
    payload = {"agent": torch.nn.Module.state_dict(agent), "obs_shapes": obs_shapes, "action_spec": spec,
               "config": OmegaConf.to_container(cfg, resolve=True), "counters": {"env_steps": 0, "updates": 0,
                                                                               "frames": 0},
               "eval_return": float("nan"), "eval_episodes": 0,
               "official": {"version": version, "checkpoint": str(Path(checkpoint).expanduser().resolve())}}
    save_best(run_dir / "checkpoints", payload)
    # checkpoint 0 (fresh optimiser states) is what `reverie train init_from=RUN` reads; nothing to resume
    save_checkpoint(run_dir / "checkpoints", 0, payload | {"agent": agent.state_dict()}, keep=1)
    return run_dir


def official_layout(cfg, params: dict) -> dict | None:
    """The vector layout for reverie's DMC ``vector`` (the official envs keep dm_control's entries as separate keys):
    dm_control's proprio keys with the checkpoint's widths; None for other envs."""
    if cfg.env.get("suite") != "dmc" or not cfg.env.get("proprio", False) or cfg.env.get("proprio_split", False):
        return None  # not DMC, or its entries as separate keys as the official envs
    from reverie.envs import make_env

    env = make_env(cfg.env, cfg.seed)
    try:
        keys = list(getattr(env.unwrapped, "proprio_keys"))
    finally:
        env.close()
    return dmc_layout(params, keys)
