"""The world model's open-loop error on held-out logged episodes (``pretrain.heldout``; ``bench/offline_finetune.py``):
on fixed-seed windows (the same for every model compared) it observes :data:`reverie.viz.report.CONTEXT` rows and
predicts the rest open loop from the logged actions (:func:`reverie.viz.openloop.open_loop`)."""

from __future__ import annotations

from typing import Any

from reverie.data.episodes import Dataset
from reverie.data.fill import fill_replay


def heldout_replay(dataset: Dataset) -> Any:
    """A one-column replay holding the validated ``dataset``'s rows exactly (windows may cross episodes, each
    crossing marked by ``is_first``, as in training)."""
    from reverie.replay import Replay

    first = dataset.episodes[0].rows
    spec = {key: (value.shape[1:], value.dtype) for key, value in first.items()}
    replay = Replay(max(dataset.steps, 2), 1, spec)
    fill_replay(replay, dataset.episodes)
    return replay


def heldout_errors(agent: Any, replay: Any, length: int, sequences: int, seed: int = 0) -> dict[str, float]:
    """Open-loop and reconstruction errors of ``agent``'s world model on ``sequences`` windows of ``length`` rows:
    ``heldout/openloop/<key>_error``, ``heldout/recon/<key>_error``, ``heldout/openloop/reward_error`` (vectors in raw
    units, images in ``[0, 1]``), ``heldout/quality/<key>_psnr_k<k>``, ...; empty when shorter than one window."""
    from reverie.viz.openloop import open_loop, prediction_errors
    from reverie.viz.quality import prediction_quality
    from reverie.viz.report import sample_for_report

    batch = sample_for_report(replay, sequences, length, seed=seed)
    if batch is None:
        return {}
    result = open_loop(agent, batch, context=heldout_context(length), seed=seed)
    metrics = prediction_errors(result) | prediction_quality(result)
    return {f"heldout/{key}": value for key, value in metrics.items()}


def heldout_context(length: int) -> int:
    """Context rows of a held-out window of ``length`` rows: :data:`reverie.viz.report.CONTEXT`, fewer in short
    windows (at least 1)."""
    from reverie.viz.report import CONTEXT

    return max(1, min(CONTEXT, length - 1))


def run_heldout_windows(cfg: Any) -> tuple[dict[str, Any] | None, int]:
    """The held-out windows a run with ``pretrain.heldout`` was scored on (:func:`heldout_errors` as the run
    calls it: ``pretrain.heldout_sequences`` windows of ``agent.batch_length`` rows, seed 0), from its resolved
    config ``cfg``: ``(batch (T, B, ...) or None, context rows)``. A relative dataset path is read from the
    current folder. Raises what :func:`reverie.data.load_dataset` raises."""
    from reverie.data.load import load_dataset
    from reverie.viz.report import sample_for_report

    length = int(cfg.agent.batch_length)
    replay = heldout_replay(load_dataset(cfg.pretrain.heldout, cfg.env))
    return sample_for_report(replay, int(cfg.pretrain.heldout_sequences), length, seed=0), heldout_context(length)
