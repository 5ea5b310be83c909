"""``reverie sweep``: hyperparameter sweeps over many seeds on Ray Tune, on one machine or a Ray cluster.

Modules: ``spec`` (sweep files), ``space`` (configurations, ids, Tune domains), ``trial`` (one ``reverie train``
subprocess), ``runner`` (Ray Tune), ``progress``, ``summary`` (tables, comparisons, plots), ``cli``; docs/sweep.md.
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
