"""Valid ranges of the numeric config keys, checked before anything is written.

``reverie train`` calls :func:`check_ranges` before it builds an env or creates the run directory, and
:func:`reverie.train.train` calls it first too (the Python API), so ``train.steps=0`` ends in one
``config error:`` line naming every bad key, its value, its range and an example, and nothing on disk.
Keys that are absent (an agent without a ``train_ratio``, PlaNet's ``train_steps``) are not checked; ``null``
is allowed where the config documents it (``threads``, ``train.control_hz``, ``env.time_limit``, ...).
``trainer.nproc`` and ``trainer.backend`` are checked by :func:`reverie.runtime.process_group.trainer_settings`,
at the same point; ``agent.module`` values by the agent's constructor (``agent error:`` at start-up).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

#: key -> (lowest valid value, lowest included?, integer?, null allowed?, what it is)
RANGES: dict[str, tuple[float, bool, bool, bool, str]] = {
    "train.steps": (0, False, True, False, "env steps to collect"),
    "train.prefill": (0, True, True, False, "random-policy env steps before learning"),
    "train.log_every": (0, True, True, False, "env steps between metric rows; 0: only at the end"),
    "train.eval_every": (0, True, True, False, "env steps between evaluations; 0: only at the end"),
    "train.eval_episodes": (1, True, True, False, "episodes per evaluation"),
    "train.checkpoint_every": (0, True, True, False, "env steps between checkpoints; 0: only at the end"),
    "train.checkpoint_keep": (1, True, True, False, "newest checkpoints kept"),
    "train.max_nonfinite_updates": (0, True, True, False, "skipped updates in a row before stopping; 0: never"),
    "train.env_retries": (0, True, True, False, "env rebuilds in a row before giving up"),
    "train.report_every": (0, True, True, False, "updates between open-loop reports; 0: off"),
    "train.policy_sync_every": (1, True, True, False, "updates between policy-copy refreshes"),
    "train.control_hz": (0, False, False, True, "collector steps per second; null: off"),
    "train.max_minutes": (0, False, False, True, "wall minutes before the run stops; null: never"),
    "train.stop_evals": (1, True, True, False, "evaluations in a row at or above train.stop_return to stop"),
    "train.stop_confirm": (0, True, True, False, "episodes of the confirmation evaluation before a stop; 0: none"),
    "agent.train_ratio": (0, False, False, False, "replayed steps per env step"),
    "agent.batch_size": (1, True, True, False, "sequences per batch (B)"),
    "agent.batch_length": (1, True, True, False, "steps per sequence (T)"),
    "agent.train_steps": (1, True, True, False, "updates per collected episode (PlaNet)"),
    "agent.collect_every": (1, True, True, False, "episodes collected per training phase (PlaNet)"),
    "replay.capacity": (1, True, True, False, "replay steps over all envs"),
    "env.num_envs": (1, True, True, False, "parallel envs"),
    "env.action_repeat": (1, True, True, True, "env steps per agent step"),
    "env.time_limit": (1, True, True, True, "agent steps per episode; null: the env's own"),
    "threads": (1, True, True, True, "torch threads; null: the idle cores at start"),
    "init.prefill": (0, True, True, False, "random-policy env steps before an init_from run's agent acts"),
    "pretrain.updates": (0, False, True, False, "updates of reverie pretrain"),
    "pretrain.log_every": (0, True, True, False, "updates between metric rows; 0: only at the end"),
    "pretrain.eval_every": (0, True, True, False, "updates between evaluations; 0: only at the end"),
    "pretrain.eval_episodes": (0, True, True, False, "episodes per evaluation; 0: never act in the env"),
    "pretrain.checkpoint_every": (0, True, True, False, "updates between checkpoints; 0: only at the end"),
    "pretrain.report_every": (0, True, True, False, "updates between open-loop reports; 0: off"),
    "pretrain.heldout_sequences": (1, True, True, False, "held-out windows for the open-loop error"),
    "trainer.timeout_min": (0, False, False, True, "minutes a rank waits for the others"),
}


def value_problem(key: str, value: Any, rule: tuple[float, bool, bool, bool, str] | None = None) -> str | None:
    """What is wrong with ``key=value`` under ``rule`` (default ``RANGES[key]``; same tuple), or None."""
    low, inclusive, integer, nullable, what = RANGES[key] if rule is None else rule
    if value is None:
        return None if nullable else f"{key}=null: needs a value ({what})"
    bound = f"{'>=' if inclusive else '>'} {low:g}"
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key}={value!r} is not a number: must be {kind} {bound} ({what})"
    if integer and value != int(value):
        return f"{key}={value!r} must be {kind} {bound} ({what})"
    if value < low or (value == low and not inclusive):
        return f"{key}={value!r} must be {bound} ({what})"
    return None


DERIVED = {"pretrain.eval_episodes": "train.eval_episodes"}
"""Keys whose default is another key's value (``${...}`` in config.yaml): checked only where they differ from it."""


def range_errors(cfg: Any) -> list[str]:
    """The keys of ``cfg`` (a DictConfig or a plain mapping) outside :data:`RANGES`, one message each."""
    plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    errors = []
    for key in RANGES:
        value = _get(plain, key)
        if key in DERIVED and value == _get(plain, DERIVED[key]):  # the value of its source: named there
            continue
        if value is not _ABSENT and (problem := value_problem(key, value)) is not None:
            errors.append(problem)
    capacity, envs = _get(plain, "replay.capacity"), _get(plain, "env.num_envs")
    if not errors and isinstance(capacity, int) and isinstance(envs, int) and capacity // envs < 2:  # Replay's MIN_ROWS
        errors.append(f"replay.capacity={capacity} with env.num_envs={envs} leaves {capacity // envs} rows per env; "
                      f"needs replay.capacity >= {2 * envs}")
    return errors


def check_ranges(cfg: Any) -> None:
    """Raise ``ValueError("config error: ...")`` listing every key outside its range (nothing when all fit)."""
    errors = range_errors(cfg)
    if errors:
        raise ValueError("config error: " + "; ".join(errors) + ". Fix the value(s) on the command line (e.g. "
                         "train.steps=30000); `reverie train --cfg` prints the whole config.")


_ABSENT = object()


def _get(plain: Mapping, key: str) -> Any:
    """``plain["a"]["b"]`` for ``"a.b"``, or ``_ABSENT``."""
    node: Any = plain
    for part in key.split("."):
        node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
    return node
