"""Scores: official score files and reverie runs in one table, protocols, normalised aggregates.

Typical use (what ``reverie compare`` does)::

    from reverie.scores import read_official, read_runs, reference_path, get_protocol, run_scores, task_scores
    ref = read_official(reference_path("atari100k", "dreamerv3"), method="dreamerv3")
    ours = read_runs(["runs/"], suite="atari100k", method="reverie")
    scores = run_scores(pd.concat([ref, ours]), get_protocol("atari100k"))  # one row per run
    task_scores(scores)                                                     # one row per task and method

Modules: ``readers`` (files -> tidy table, how a score file's points are read), ``references`` (which file a
``--reference`` means), ``suites`` (a run's scoring suite from its env metadata), ``baselines`` (human/random,
normalisation), ``protocols`` (which episodes score a run), ``aggregate`` (rliable aggregates, bootstrap CIs,
two-set comparison), ``report`` (the Markdown tables), ``plots``, ``output`` (the output folder), ``cli``,
``fetch`` (``reverie scores fetch``: the official files at pinned commits, checksummed).
"""

from reverie.scores.aggregate import aggregates, compare_sets, mean_interval, permutation_test, score_matrix
from reverie.scores.baselines import ATARI100K_RANDOM_HUMAN, load_baselines, normalise
from reverie.scores.protocols import PROTOCOLS, Protocol, get_protocol, in_window, run_scores, task_scores
from reverie.scores.readers import (COLUMNS, READINGS, Reading, ScoreFormatError, canonical_task, find_runs,
                                    read_official, read_run, read_runs, read_score_file)
from reverie.scores.references import available, reference_path
from reverie.scores.suites import infer_suite, score_suite

__all__ = [
    "ATARI100K_RANDOM_HUMAN", "COLUMNS", "PROTOCOLS", "Protocol", "READINGS", "Reading", "ScoreFormatError",
    "aggregates", "available", "canonical_task", "compare_sets", "find_runs", "get_protocol", "in_window",
    "infer_suite", "load_baselines", "mean_interval", "normalise", "permutation_test", "read_official", "read_run",
    "read_runs", "read_score_file", "reference_path", "run_scores", "score_matrix", "score_suite", "task_scores",
]
