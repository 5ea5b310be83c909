"""Which scoring suite a reverie run belongs to, from the env settings it was trained with.

Training writes ``<run_dir>/env_metadata.json`` (:func:`reverie.envs.factory.env_metadata`: the env family
``suite`` = ``gym``/``atari``/``dmc`` and its protocol settings). The scoring suite follows from it:

* ``dmc`` with ``image`` among its ``observations`` -> ``dmc_vision``; ``dmc`` without -> ``dmc_proprio``;
* ``atari`` with ``sticky_action_probability`` 0 -> ``atari100k`` (``env=atari100k``: no sticky actions, 30 no-ops);
  ``atari`` with sticky actions -> ``atari57`` (``env=atari``: the Machado et al. 2018 protocol of the long runs);
* ``gym`` (anything else) -> ``generic``.

A run without ``env_metadata.json`` (written before it existed) gets the same answer from its ``config.yaml``'s
``env`` section.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def score_suite(metadata: Mapping[str, Any]) -> str:
    """The scoring suite (``atari100k``, ``atari57``, ``dmc_proprio``, ``dmc_vision``, ``generic``) of an env's
    metadata (the content of ``env_metadata.json``)."""
    family = metadata.get("suite") or "gym"
    if family == "dmc":
        return "dmc_vision" if "image" in (metadata.get("observations") or []) else "dmc_proprio"
    if family == "atari":
        return "atari57" if float(metadata.get("sticky_action_probability") or 0.0) > 0 else "atari100k"
    return "generic"


def run_metadata(run_dir: str | Path) -> tuple[dict[str, Any], str]:
    """``(metadata, source)`` of a run: ``env_metadata.json``, else computed from ``config.yaml``'s ``env``.

    Raises:
        FileNotFoundError: neither file exists.
        ValueError: an unreadable ``env_metadata.json``, or a config whose env the factory rejects.
    """
    run_dir = Path(run_dir)
    path = run_dir / "env_metadata.json"
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8")), "env_metadata.json"
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON ({err}); pass --suite to choose the scoring suite") from err
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir} has neither env_metadata.json nor config.yaml; pass --suite")
    from omegaconf import OmegaConf

    from reverie.envs.factory import env_metadata

    env = OmegaConf.to_container(OmegaConf.load(config), resolve=False).get("env") or {}  # type: ignore[union-attr]
    try:
        return env_metadata(env), "config.yaml"
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{config}: cannot tell the env's suite ({err}); pass --suite") from err


def infer_suite(run_dirs: list[Path]) -> tuple[str, str]:
    """``(suite, source)``: the one scoring suite of all ``run_dirs``; ``source`` names the files it came from.

    Raises:
        ValueError: the runs belong to different suites (the message lists which run is which).
    """
    found: dict[str, list[Path]] = {}
    sources = set()
    for run in run_dirs:
        metadata, source = run_metadata(run)
        found.setdefault(score_suite(metadata), []).append(run)
        sources.add(source)
    if len(found) > 1:
        listing = "; ".join(f"{suite}: {', '.join(map(str, runs[:3]))}{' ...' if len(runs) > 3 else ''}"
                            for suite, runs in sorted(found.items()))
        raise ValueError(f"the runs belong to different suites ({listing}); compare one suite at a time, or pass "
                         f"--suite to score them all under one protocol")
    return next(iter(found)), " and ".join(sorted(sources))
