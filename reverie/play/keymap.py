"""Keyboard -> action for ``reverie play``, one map per action space (tables: docs/play.md): the held keys
(``KeyboardEvent.key`` names, in press order) -> an index (Atari joystick meanings; digits and letters; arrows for 2
or 3 actions) or a ``[-1, 1]`` vector (Box: a key pair per dimension, up to 6; larger Box spaces: the policy drives).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reverie.types import ActionSpec

#: Joystick parts of an Atari action meaning and the keys that press them.
ATARI_KEYS = {"ArrowUp": "UP", "ArrowDown": "DOWN", "ArrowLeft": "LEFT", "ArrowRight": "RIGHT", " ": "FIRE"}
#: (minus, plus) keys of Box dimensions 0..5.
BOX_KEYS = (("ArrowLeft", "ArrowRight"), ("ArrowDown", "ArrowUp"), ("a", "d"), ("s", "w"), ("j", "l"), ("k", "i"))
#: Keys that step with the no-op action (Atari NOOP, Box zeros).
NOOP_KEYS = ("n",)
INDEX_KEYS = "0123456789abcdefghijklmnopqrstuvwxyz"  # Discrete(n): key INDEX_KEYS[i] -> action i
_PARTS = ("UP", "DOWN", "LEFT", "RIGHT", "FIRE")


def _parts(meaning: str) -> frozenset[str]:
    """``"UPRIGHTFIRE"`` -> ``{"UP", "RIGHT", "FIRE"}``; ``"NOOP"`` -> ``{}``."""
    return frozenset(p for p in _PARTS if p in meaning)


@dataclass
class KeyMap:
    """Keys -> actions for one action space: ``labels`` a name per discrete action (``"UPFIRE"``) or Box dimension,
    ``keys`` every bound key, ``help`` ``[(keys, what they do)]`` rows for the page."""

    spec: ActionSpec
    labels: list[str]
    keys: list[str]
    help: list[tuple[str, str]]
    meanings: list[str] | None = None
    index_of: dict[str, int] = field(default_factory=dict)  # Discrete without meanings: key -> action

    @classmethod
    def for_env(cls, spec: ActionSpec, meanings: list[str] | None = None) -> "KeyMap":
        """The map for ``spec``; ``meanings`` (Atari's ``get_action_meanings()``) selects the joystick map."""
        if spec.discrete and meanings is not None and len(meanings) == spec.dim:
            return cls(spec, list(meanings), [*ATARI_KEYS, *NOOP_KEYS],
                       [("arrows", "joystick (combinations too)"), ("Space", "FIRE (with arrows: UPFIRE, ...)"),
                        ("n", "NOOP")], meanings=list(meanings))
        if spec.discrete:
            index_of = {INDEX_KEYS[i]: i for i in range(min(spec.dim, len(INDEX_KEYS)))}
            help_rows = [(f"0-{INDEX_KEYS[min(spec.dim, len(INDEX_KEYS)) - 1]}", "action with that index")]
            if spec.dim == 2:
                index_of |= {"ArrowLeft": 0, "ArrowRight": 1}
                help_rows.append(("← →", "actions 0, 1"))
            elif spec.dim == 3:
                index_of |= {"ArrowLeft": 0, "ArrowDown": 1, "ArrowRight": 2}
                help_rows.append(("← ↓ →", "actions 0, 1, 2"))
            return cls(spec, [str(i) for i in range(spec.dim)], list(index_of), help_rows, index_of=index_of)
        if spec.dim > len(BOX_KEYS):
            return cls(spec, [f"a[{i}]" for i in range(spec.dim)], [],
                       [("-", f"Box({spec.dim}) has more dimensions than key pairs ({len(BOX_KEYS)}): watch the "
                              f"policy")])
        pairs = BOX_KEYS[:spec.dim]
        return cls(spec, [f"a[{i}]" for i in range(spec.dim)], [k for pair in pairs for k in pair] + [" ", *NOOP_KEYS],
                   [(f"{lo} / {hi}", f"a[{i}] = -1 / +1") for i, (lo, hi) in enumerate(pairs)]
                   + [("Space, n", "all zeros")])

    def action(self, keys: list[str]) -> int | np.ndarray | None:
        """The action for the held ``keys`` (press order): an index (Discrete; the last bound key wins) or ``(A,)``
        float32 (Box); None when no bound key is held."""
        keys = [k for k in keys if k in self.keys]
        if not keys:
            return None
        if not self.spec.discrete:
            action = np.zeros(self.spec.dim, np.float32)
            for i, (lo, hi) in enumerate(BOX_KEYS[:self.spec.dim]):
                action[i] = float(hi in keys) - float(lo in keys)
            return action
        if self.meanings is None:
            return self.index_of[keys[-1]]
        held = frozenset(ATARI_KEYS[k] for k in keys if k in ATARI_KEYS)
        parts = [_parts(m) for m in self.meanings]
        if held in parts:
            return parts.index(held)
        # no meaning with exactly these parts: the one sharing the most, then with the fewest extra parts
        return max(range(len(parts)), key=lambda i: (len(parts[i] & held), -len(parts[i] - held)))

    def label(self, action: Any) -> str:
        """A short name of an action for the page (``"LEFT"``, ``"1"``, ``"[-1.00, 0.00]"``)."""
        if self.spec.discrete:
            return self.labels[int(action)]
        return "[" + ", ".join(f"{v:+.2f}" for v in np.asarray(action).reshape(-1)) + "]"

    def to_json(self) -> dict[str, Any]:
        return {"discrete": self.spec.discrete, "dim": self.spec.dim, "labels": self.labels, "keys": self.keys,
                "help": [list(row) for row in self.help]}
