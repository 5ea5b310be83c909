"""Scores: official score files and reverie runs in one table, protocols, normalised aggregates (``reverie compare``;
its use from Python: ``docs/compare.md``, "In Python")."""

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
