"""Load a trained run and act with it: ``load_run(path).act(obs, state)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from reverie.checkpoint import load_checkpoint
from reverie.envs import to_env_action


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
        """Policy step returning actions ready for envs built by :func:`reverie.make_env`/``make_vector_env``.

        Args:
            obs: one env's observation dict (e.g. ``{"vector": (F,)}``) or a batch of ``N`` (``(N, F)``), as
                returned by ``reset``/``step``. ``is_first`` is optional: without it, the episode starts when
                ``state`` is None.
            state: None at the start of an episode, then the state this method returned.
            mode: ``"eval"`` (policy mode) or ``"sample"``.

        Returns:
            ``(action, state)``: an ``int`` (Discrete) or ``(A,)`` float32 in ``[-1, 1]`` (Box) for one env;
            ``(N,)`` int64 or ``(N, A)`` for a batch.
        """
        key = next(iter(self.obs_shapes))
        single = np.asarray(obs[key]).ndim == len(self.obs_shapes[key])
        batch = {k: np.asarray(obs[k])[None] if single else np.asarray(obs[k]) for k in self.obs_shapes}
        n = len(batch[key])
        is_first = obs.get("is_first", np.full(n, state is None))
        batch["is_first"] = np.asarray(is_first, bool).reshape(n)
        action, state = self.agent.act(batch, state, mode)
        env_action = to_env_action(action, self.action_spec)
        return (env_action[0].item() if self.action_spec.discrete else env_action[0]) if single else env_action, state


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
