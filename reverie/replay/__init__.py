"""Replay: time-first ring buffer (``Replay``) and the train-ratio scheduler (``Ratio``)."""

from reverie.replay.buffer import Replay
from reverie.replay.ratio import Ratio

__all__ = ["Replay", "Ratio"]
