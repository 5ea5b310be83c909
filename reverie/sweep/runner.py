"""Run a sweep on Ray Tune: local embedded Ray by default, a Ray cluster with ``address`` (docs/sweep.md)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import yaml

import reverie
from reverie.sweep.space import config_id, configurations, tune_domains
from reverie.sweep.spec import SweepSpec, SweepSpecError, maximised
from reverie.sweep.trial import STOPPED, SUMMARY, TRIAL_META, run_trial, trial_dir

SPEC_COPY = "sweep.yaml"


def check_configs(spec: SweepSpec, configs: list[dict[str, Any]]) -> int:
    """Compose reverie's config for every configuration so a typo fails before Ray starts (SweepSpecError);
    returns ``train.steps`` of the first configuration (the ASHA budget)."""
    from reverie.configs.compose import ConfigError, load_config
    from reverie.sweep.space import overrides

    steps = 0
    for i, params in enumerate(configs):
        try:
            cfg = load_config([*spec.base, *overrides(params), "seed=0"])
        except ConfigError as err:
            raise SweepSpecError(f"sweep {spec.name}: configuration {params} is not a valid `reverie train` "
                                 f"config: {err}") from err
        if i == 0 and spec.command == "pretrain":  # read as `reverie pretrain` will, before any trial starts
            check_datasets(spec, cfg)
        steps = steps or int(cfg.train.steps)
    return steps


def check_datasets(spec: SweepSpec, cfg: Any) -> None:
    """A pretrain sweep's dataset and held-out set, read and checked against the env config as each trial's
    ``reverie pretrain`` will (:func:`reverie.data.load_dataset`). SweepSpecError: what it names."""
    from reverie.data import DatasetError, load_dataset

    for key, source in (("data", spec.data), ("pretrain.heldout", cfg.pretrain.get("heldout"))):
        if source:
            try:
                load_dataset(str(source), cfg.env)
            except DatasetError as err:
                raise SweepSpecError(f"sweep {spec.name}: {key} {source!r}: {err} (`reverie record` makes one; "
                                     f"a held-out set from other env seeds)") from err


def prepare_dir(spec: SweepSpec, sweep_dir: Path) -> None:
    """Create ``sweep_dir`` with a copy of the sweep file, or check that it holds this same sweep (else
    SweepSpecError)."""
    copy = sweep_dir / SPEC_COPY
    if copy.is_file():
        previous = yaml.safe_load(copy.read_text(encoding="utf-8"))
        if previous != spec.source:
            raise SweepSpecError(f"{sweep_dir} holds a different sweep ({copy} differs from this sweep file). Rerun "
                                 f"with the original file to continue it, or choose another directory with --dir")
        return
    sweep_dir.mkdir(parents=True, exist_ok=True)
    copy.write_text(yaml.safe_dump(spec.source, sort_keys=False), encoding="utf-8")


def trial_setup(spec: SweepSpec, sweep_dir: Path, cluster: bool) -> dict[str, Any]:
    """Settings for :func:`reverie.sweep.trial.run_trial`; ``python_path`` makes local trials import this driver's
    ``reverie`` (on a cluster, the workers' installed one)."""
    return {"sweep_dir": str(sweep_dir.resolve()), "base": list(spec.base), "seeds": list(spec.seeds),
            "threads": max(1, int(spec.cpus)), "cwd": os.getcwd(), "metric": spec.metric,
            "command": spec.command, "data": spec.data,
            "python_path": None if cluster else str(Path(reverie.__file__).resolve().parents[1])}


def run_sweep(spec: SweepSpec, sweep_dir: str | Path, address: str | None = None, num_cpus: int | None = None,
              num_gpus: int | None = None, verbose: bool = False) -> dict[str, Any]:
    """Run (or continue) the sweep in ``sweep_dir`` and write its summary; finished trials are skipped.

    ``address``: a Ray cluster (``ray://host:10001``, ``host:6379``, ``auto``), or None for a local Ray with
    ``num_cpus``/``num_gpus`` (default: all). Returns :func:`reverie.sweep.summary.write_summary`'s dict plus
    ``"failed"`` (trial names). Raises SweepSpecError for an invalid configuration or a directory of another sweep.
    """
    import ray
    from ray import tune

    from reverie.sweep.progress import SweepProgress
    from reverie.sweep.summary import write_summary

    sweep_dir = Path(sweep_dir).resolve()
    configs = configurations(spec) if spec.algorithm != "optuna" else []
    steps = check_configs(spec, configs or [{p.key: p.values[0] for p in spec.params}])
    prepare_dir(spec, sweep_dir)
    setup = trial_setup(spec, sweep_dir, cluster=address is not None)

    trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup),
                                    {"cpu": spec.cpus, "gpu": spec.gpus})
    best, up = None, maximised(spec.metric)
    if spec.algorithm == "optuna":
        param_space, searcher, samples, total = _optuna(spec, sweep_dir)
        done_before = total - samples
    else:  # trials finished (or stopped by ASHA) in an earlier run are not handed to Tune at all
        trials = [{"params": params, "seed": seed} for params in configs for seed in spec.seeds]
        todo = [t for t in trials if not _finished(trial_dir(sweep_dir, t["params"], t["seed"]))]
        param_space, searcher, total = {"trial": tune.grid_search(todo)}, None, len(trials)
        samples, done_before = (1 if todo else 0), len(trials) - len(todo)
        for t in trials:  # the progress line's "best so far" starts from the finished trials
            path = trial_dir(sweep_dir, t["params"], t["seed"]) / SUMMARY
            value = json.loads(path.read_text(encoding="utf-8")).get(spec.metric) if path.is_file() else None
            if value is not None and math.isfinite(value) and (best is None or (value > best[0]) == up):
                best = (float(value), f"{config_id(t['params'])} seed {t['seed']}")
    scheduler = _asha(spec, steps, sweep_dir) if spec.asha else None
    progress = SweepProgress(total=total, metric=spec.metric, done_before=done_before, maximise=up)
    progress.best = best
    if samples > 0:  # else every trial is finished already: only the summary is rewritten
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=verbose)
            else:
                # kill_child_processes_on_worker_exit off: a stopped trial's `reverie train` gets SIGTERM (from the
                # trial runner, or as its parent-death signal) and saves a checkpoint, instead of Ray's SIGKILL.
                ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=verbose,
                         _system_config={"kill_child_processes_on_worker_exit": False},
                         runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                             filter(None, [setup["python_path"], os.environ.get("PYTHONPATH")]))}})
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            tune_config=tune.TuneConfig(metric=spec.metric, mode="max" if up else "min", search_alg=searcher, scheduler=scheduler,
                                        num_samples=samples, max_concurrent_trials=spec.max_concurrent,
                                        reuse_actors=False),  # a stopped trial may still be saving a checkpoint
            run_config=tune.RunConfig(name=time.strftime("tune_%Y%m%d_%H%M%S"), storage_path=str(sweep_dir / "ray"),
                                      failure_config=tune.FailureConfig(max_failures=spec.retries),
                                      callbacks=[progress], verbose=2 if verbose else 0,
                                      progress_reporter=None if verbose else _Silent()))
        with _sigterm_as_sigint():
            tuner.fit()
    progress.close()
    summary = write_summary(spec, sweep_dir)
    summary["failed"] = progress.failed
    return summary


def _finished(run_dir: Path) -> bool:
    """True for a trial directory that must not run again: ``summary.json`` (finished) or ``sweep_stopped.json``."""
    return (run_dir / SUMMARY).is_file() or (run_dir / STOPPED).is_file()


def _optuna(spec: SweepSpec, sweep_dir: Path):
    """Optuna TPE searcher; configurations already finished (every seed has ``summary.json``) are told to it as
    evaluated points and not run again. Returns ``(param_space, searcher, samples left, samples in total)``."""
    from ray.tune.search.optuna import OptunaSearch

    done: dict[str, tuple[dict, float]] = {}
    for meta in sorted((sweep_dir / "trials").glob(f"*/{TRIAL_META}")):
        info = json.loads(meta.read_text(encoding="utf-8"))
        params = info["params"]
        if set(params) != {p.key for p in spec.params} or info["config_id"] in done:
            continue
        finals = []
        for seed in spec.seeds:
            path = trial_dir(sweep_dir, params, seed) / SUMMARY
            if path.is_file():
                finals.append(float(json.loads(path.read_text(encoding="utf-8"))[spec.metric]))
        if len(finals) == len(spec.seeds) and all(math.isfinite(f) for f in finals):
            done[config_id(params)] = (params, sum(finals) / len(finals))
    points = [p for p, _ in done.values()]
    searcher = OptunaSearch(metric=spec.metric, mode="max" if maximised(spec.metric) else "min", seed=spec.search_seed,
                            points_to_evaluate=points or None,
                            evaluated_rewards=[r for _, r in done.values()] or None)
    return {"params": tune_domains(spec)}, searcher, max(spec.samples - len(done), 0), spec.samples


def _asha(spec: SweepSpec, steps: int, sweep_dir: Path):
    """ASHA on ``env_steps`` (grace ``asha.grace_steps``, budget ``train.steps``) that also marks the trials it
    stops (``sweep_stopped.json``), so a rerun of the sweep does not start them again."""
    from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

    class MarkingASHA(AsyncHyperBandScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == TrialScheduler.STOP and not result.get("done"):
                params, seed = trial.config["trial"]["params"], trial.config["trial"]["seed"]
                path = trial_dir(sweep_dir, params, seed)
                path.mkdir(parents=True, exist_ok=True)
                (path / STOPPED).write_text(json.dumps({
                    "env_steps": int(result["env_steps"]), spec.metric: float(result[spec.metric]),
                    "stopped_early": True}, indent=2), encoding="utf-8")
            return decision

    grace = min(int(spec.asha["grace_steps"]), steps)
    return MarkingASHA(time_attr="env_steps", max_t=max(steps, 1), grace_period=max(grace, 1),
                       reduction_factor=spec.asha["reduction_factor"])


@contextlib.contextmanager
def _sigterm_as_sigint():
    """While Tune runs, SIGTERM stops the sweep like Ctrl-C (trials checkpoint, the summary is written). Main thread
    only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Silent:
    """A Tune progress reporter that prints nothing (the sweep's own progress lines replace Tune's tables)."""

    def setup(self, *args, **kwargs):  # noqa: D401 - Tune's ProgressReporter protocol
        pass

    def should_report(self, trials, done=False):
        return False

    def report(self, trials, done, *sys_info):
        pass
