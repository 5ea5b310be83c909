"""Keys added with Hydra's ``+key=value`` / ``++key=value`` that nothing would read (``+agent.foo=1`` would run a
whole run with ``foo`` ignored; Hydra refuses only a plain ``key=value`` on a missing key).

An added key is read when it lies anywhere under a ``kwargs`` mapping or a mapping empty in the config, directly in
a block with a ``_target_`` (its constructor refuses unknown keys when the agent is built) or in a ``loss_scales``
mapping (checked against the agent's losses), or is one of :data:`OPTIONAL_KEYS`. ``+group=option`` is left to Hydra.
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
    ``compose`` is called once, without the ``+``/``++`` overrides; if that fails, the check is skipped."""
    adds = added(overrides)
    if not adds:
        return None
    dropped = {o for o, _ in adds}
    try:
        base = compose([o for o in overrides if o not in dropped])
    except Exception:  # noqa: BLE001 - best effort; the full config composed
        return None
    return next(((o, key) for o, key in adds if not reads(base, key)), None)
