"""Replay: time-first ring buffer (``Replay``) and the train-ratio scheduler (``Ratio``)."""

from reverie.replay.buffer import LATENT_FLAG, LATENT_PREFIX, Replay, is_latent_key, latent_key
from reverie.replay.ratio import Ratio

__all__ = ["LATENT_FLAG", "LATENT_PREFIX", "Replay", "Ratio", "is_latent_key", "latent_key"]
