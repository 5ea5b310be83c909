"""Agents: own optimisers, loss weights, slow networks and normalisers (DESIGN.md section 1)."""

from reverie.agents.dreamer import DreamerV3
from reverie.agents.dreamer2025 import DreamerV3_2025
from reverie.agents.planet import PlaNet

__all__ = ["DreamerV3", "DreamerV3_2025", "PlaNet"]
