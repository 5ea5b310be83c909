"""``reverie sweep``: hyperparameter sweeps over many seeds on Ray Tune, on one machine or a Ray cluster.

Typical use (what ``reverie sweep FILE`` does)::

    from reverie.sweep import load_spec, run_sweep
    spec = load_spec("examples/sweeps/cartpole_train_ratio.yaml")
    summary = run_sweep(spec, "sweeps/cartpole_train_ratio")            # local Ray; address="auto" for a cluster
    print(summary["best"]["command"])

Modules: ``spec`` (sweep file parsing and validation), ``space`` (configurations, ids, Ray Tune domains),
``trial`` (one trial = one ``reverie train`` run directory, run as a subprocess), ``runner`` (Ray Tune),
``progress`` (status lines), ``summary`` (tables, comparisons, plots), ``cli``.
"""

from reverie.sweep.space import config_id, configurations
from reverie.sweep.spec import SweepSpec, SweepSpecError, load_spec, parse_spec

__all__ = ["SweepSpec", "SweepSpecError", "config_id", "configurations", "load_spec", "parse_spec", "run_sweep",
           "write_summary"]


def run_sweep(*args, **kwargs):
    """:func:`reverie.sweep.runner.run_sweep` (imported on use: Ray loads only when a sweep runs)."""
    from reverie.sweep.runner import run_sweep as run

    return run(*args, **kwargs)


def write_summary(*args, **kwargs):
    """:func:`reverie.sweep.summary.write_summary` (imported on use)."""
    from reverie.sweep.summary import write_summary as write

    return write(*args, **kwargs)
