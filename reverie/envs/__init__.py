"""The env layer: the only code that imports gymnasium, ale-py, dm_control, envpool and minari.

Builds envs that keep the data contract of :mod:`reverie.types` and steps them (docs/envs.md)."""

from reverie.envs.factory import (
    SUITES,
    action_spec,
    env_metadata,
    make_env,
    make_vector_env,
    reward_threshold,
    to_env_action,
    write_env_metadata,
)
from reverie.envs.stepper import VectorStepper
from reverie.envs.wrappers import UnsupportedSpaceError

__all__ = [
    "make_env", "make_vector_env", "action_spec", "to_env_action", "UnsupportedSpaceError", "VectorStepper",
    "env_metadata", "write_env_metadata", "SUITES",
]
