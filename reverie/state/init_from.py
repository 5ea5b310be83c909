"""``reverie train init_from=RUN``: start a new run from another run's agent (docs/offline.md).

The agent and its resolved ``agent.module`` come from RUN, with the command's model overrides on top
(:func:`take_model_settings`) and :data:`RUNTIME_KEYS` the command's. Taken: the world model (with its optimiser
moments) always; actor, critic, slow critic and return normaliser when RUN trained them
(:func:`trained_behavior`); RUN's replay with ``init.keep_data``. Counters, clocks, RNG states and the env start
fresh: a new run, not a resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from reverie.state.checkpoint import load_checkpoint

RUNTIME_KEYS = ("device", "precision", "compile", "kernels", "dynamics.kernels")
"""``agent.module`` keys that say how to run, not what the model is (``device`` follows the root ``device``): always
this command's, never taken from the init_from run."""

MODEL_OVERRIDES = ("agent.module", "size")
"""Overrides that change the model (keys under these, and the ``size=`` group): the user's changes to the settings
``init_from`` takes from its run."""


class InitError(ValueError):
    """An ``init_from`` run that cannot start this one; the message names the problem and the fix."""


def load_init(path: str | Path) -> dict[str, Any]:
    """The newest readable checkpoint payload of the run (or checkpoint file) ``path``; InitError when none."""
    try:
        return load_checkpoint(path)
    except (FileNotFoundError, RuntimeError) as err:
        raise InitError(f"init_from={path}: {err}") from err


def trained_behavior(payload: dict[str, Any]) -> bool:
    """Whether the run trained its actor and critic: every ``reverie train`` run; a ``reverie pretrain`` run (its
    config has ``pretrain.data``) only with ``pretrain.behavior``."""
    pretrain = payload["config"].get("pretrain") or {}
    return not pretrain.get("data") or bool(pretrain.get("behavior"))


def apply_init(agent: Any, payload: dict[str, Any], obs_shapes: dict, spec: Any,
               config: dict[str, Any] | None = None) -> list[str]:
    """Load ``payload``'s agent into ``agent``; returns what was loaded. ``config`` (this run's, resolved) lets a
    misfit name the model settings that differ. Raises InitError for other observation shapes or action space, or
    an agent state that does not fit (another agent, size or architecture)."""
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
        differ = model_differences(payload, config) if config is not None else []
        if differ:
            raise InitError(f"{where}: its agent does not fit this config; these model settings differ from that "
                            f"run's: {'; '.join(differ)}. init_from takes the run's model settings: drop the "
                            f"overrides that change them") from err
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [type(err).__name__]
        raise InitError(f"{where}: its agent does not fit this config ({' '.join(lines[:4])}"
                        f"{' ...' if len(lines) > 4 else ''}); use the same agent, size and agent.module settings "
                        f"as that run") from err


def init_source(args: list[str]) -> str | None:
    """The ``init_from=RUN`` value among Hydra ``args``, or None (also for ``init_from=null``)."""
    values = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("init_from=")]
    return values[-1] if values and values[-1] not in ("", "null", "None") else None


def source_config(path: str | Path) -> dict[str, Any]:
    """The resolved ``config.yaml`` of the run that ``path`` (a run directory, its ``checkpoints/`` or a checkpoint
    file) belongs to; InitError when there is none."""
    from omegaconf import OmegaConf

    path = Path(path)
    for folder in (path, path.parent, path.parent.parent):
        if (folder / "config.yaml").is_file():
            return OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"), resolve=True)  # type: ignore
    if not path.exists():
        raise InitError(f"init_from={path}: no such file or folder; pass a run directory written by "
                        f"`reverie train` or `reverie pretrain`")
    raise InitError(f"init_from={path}: no config.yaml there or in its parents; pass a run directory written by "
                    f"`reverie train` or `reverie pretrain`")


def with_source_agent(args: list[str], source: dict[str, Any]) -> list[str]:
    """``args`` with ``agent=<the source run's agent>`` first when they choose none; InitError for another agent."""
    name = source["agent"]["name"]
    chosen = [a.split("=", 1)[1] for a in args if a.startswith("agent=")]
    if chosen and chosen[-1] != name:
        raise InitError(f"init_from: that run's agent is {name}, this command chooses agent={chosen[-1]}; drop "
                        f"agent={chosen[-1]} (init_from takes the run's agent)")
    return args if chosen else [f"agent={name}", *args]


def is_model_override(override: str) -> bool:
    """Whether a Hydra override changes the model (:data:`MODEL_OVERRIDES`)."""
    key = override.lstrip("+~").split("=", 1)[0]
    return any(key == k or key.startswith(k + ".") for k in MODEL_OVERRIDES)


def take_model_settings(cfg: Any, source: dict[str, Any], args: list[str],
                        compose: Callable[[list[str]], Any]) -> list[str]:
    """Set ``cfg.agent.module`` (composed, resolved) to the source run's module with the model changes of ``args``
    on top (the keys where ``cfg`` differs from ``compose(args without model overrides)``); returns those keys as
    ``agent.module.<key>`` (empty: the source's as is)."""
    from omegaconf import OmegaConf

    from reverie.state.resume import flatten

    mine = flatten(OmegaConf.to_container(cfg.agent.module, resolve=True))
    default = flatten(OmegaConf.to_container(compose([a for a in args if not is_model_override(a)]).agent.module,
                                             resolve=True))
    changed = {k: v for k, v in mine.items() if default.get(k, _ABSENT) != v}
    removed = [k for k in default if k not in mine]
    module = flatten(source["agent"]["module"])
    for key in removed:
        module.pop(key, None)
    module.update(changed)
    module.update({k: mine[k] for k in RUNTIME_KEYS if k in mine})  # how to run: this command's
    cfg.agent.module = OmegaConf.create(_unflatten(module))
    return [f"agent.module.{k}" for k in sorted(changed) + sorted(removed)]


def model_differences(payload: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """``agent.module.<key>: <RUN's> (init_from run) != <this one>`` for each model setting that differs between the
    payload's config and ``config`` (both resolved), plus the agent name (:data:`RUNTIME_KEYS` left out)."""
    from reverie.state.resume import flatten

    theirs, mine = payload["config"]["agent"], config["agent"]
    lines = [] if theirs.get("name") == mine.get("name") else [f"agent: {theirs.get('name')} != {mine.get('name')}"]
    a, b = flatten(theirs.get("module") or {}), flatten(mine.get("module") or {})
    return lines + [f"agent.module.{k}: {a.get(k, '(absent)')} (that run) != {b.get(k, '(absent)')} (this config)"
                    for k in sorted(a.keys() | b.keys())
                    if a.get(k, _ABSENT) != b.get(k, _ABSENT) and k not in RUNTIME_KEYS]


_ABSENT = object()


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out
