"""Which scoring suite a reverie run belongs to, from its ``env_metadata.json`` (or its ``config.yaml``'s ``env``).

``dmc`` -> ``dmc_vision`` with ``image`` observations, else ``dmc_proprio``; ``atari`` -> ``atari100k`` without
sticky actions (``env=atari100k``), ``atari57`` with them (``env=atari``, Machado et al. 2018); else ``generic``.
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
    Raises FileNotFoundError (neither file) and ValueError (unreadable JSON, or an env the factory rejects)."""
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
    """``(suite, source)``: the one scoring suite of all ``run_dirs`` and the files it came from; ValueError when
    they belong to different suites."""
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
