"""Search space -> configurations (grid and random draws) and -> Ray Tune domains (Optuna).

Grid and random searches are expanded here, not by Ray Tune's variant generator, which would redraw random values
for every seed; draws use ``numpy.random.default_rng(search.seed)`` in file order, so a configuration keeps its id
when an interrupted sweep runs again and its finished trials are skipped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from typing import Any

import numpy as np

from reverie.sweep.spec import Param, SweepSpec, _format_value


def configurations(spec: SweepSpec) -> list[dict[str, Any]]:
    """``[{key: value}, ...]``: grid parameters crossed in file order, each of ``spec.samples`` random draws crossed
    with every grid point; an ablation: :func:`baseline` first, then each other value of one key at a time, in file
    order. Raises ValueError for an Optuna search (the searcher makes its configurations)."""
    if spec.algorithm == "optuna":
        raise ValueError("optuna searches get their configurations from the searcher, not from configurations()")
    grid = spec.grid_params
    if spec.algorithm == "ablation":
        base = baseline(spec)
        return [base] + [{**base, p.key: value} for p in grid for value in p.values[1:]]
    points = [dict(zip([p.key for p in grid], values)) for values in itertools.product(*(p.values for p in grid))]
    if spec.algorithm == "grid":
        return points
    rng = np.random.default_rng(spec.search_seed)
    draws = [{p.key: sample(p, rng) for p in spec.random_params} for _ in range(spec.samples)]
    return [{**point, **draw} for draw in draws for point in points]


def baseline(spec: SweepSpec) -> dict[str, Any]:
    """An ablation's reference configuration: every grid key at its first value."""
    return {p.key: p.values[0] for p in spec.grid_params}


def sample(param: Param, rng: np.random.Generator) -> Any:
    """One draw of a random parameter (``randint``: in ``[lo, hi)``); floats rounded to 6 significant digits so that
    the override, the id and the config file agree."""
    if param.kind == "choice":
        return param.values[int(rng.integers(len(param.values)))]
    lo, hi = param.values
    if param.kind == "randint":
        return int(rng.integers(lo, hi))
    if param.kind == "uniform":
        return _round(float(rng.uniform(lo, hi)))
    if param.kind == "loguniform":
        return _round(float(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    raise ValueError(f"{param.key}: {param.kind} is not a random distribution")


def config_id(params: dict[str, Any]) -> str:
    """A stable, file-name-safe id, e.g. ``model_lr-0.0003_3f2a9c``: last key part and value of each parameter plus
    a hash of the exact values; no ``=`` (Hydra's override grammar rejects it in a path)."""
    canonical = json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True, default=str)
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:6]
    label = "_".join(f"{k.split('.')[-1]}-{_short(params[k])}" for k in sorted(params))
    label = re.sub(r"[^A-Za-z0-9_.+-]", "-", label)[:60]
    return f"{label}_{digest}" if label else digest


def overrides(params: dict[str, Any]) -> list[str]:
    """``reverie train`` overrides for a configuration: ``["agent.module.model_lr=0.0003", ...]``."""
    return [f"{key}={_format_value(value)}" for key, value in params.items()]


def trial_name(cid: str, seed: int) -> str:
    """Directory name of one trial (a configuration and a seed) under ``<sweep>/trials/``."""
    return f"{cid}_seed{seed}"


def tune_domains(spec: SweepSpec) -> dict[str, Any]:
    """The search space as Ray Tune domains for Optuna TPE (``grid`` and ``choice`` become ``tune.choice``)."""
    from ray import tune

    domains: dict[str, Any] = {}
    for p in spec.params:
        if p.kind in ("grid", "choice"):
            domains[p.key] = tune.choice(list(p.values))
        elif p.kind == "uniform":
            domains[p.key] = tune.uniform(*p.values)
        elif p.kind == "loguniform":
            domains[p.key] = tune.loguniform(*p.values)
        else:
            domains[p.key] = tune.randint(*p.values)
    return domains


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
