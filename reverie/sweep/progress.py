"""Sweep progress: one plain line whenever a trial starts, finishes, fails or is retried.

Plain lines, not a live display: sweeps run long in log files, with Ray workers printing around them. A Ray Tune
``Callback``, so it runs in the driver only.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from ray.tune import Callback

from reverie.sweep.space import config_id


class SweepProgress(Callback):
    """Counts trials done / running / failed and the best finished trial so far (``metric``: higher is better, or
    lower with ``maximise=False``). ``total``: Tune trials (configurations x seeds; Optuna: configurations);
    ``done_before``: trials an earlier run finished that Tune will not see; ``stream``: default stdout."""

    def __init__(self, total: int, metric: str, done_before: int = 0, stream: Any = None, maximise: bool = True):
        self.total, self.metric, self.maximise = total, metric, maximise
        self.stream = stream or sys.stdout
        self.running: set[str] = set()
        self.done: list[str] = [f"earlier-{i}" for i in range(done_before)]
        self.failed: list[str] = []
        self.retried = 0
        self.best: tuple[float, str] | None = None
        self.start = time.time()

    # --- Ray Tune Callback hooks ---
    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(trial.trial_id)
        self._line(f"started {self._name(trial)}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.running.discard(trial.trial_id)
        self.done.append(trial.trial_id)
        result = trial.last_result or {}
        value = result.get(self.metric)
        if value is not None and math.isfinite(float(value)) and result.get("done", True):
            if self.best is None or (float(value) > self.best[0]) == self.maximise:
                self.best = (float(value), self._name(trial))
        text = f"{float(value):.4g}" if value is not None else "n/a"
        self._line(f"finished {self._name(trial)}: {self.metric} {text}")

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.retried += 1
        self._line(f"retrying {self._name(trial)} after a failure")

    def on_trial_error(self, iteration, trials, trial, **info):
        self.running.discard(trial.trial_id)
        self.failed.append(self._name(trial))
        self._line(f"FAILED {self._name(trial)} (see its train.log)")

    def close(self) -> None:
        self._line("sweep finished" if not self.running else "sweep stopped")

    # --- helpers ---
    def status(self) -> str:
        best = f" | best so far {self.best[1]}: {self.metric} {self.best[0]:.4g}" if self.best else ""
        return (f"{len(self.done)}/{self.total} done, {len(self.running)} running, {len(self.failed)} failed, "
                f"{self.retried} retried{best}")

    def _line(self, event: str) -> None:
        minutes = (time.time() - self.start) / 60
        print(f"[sweep {minutes:5.1f} min] {event} -- {self.status()}", file=self.stream, flush=True)

    @staticmethod
    def _name(trial) -> str:
        config = trial.config or {}
        if "trial" in config:
            return f"{config_id(config['trial']['params'])} seed {config['trial']['seed']}"
        params = {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in config.get("params", {}).items()}
        return config_id(params) if params else str(trial.trial_id)
