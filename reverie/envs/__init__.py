"""The env layer: the only code that imports gymnasium. Builds contract envs and steps them (DESIGN.md 1-2)."""

from reverie.envs.factory import action_spec, make_env, make_vector_env, to_env_action
from reverie.envs.stepper import VectorStepper
from reverie.envs.wrappers import UnsupportedSpaceError

__all__ = ["make_env", "make_vector_env", "action_spec", "to_env_action", "UnsupportedSpaceError", "VectorStepper"]
