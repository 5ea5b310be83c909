"""Human/random baselines and score normalisation: Atari ``(return - random) / (human - random)``, DMC
``return / 1000``, other suites the raw return.

The Atari pairs are the 26 Atari100k games of the standard table (Mnih et al. 2015 / Badia et al. 2020), from
danijar/dreamerv3 ``scores/baselines.yaml`` (group ``atari57_gamer``; identical to Atari100k's
``RANDOM.json``/``HUMAN.json``); other Atari57 games need that file (:func:`load_baselines`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

ATARI100K_RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    # task: (random, human); source: danijar/dreamerv3 scores/baselines.yaml, atari57_gamer
    "atari_alien": (227.8, 7127.7), "atari_amidar": (5.8, 1719.5), "atari_assault": (222.4, 742.0),
    "atari_asterix": (210.0, 8503.3), "atari_bank_heist": (14.2, 753.1), "atari_battle_zone": (2360.0, 37187.5),
    "atari_boxing": (0.1, 12.1), "atari_breakout": (1.7, 30.5), "atari_chopper_command": (811.0, 7387.8),
    "atari_crazy_climber": (10780.5, 35829.4), "atari_demon_attack": (152.1, 1971.0), "atari_freeway": (0.0, 29.6),
    "atari_frostbite": (65.2, 4334.7), "atari_gopher": (257.6, 2412.5), "atari_hero": (1027.0, 30826.4),
    "atari_jamesbond": (29.0, 302.8), "atari_kangaroo": (52.0, 3035.0), "atari_krull": (1598.0, 2665.5),
    "atari_kung_fu_master": (258.5, 22736.3), "atari_ms_pacman": (307.3, 6951.6), "atari_pong": (-20.7, 14.6),
    "atari_private_eye": (24.9, 69571.3), "atari_qbert": (163.9, 13455.0), "atari_road_runner": (11.5, 7845.0),
    "atari_seaquest": (68.4, 42054.7), "atari_up_n_down": (533.4, 11693.2),
}

NORMALISERS = {"atari100k": "human", "atari57": "human", "dmc_proprio": "dmc", "dmc_vision": "dmc"}
"""Suite -> normaliser: ``human`` (random/human), ``dmc`` (/1000); suites not listed use the raw return."""

DMC_MAX_RETURN = 1000.0


def load_baselines(path: str | Path, group: str = "atari57_gamer") -> dict[str, tuple[float, float]]:
    """``{task: (random, human)}`` from a ``baselines.yaml`` (danijar/dreamerv3 format: group -> task -> [lo, hi]).
    Raises FileNotFoundError (no file), KeyError (no ``group``) and ValueError (an entry not a pair)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"baselines file {path} does not exist")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if group not in data:
        raise KeyError(f"{path} has no group {group!r}; groups: {', '.join(map(str, data))}")
    table = {}
    for task, pair in data[group].items():
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise ValueError(f"{path}: {group}.{task} should be [random, human], got {pair!r}")
        table[str(task)] = (float(pair[0]), float(pair[1]))
    return table


def normaliser(suite: str) -> str:
    """``human``, ``dmc`` or ``none`` for ``suite``."""
    return NORMALISERS.get(suite, "none")


def normalise(returns: np.ndarray | pd.Series | float, task: str, suite: str,
              baselines: dict[str, tuple[float, float]] | None = None) -> np.ndarray:
    """Normalised score of raw ``returns`` (any shape, kept) on ``task`` (official spelling) by ``suite``'s
    normaliser; ``baselines`` defaults to :data:`ATARI100K_RANDOM_HUMAN`. KeyError for a task without a baseline."""
    values = np.asarray(returns, dtype=np.float64)
    kind = normaliser(suite)
    if kind == "dmc":
        return values / DMC_MAX_RETURN
    if kind == "human":
        table = ATARI100K_RANDOM_HUMAN if baselines is None else baselines
        if task not in table:
            raise KeyError(f"no random/human baseline for {task!r} (suite {suite}); pass a baselines.yaml with "
                           f"--baselines-yaml (danijar/dreamerv3 scores/baselines.yaml covers all 57 Atari games)")
        random, human = table[task]
        return (values - random) / (human - random)
    return values


def score_label(suite: str) -> str:
    """Axis/column label of the normalised score of ``suite``."""
    return {"human": "human-normalised score", "dmc": "return / 1000"}.get(normaliser(suite), "return")
