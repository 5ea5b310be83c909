"""Keys added with Hydra's ``+key=value`` / ``++key=value`` that nothing would read.

A plain ``key=value`` on a key the config lacks is refused by Hydra itself; ``+`` and ``++`` add the key instead, so
``+agent.foo=1`` would run a whole run with ``foo`` ignored. :func:`unread_added_key` finds such a key by comparing
with the config composed without the ``+``/``++`` overrides. A key may be added where something reads it:

* anywhere under a ``kwargs`` mapping (``env.kwargs``: the env constructor's arguments) or under a mapping that is
  empty in the config (free-form);
* directly inside a block with a ``_target_`` (``agent.module``, ``agent.module.dynamics``): the object built from
  it takes the key as an argument, and refuses an unknown one when the agent is built, before anything is written
  (``+agent.module.dynamics={_target_: ...}`` after ``~agent.module.dynamics`` plugs in a new dynamics);
* directly inside a ``loss_scales`` mapping (``+agent.module.loss_scales.<key>``: the scale of a new loss term);
  the agent checks the table against its losses as a set when it is built, so a scale of no loss is refused there;
* the keys in :data:`OPTIONAL_KEYS`, which the code reads with a default and the shipped configs may lack.

``+group=option`` (a config group such as ``+exp=debug``) adds a group, not a key, and is left to Hydra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

OPTIONAL_KEYS = frozenset({
    "agent.schedule",       # reverie/replay/cycle.py make_schedule: "ratio" (default) or "episodes"
    "agent.train_steps",    # with schedule=episodes: updates per collection phase (cycle.py)
    "agent.collect_every",  # with schedule=episodes: episodes per collection phase (cycle.py)
    "env.wrappers",         # reverie/envs/factory.py: user wrappers, [] when absent
    "env.kwargs",           # reverie/envs/factory.py: env constructor arguments, {} when absent
})
"""Keys read with a default (the module that reads each is named beside it) that ``+key=...`` may add."""

GROUPS = frozenset(p.name for p in Path(__file__).parent.iterdir() if p.is_dir() and not p.name.startswith("_"))
"""The config groups (``agent``, ``env``, ``exp``, ...): ``+group=option`` adds a group, not a key."""


def added(overrides: list[str]) -> list[tuple[str, str]]:
    """``(override, key)`` for each ``+key=value`` / ``++key=value`` in ``overrides`` (config groups left out)."""
    found = []
    for override in overrides:
        if not override.startswith("+") or "=" not in override:
            continue
        key = override.lstrip("+").split("=", 1)[0].strip()
        if key and not (key in GROUPS or key.split("@")[0] in GROUPS):
            found.append((override, key))
    return found


def reads(base: DictConfig, key: str) -> bool:
    """Whether adding dotted ``key`` to ``base`` (the config without the ``+`` overrides) adds something read."""
    if key in OPTIONAL_KEYS:
        return True
    node, parts = base, key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return False  # a value, not a mapping, sits on the key's path
        if part not in node:
            parent = parts[:depth]
            scale = depth > 0 and parent[-1] == "loss_scales" and depth == len(parts) - 1
            return (depth > 0 and parent[-1] == "kwargs") or scale or len(node) == 0 or (
                "_target_" in node and depth == len(parts) - 1)
        if part == "kwargs" and depth < len(parts) - 1:
            return True  # anything under a kwargs mapping goes to a constructor
        node = node[part]
    return True  # the key exists already (``++`` on an existing key sets it)


def unread_added_key(overrides: list[str], compose: Callable[[list[str]], DictConfig]) -> tuple[str, str] | None:
    """The first ``(override, key)`` of ``overrides`` that adds a key nothing reads (module docstring), or None.

    ``compose(overrides)`` composes a config (unresolved is fine); it is called once, without the ``+``/``++``
    overrides, and only when there are some. A composition that fails without them (a later override needs an
    added key) skips the check: the config with them composed already.
    """
    adds = added(overrides)
    if not adds:
        return None
    dropped = {o for o, _ in adds}
    try:
        base = compose([o for o in overrides if o not in dropped])
    except Exception:  # noqa: BLE001 - best effort; the full config composed
        return None
    return next(((o, key) for o, key in adds if not reads(base, key)), None)
