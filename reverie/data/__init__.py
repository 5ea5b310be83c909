"""Learning from logged data (docs/offline.md): datasets of episodes as replay rows, read from a folder of ``.npz``
files, a Minari dataset or another run's replay, validated against the env config, filled into a replay
(:mod:`reverie.data.fill`), recorded from a policy (:mod:`reverie.data.record`)."""

from reverie.data.episodes import Dataset, DatasetError, Episode, validate
from reverie.data.fill import fill_replay
from reverie.data.load import load_dataset

__all__ = ["Dataset", "DatasetError", "Episode", "validate", "fill_replay", "load_dataset"]
