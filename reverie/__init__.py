"""reverie: model-based reinforcement learning with learned world models (DreamerV3, PlaNet) in PyTorch.
Public API: ``from reverie import DreamerV3, PlaNet, make_env, make_vector_env, Replay, train, evaluate, load_run``."""

from reverie.agents.dreamer import DreamerV3
from reverie.agents.planet import PlaNet
from reverie.envs import make_env, make_vector_env
from reverie.loop.evaluate import evaluate
from reverie.replay import Replay
from reverie.state.saved_run import load_run
from reverie.train import train

__all__ = ["DreamerV3", "PlaNet", "make_env", "make_vector_env", "Replay", "train", "evaluate", "load_run"]
__version__ = "0.1.0"
