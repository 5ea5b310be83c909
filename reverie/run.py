"""Load a trained run and act with it: ``load_run(path).act(obs, state)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from reverie.checkpoint import load_checkpoint


class LoadedRun:
    """A trained agent with the resolved config it was trained with.

    Attributes:
        agent: the agent (Agent protocol), in eval mode.
        config: the resolved run config (plain dict).
        obs_shapes, action_spec: what the agent expects and emits.
    """

    def __init__(self, agent: Any, config: dict, obs_shapes: dict, action_spec: Any, counters: dict):
        self.agent, self.config, self.obs_shapes, self.action_spec = agent, config, obs_shapes, action_spec
        self.counters = counters

    def initial_state(self, batch: int = 1) -> Any:
        return self.agent.initial_state(batch)

    def act(self, obs: dict[str, np.ndarray], state: Any = None, mode: str = "eval") -> tuple[np.ndarray, Any]:
        """Policy step for ``N`` envs: ``obs`` dict of ``(N, ...)`` arrays incl. ``is_first (N,)``.

        Returns ``(action (N, A) float32, state)``; see :meth:`reverie.agents.base.Agent.act`.
        """
        return self.agent.act(obs, state, mode)


def load_run(path: str | Path, device: str = "cpu") -> LoadedRun:
    """Rebuild the agent of a run directory (newest checkpoint) or of a checkpoint file.

    Raises:
        FileNotFoundError: no checkpoint under ``path``.
    """
    from reverie.train import build_agent

    payload = load_checkpoint(path, map_location=device)
    config = payload["config"]
    agent_cfg = OmegaConf.create(config["agent"])
    agent_cfg.module.device = device
    agent = build_agent(agent_cfg, payload["obs_shapes"], payload["action_spec"])
    agent.load_state_dict(payload["agent"])
    agent.eval()
    return LoadedRun(agent, config, payload["obs_shapes"], payload["action_spec"], payload.get("counters", {}))
