"""The one place a config becomes an agent: ``agent.module`` (a Hydra ``_target_`` block) plus the env's shapes."""

from __future__ import annotations

from typing import Any

import hydra.utils
from omegaconf import DictConfig

from reverie.types import ActionSpec


def build_agent(agent_cfg: DictConfig, obs_shapes: dict[str, tuple[int, ...]], spec: ActionSpec) -> Any:
    """Instantiate ``agent_cfg.module`` (nested ``_target_`` blocks included) with the env's shapes and action spec."""
    factory = hydra.utils.instantiate(agent_cfg.module, _partial_=True, _convert_="all")
    return factory(obs_shapes=obs_shapes, action_spec=spec)
