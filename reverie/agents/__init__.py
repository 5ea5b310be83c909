"""Agents: the Agent protocol (``base.py``), DreamerV3, PlaNet and STORM, planners and returns; an agent owns its
optimisers, loss weights, slow networks and normalisers (docs/architecture.md)."""

from reverie.agents.dreamer import DreamerV3
from reverie.agents.dreamer2025 import DreamerV3_2025
from reverie.agents.planet import PlaNet
from reverie.agents.storm import Storm

__all__ = ["DreamerV3", "DreamerV3_2025", "PlaNet", "Storm"]
