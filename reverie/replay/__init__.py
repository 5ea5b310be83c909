"""Replay: time-first ring buffer (``Replay``) and the train-ratio scheduler (``Ratio``)."""

from reverie.replay.buffer import LATENT_KEYS, Replay
from reverie.replay.ratio import Ratio

__all__ = ["LATENT_KEYS", "Replay", "Ratio"]
