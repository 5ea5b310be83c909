"""Agents: own optimisers, loss weights, slow networks and normalisers (DESIGN.md section 1)."""

from reverie.agents.dreamer import DreamerV3

__all__ = ["DreamerV3"]
