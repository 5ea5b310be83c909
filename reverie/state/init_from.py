"""``reverie train init_from=RUN``: start a new run from another run's agent (docs/offline.md).

What is taken: the world model (parameters and its optimiser's moments) always; actor, critic, slow critic and
return normaliser too when RUN trained them (a ``reverie train`` run, or a ``reverie pretrain`` run with
``pretrain.behavior=true``), else they start fresh as in any new run. With ``init.keep_data`` the new run's replay
is first filled with RUN's replay (for a pretrain run: the logged dataset). Counters, clocks, RNG states and the
env start fresh: this is a new run, not a resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reverie.state.checkpoint import load_checkpoint


class InitError(ValueError):
    """An ``init_from`` run that cannot start this one; the message names the problem and the fix."""


def load_init(path: str | Path) -> dict[str, Any]:
    """The newest readable checkpoint payload of the run (or checkpoint file) ``path``.

    Raises:
        InitError: nothing there, or no checkpoint readable.
    """
    try:
        return load_checkpoint(path)
    except (FileNotFoundError, RuntimeError) as err:
        raise InitError(f"init_from={path}: {err}") from err


def trained_behavior(payload: dict[str, Any]) -> bool:
    """Whether the run trained its actor and critic: every ``reverie train`` run; a ``reverie pretrain`` run (its
    config has ``pretrain.data``) only with ``pretrain.behavior``."""
    pretrain = payload["config"].get("pretrain") or {}
    return not pretrain.get("data") or bool(pretrain.get("behavior"))


def apply_init(agent: Any, payload: dict[str, Any], obs_shapes: dict, spec: Any) -> list[str]:
    """Load ``payload``'s agent into ``agent`` (see the module docstring); returns what was loaded.

    Raises:
        InitError: other observation shapes or action space than this run's env, or an agent state that does not
            fit this agent (another agent, size or architecture).
    """
    where = f"init_from={Path(payload['checkpoint_path']).parent.parent}"
    theirs = {k: tuple(v) for k, v in payload["obs_shapes"].items()}
    if theirs != {k: tuple(v) for k, v in obs_shapes.items()} or payload["action_spec"] != spec:
        raise InitError(f"{where}: that run observes {theirs} and acts in {payload['action_spec']}, this env config "
                        f"{obs_shapes} and {spec}; use the env config of the run (env=..., env.id=...)")
    behavior = trained_behavior(payload)
    try:
        if hasattr(agent, "load_pretrained"):
            return agent.load_pretrained(payload["agent"], behavior)
        agent.load_state_dict(payload["agent"])
        return ["agent"]
    except (RuntimeError, KeyError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InitError(f"{where}: its agent does not fit this config ({first}); use the same agent, size and "
                        f"agent.module settings as that run") from err
