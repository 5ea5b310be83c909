"""The env layer: the only code that imports gymnasium, ale-py, dm_control, envpool and minari.

Builds contract envs and steps them (DESIGN.md 1-2)."""

from reverie.envs.factory import (
    SUITES,
    action_spec,
    env_metadata,
    make_env,
    make_vector_env,
    to_env_action,
    write_env_metadata,
)
from reverie.envs.stepper import VectorStepper
from reverie.envs.wrappers import UnsupportedSpaceError

__all__ = [
    "make_env", "make_vector_env", "action_spec", "to_env_action", "UnsupportedSpaceError", "VectorStepper",
    "env_metadata", "write_env_metadata", "SUITES",
]
