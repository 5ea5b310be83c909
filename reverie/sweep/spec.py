"""Sweep files: the YAML that drives ``reverie sweep``, parsed and validated before anything runs.

Top-level keys: :data:`TOP_KEYS`; the annotated file format is in docs/sweep.md, examples in ``examples/sweeps/``.
Every error raised here is a :class:`SweepSpecError` whose message names the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from pathlib import Path
from typing import Any

import yaml

DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
"""Search-space distributions: ``grid`` (every value, crossed with the other grid parameters), ``choice`` (one of
the values at random), ``uniform`` ``[lo, hi]``, ``loguniform`` ``[lo, hi]`` (both > 0), ``randint`` ``[lo, hi)``."""

ALGORITHMS = ("grid", "random", "optuna", "ablation")
"""``grid``: the grid parameters only (no random ones allowed); ``random``: ``samples`` random draws (crossed with
the grid); ``optuna``: Optuna TPE through Ray Tune's integration, ``samples`` configurations; ``ablation``: one
knob at a time: the baseline (every grid key at its first value) and each other value of one key with the rest at
the baseline, compared against the baseline (grid keys only)."""

METRICS = ("eval_return",)
"""Trial metrics: ``eval_return`` = mean return of the last evaluation (``summary.json``; higher is better), and
the prediction quality of the run's last open-loop report, a ``summary.json`` entry as well (:data:`QUALITY`:
``quality/<key>_psnr`` or ``_ssim``, their ``_recon`` and ``_onestep`` forms; higher is better)."""
QUALITY = re.compile(r"^(heldout/)?quality/\w+_(psnr|ssim)(_recon|_onestep)?$")
ERRORS = re.compile(r"^(heldout/)?quality/reward_error$")
"""Trial metrics where lower is better: the mean absolute error of the reward head's open-loop prediction
(``summary.json``), the one quality a decoder-free world model (no images to score) reports."""


def maximised(metric: str) -> bool:
    """Whether a larger ``metric`` is better: True for returns, PSNR and SSIM, False for :data:`ERRORS`."""
    return not ERRORS.match(metric)
COMMANDS = ("train", "pretrain")
"""What each trial runs: ``reverie train`` (env steps; ``budget`` sets ``train.steps``) or ``reverie pretrain DATA``
(the dataset ``data``, no env steps; ``budget`` sets ``pretrain.updates``): every trial learns from the same rows."""

TOP_KEYS = ("name", "command", "data", "base", "budget", "space", "search", "seeds", "metric", "resources",
            "max_concurrent", "retries", "scheduler")
SEARCH_KEYS = ("algorithm", "samples", "seed")
RESOURCE_KEYS = ("cpus", "gpus")
ASHA_KEYS = ("grace_steps", "reduction_factor")


class SweepSpecError(ValueError):
    """A sweep file that cannot be run; the message names the offending key and how to fix it."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One swept parameter: a ``reverie train`` config key and its distribution.

    Attributes:
        key: dotted config key, e.g. ``agent.module.model_lr``.
        kind: one of :data:`DISTRIBUTIONS`.
        values: the values (``grid``/``choice``) or ``[lo, hi]`` bounds (``uniform``/``loguniform``/``randint``).
    """

    key: str
    kind: str
    values: tuple

    @property
    def log_scale(self) -> bool:
        """True when plots should use a log axis: loguniform, or positive numbers spanning > 1 decade."""
        if self.kind == "loguniform":
            return True
        numbers = [v for v in self.values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return len(numbers) == len(self.values) and min(numbers, default=0) > 0 and \
            max(numbers) / min(numbers) > 10


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file.

    Attributes:
        name: sweep name (directory name under ``sweeps/`` by default).
        base: ``reverie train`` overrides shared by every trial (``budget`` already folded in as ``train.steps``).
        params: the search space, in file order.
        algorithm: ``grid`` | ``random`` | ``optuna``.
        samples: random/optuna configurations (1 for a pure grid).
        search_seed: seed of the random draws (and of Optuna's sampler).
        seeds: training seeds run for every configuration.
        metric: the trial metric (:data:`METRICS`, :data:`QUALITY`, :data:`ERRORS`); maximised, except the errors
            (:func:`maximised`).
        cpus, gpus: resources per trial (Ray Tune ``with_resources``).
        max_concurrent: cap on running trials (None: resources decide).
        retries: Ray Tune ``FailureConfig.max_failures``.
        asha: None, or ``{"grace_steps": int, "reduction_factor": float}`` for the ASHA scheduler.
        source: the parsed YAML mapping (saved as ``<sweep>/sweep.yaml``).
        command, data: ``"train"``, or ``"pretrain"`` with its dataset (:data:`COMMANDS`).
    """

    name: str
    base: tuple[str, ...]
    params: tuple[Param, ...]
    algorithm: str = "grid"
    samples: int = 1
    search_seed: int = 0
    seeds: tuple[int, ...] = (0,)
    metric: str = "eval_return"
    cpus: float = 1.0
    gpus: float = 0.0
    max_concurrent: int | None = None
    retries: int = 2
    asha: dict | None = None
    source: dict = dataclasses.field(default_factory=dict, compare=False)
    command: str = "train"
    data: str | None = None

    @property
    def grid_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind == "grid")

    @property
    def random_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind != "grid")


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file.

    Raises:
        SweepSpecError: the file is missing or not YAML, or :func:`parse_spec` rejects it.
    """
    path = Path(path)
    if not path.is_file():
        raise SweepSpecError(f"sweep file {path} does not exist (examples: examples/sweeps/*.yaml)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise SweepSpecError(f"sweep file {path} is not valid YAML: {err}") from err
    return parse_spec(data, default_name=path.stem, where=str(path))


def parse_spec(data: Any, default_name: str = "sweep", where: str = "sweep file") -> SweepSpec:
    """Validate a parsed sweep mapping (see the module docstring for the keys) into a :class:`SweepSpec`.

    Raises:
        SweepSpecError: not a mapping; an unknown key at any level (the message lists the known ones and the
            nearest match); an empty search space; a distribution with no values or bad bounds; a grid-only
            search given random parameters; a bad number of seeds, samples, resources or retries.
    """
    if not isinstance(data, dict):
        raise SweepSpecError(f"{where}: expected a mapping with keys {', '.join(TOP_KEYS)}; got {type(data).__name__}")
    _check_keys(data, TOP_KEYS, where)
    name = str(data.get("name") or default_name)
    if not name or "/" in name or name.startswith("."):
        raise SweepSpecError(f"{where}: name {name!r} must be a plain directory name (no '/')")
    base = _overrides(data.get("base"), where)
    command = str(data.get("command") or "train")
    if command not in COMMANDS:
        raise SweepSpecError(f"{where}: command {command!r} is not one of {', '.join(COMMANDS)}")
    dataset = data.get("data")
    if (command == "pretrain") != (dataset is not None):
        raise SweepSpecError(f"{where}: 'data' (a dataset folder, minari:<id> or a run) goes with command: pretrain "
                             f"and only with it; got command {command!r} and data {dataset!r}")
    length = "pretrain.updates" if command == "pretrain" else "train.steps"
    if data.get("budget") is not None:
        if any(o.split("=", 1)[0] == length for o in base):
            raise SweepSpecError(f"{where}: both 'budget' and {length} in base set each trial's length; keep one")
        base.append(f"{length}={_positive_int(data['budget'], 'budget', where)}")
    params = _space(data.get("space"), where)
    swept = {p.key for p in params}
    clash = [o for o in base if o.lstrip("+~").split("=", 1)[0] in swept]
    if clash:
        raise SweepSpecError(f"{where}: {clash[0]!r} in base sets a parameter that 'space' sweeps; remove it from base")
    if any(o.lstrip("+~").split("=", 1)[0] == "seed" for o in base) or "seed" in swept:
        raise SweepSpecError(f"{where}: 'seed' is set by the sweep; list training seeds under 'seeds' instead")

    search = data.get("search") or {}
    if not isinstance(search, dict):
        raise SweepSpecError(f"{where}: 'search' must be a mapping with keys {', '.join(SEARCH_KEYS)}")
    _check_keys(search, SEARCH_KEYS, f"{where}: search")
    has_random = any(p.kind != "grid" for p in params)
    algorithm = str(search.get("algorithm") or ("random" if has_random else "grid"))
    if algorithm not in ALGORITHMS:
        raise SweepSpecError(f"{where}: search.algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if algorithm in ("grid", "ablation") and has_random:
        names = ", ".join(p.key for p in params if p.kind != "grid")
        raise SweepSpecError(f"{where}: search.algorithm is {algorithm} but {names} use random distributions; set "
                             f"search.algorithm: random (or optuna) with search.samples, or make them grid lists")
    single = algorithm in ("grid", "ablation")
    samples = _positive_int(search.get("samples", 1 if single else 8), "search.samples", where)
    if single and samples != 1:
        what = "every grid point" if algorithm == "grid" else "each of its configurations"
        raise SweepSpecError(f"{where}: search.samples is {samples} but a {algorithm} search runs {what} once; "
                             f"drop samples, or use algorithm random/optuna")
    search_seed = int(search.get("seed", 0))

    seeds = _seeds(data.get("seeds", 1), where)
    metric = str(data.get("metric") or "eval_return")
    if metric not in METRICS and not QUALITY.match(metric) and not ERRORS.match(metric):
        raise SweepSpecError(f"{where}: metric {metric!r} is not supported; supported: {', '.join(METRICS)}, or a "
                             f"prediction quality quality/<key>_psnr | _ssim (e.g. quality/image_psnr; also "
                             f"..._psnr_recon, ..._psnr_onestep) or quality/reward_error (minimised), each also "
                             f"with heldout/: a run's open-loop reports must be on")
    resources = data.get("resources") or {}
    if not isinstance(resources, dict):
        raise SweepSpecError(f"{where}: 'resources' must be a mapping like {{cpus: 1, gpus: 0}}")
    _check_keys(resources, RESOURCE_KEYS, f"{where}: resources")
    cpus = _number(resources.get("cpus", 1), "resources.cpus", where)
    gpus = _number(resources.get("gpus", 0), "resources.gpus", where, allow_zero=True)
    max_concurrent = data.get("max_concurrent")
    if max_concurrent is not None:
        max_concurrent = _positive_int(max_concurrent, "max_concurrent", where)
    retries = data.get("retries", 2)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise SweepSpecError(f"{where}: retries must be an integer >= 0 (runs of a failed trial), got {retries!r}")
    asha = _asha(data.get("scheduler"), where)
    if asha and command == "pretrain":
        raise SweepSpecError(f"{where}: scheduler.asha reads each trial's evaluations in the env as it trains; "
                             f"command: pretrain trials are judged at their end: drop the scheduler")
    if asha and algorithm == "optuna":
        raise SweepSpecError(f"{where}: scheduler.asha works with search.algorithm grid or random (one seed per Ray "
                             f"trial); Optuna trials run their seeds in turn. Drop the scheduler or use random search")
    return SweepSpec(name=name, base=tuple(base), params=params, algorithm=algorithm, samples=samples,
                     search_seed=search_seed, seeds=seeds, metric=metric, cpus=cpus, gpus=gpus,
                     max_concurrent=max_concurrent, retries=retries, asha=asha,
                     source=data, command=command, data=None if dataset is None else str(dataset))


def _check_keys(mapping: dict, known: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise SweepSpecError(f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(known)}")


def _overrides(base: Any, where: str) -> list[str]:
    """``base`` as a list of ``key=value`` strings (a list of them, or a mapping ``key: value``)."""
    if base is None:
        return []
    if isinstance(base, dict):
        return [f"{k}={_format_value(v)}" for k, v in base.items()]
    if isinstance(base, (list, tuple)) and all(isinstance(o, str) and "=" in o for o in base):
        return list(base)
    raise SweepSpecError(f"{where}: 'base' must be a list of `reverie train` overrides like [exp=classic, "
                         f"threads=1] or a mapping {{exp: classic}}; got {base!r}")


def _space(space: Any, where: str) -> tuple[Param, ...]:
    example = "space: {agent.module.model_lr: {grid: [1.0e-4, 3.0e-4]}}"
    if space is None or (isinstance(space, dict) and not space):
        raise SweepSpecError(f"{where}: empty search space: 'space' needs at least one parameter, e.g. {example}")
    if not isinstance(space, dict):
        raise SweepSpecError(f"{where}: 'space' must map config keys to distributions, e.g. {example}")
    params = []
    for key, dist in space.items():
        at = f"{where}: space.{key}"
        if isinstance(dist, list):  # shorthand: a plain list is a grid
            dist = {"grid": dist}
        if not isinstance(dist, dict) or len(dist) != 1:
            raise SweepSpecError(f"{at} must be one distribution {{KIND: VALUES}} with KIND one of "
                                 f"{', '.join(DISTRIBUTIONS)}, e.g. {{grid: [0.5, 1.0]}}; got {dist!r}")
        kind, values = next(iter(dist.items()))
        _check_keys({kind: None}, DISTRIBUTIONS, at)
        if isinstance(values, list):  # PyYAML reads 1e-4 (no dot) as a string
            values = [_as_number(v) for v in values]
        if not isinstance(values, list) or not values:
            raise SweepSpecError(f"{at}: empty search space: {kind} needs a non-empty list of values, e.g. "
                                 f"{{{kind}: {'[0.5, 1.0]' if kind in ('grid', 'choice') else '[lo, hi]'}}}")
        if kind in ("uniform", "loguniform", "randint"):
            if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise SweepSpecError(f"{at}: {kind} takes two numbers [lo, hi]; got {values!r}")
            lo, hi = values
            if not lo < hi:
                raise SweepSpecError(f"{at}: {kind} bounds [lo, hi] need lo < hi; got [{lo}, {hi}]")
            if kind == "loguniform" and lo <= 0:
                raise SweepSpecError(f"{at}: loguniform bounds must be > 0; got [{lo}, {hi}]")
            if kind == "randint" and not all(isinstance(v, int) for v in values):
                raise SweepSpecError(f"{at}: randint bounds must be integers; got {values!r}")
        elif len(set(map(repr, values))) != len(values):
            raise SweepSpecError(f"{at}: {kind} lists a value twice: {values!r}")
        params.append(Param(str(key), kind, tuple(values)))
    return tuple(params)


def _seeds(seeds: Any, where: str) -> tuple[int, ...]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return tuple(range(_positive_int(seeds, "seeds", where)))
    if isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        if len(set(seeds)) != len(seeds):
            raise SweepSpecError(f"{where}: seeds lists a seed twice: {seeds!r}")
        return tuple(seeds)
    raise SweepSpecError(f"{where}: seeds must be a count (3 -> seeds 0, 1, 2) or a non-empty list of integers; "
                         f"got {seeds!r}")


def _asha(scheduler: Any, where: str) -> dict | None:
    if scheduler is None:
        return None
    if not isinstance(scheduler, dict) or list(scheduler) != ["asha"]:
        raise SweepSpecError(f"{where}: scheduler must be null or {{asha: {{grace_steps: 1000, reduction_factor: "
                             f"2}}}} (ASHA early stopping); got {scheduler!r}")
    options = scheduler["asha"] or {}
    if not isinstance(options, dict):
        raise SweepSpecError(f"{where}: scheduler.asha must be a mapping with keys {', '.join(ASHA_KEYS)}")
    _check_keys(options, ASHA_KEYS, f"{where}: scheduler.asha")
    grace = _positive_int(options.get("grace_steps", 1000), "scheduler.asha.grace_steps", where)
    factor = _number(options.get("reduction_factor", 2), "scheduler.asha.reduction_factor", where)
    if factor <= 1:
        raise SweepSpecError(f"{where}: scheduler.asha.reduction_factor must be > 1, got {factor}")
    return {"grace_steps": grace, "reduction_factor": factor}


def _positive_int(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SweepSpecError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _number(value: Any, key: str, where: str, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0 \
            or (value == 0 and not allow_zero):
        raise SweepSpecError(f"{where}: {key} must be a {'non-negative' if allow_zero else 'positive'} number, "
                             f"got {value!r}")
    return float(value)


def _as_number(value: Any) -> Any:
    """``"1e-4"`` -> ``1e-4``; anything else unchanged."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _format_value(value: Any) -> str:
    """A Hydra override value: lists/dicts as YAML flow, None as null, numbers with ``repr`` precision."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value) if not isinstance(value, float) else repr(value)
