"""Scores: official DreamerV3 score files and reverie runs in one table, protocols, normalised aggregates.

Typical use (what ``reverie compare`` does)::

    from reverie.scores import read_official, read_runs, reference_path, get_protocol, run_scores, task_scores
    ref = read_official(reference_path("atari100k", "dreamerv3"), method="dreamerv3")
    ours = read_runs(["runs/"], suite="atari100k", method="reverie")
    scores = run_scores(pd.concat([ref, ours]), get_protocol("atari100k"))  # one row per run
    task_scores(scores)                                                     # one row per task and method

Modules: ``readers`` (files -> tidy table), ``baselines`` (human/random, normalisation), ``protocols``
(which episodes score a run), ``aggregate`` (rliable aggregates, two-set comparison), ``plots``, ``cli``.
"""

from reverie.scores.aggregate import aggregates, compare_sets, permutation_test, score_matrix
from reverie.scores.baselines import ATARI100K_RANDOM_HUMAN, load_baselines, normalise
from reverie.scores.protocols import PROTOCOLS, Protocol, get_protocol, in_window, run_scores, task_scores
from reverie.scores.readers import (COLUMNS, ScoreFormatError, canonical_task, find_runs, read_official, read_run,
                                    read_runs, reference_path)

__all__ = [
    "ATARI100K_RANDOM_HUMAN", "COLUMNS", "PROTOCOLS", "Protocol", "ScoreFormatError", "aggregates", "canonical_task",
    "compare_sets", "find_runs", "get_protocol", "in_window", "load_baselines", "normalise", "permutation_test",
    "read_official", "read_run", "read_runs", "reference_path", "run_scores", "score_matrix", "task_scores",
]
