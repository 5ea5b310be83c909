"""Evaluating and reporting a run for :class:`reverie.loop.session.Session`: the policy-mode evaluation (and the
best checkpoint it may keep), the metrics rows, the open-loop report (with the held-out error offline) and the final
episode video."""

from __future__ import annotations

import re
import time
from typing import Any

from reverie.loop.evaluate import evaluate, record_episode
from reverie.runtime.cpu_memory import release_freed_memory
from reverie.state.checkpoint import save_best
from reverie.state.rng import preserved_rng
from reverie.viz import report

CONFIRM_SEED_OFFSET = 1_000  # confirmation episodes: env streams apart from the regular evaluations'


class EvalProgress:
    """What an evaluation shows while it runs: ``evaluating 3/10 episodes`` in place of the bar's estimate, or,
    without a live bar (the final evaluation, ``train.progress=false``), a plain line at most every
    ``every_s`` seconds once the evaluation has lasted that long (short evaluations print nothing)."""

    def __init__(self, progress, enabled: bool = True, every_s: float = 10.0, clock=time.monotonic):
        self.progress, self.enabled, self.every_s, self.clock = progress, enabled, every_s, clock
        self.start = self.last = clock()

    def __call__(self, done: int, episodes: int, episode_return: float) -> None:
        text = f"evaluating {done}/{episodes} episodes"
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.status(text, restart=False)
            return
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            print(f"[reverie] {text} (last return {episode_return:.1f}, {now - self.start:.0f} s)", flush=True)

    def close(self) -> None:
        if self.enabled and self.progress is not None:
            self.progress.status(None, restart=False)


def step_means(quality: dict[str, float]) -> dict[str, float]:
    """The entries of ``quality`` that are means over the open loop, not one step's (``..._k<k>``): what
    ``summary.json`` keeps (a sweep's metric)."""
    return {k: v for k, v in quality.items() if not re.search(r"_k\d+$", k)}


class SessionReport:
    """The evaluation and report steps of :class:`reverie.loop.session.Session`."""

    def report(self) -> None:
        """The open-loop report (``reverie.viz``) when its clock (updates) fires, and once more at the end of a run
        whose reports are on; rank 0 alone."""
        clock = self.loop.clocks["report"]
        if (clock(self.loop.updates) or (self.step >= self.steps and clock.every > 0)) and self.info.is_main:
            self.write_report()

    def write_report(self) -> None:
        """Write the open-loop report now (videos/, plots/ and its metrics; :func:`reverie.viz.report`); offline
        with ``pretrain.heldout``, also the open-loop error on the held-out data (``heldout/...``)."""
        result = report(self.agent, self.replay, self.logger, self.step, length=self.batch[1])
        if result is not None:  # the summary's prediction quality: the last report's means over the open loop
            self.quality = step_means(result.quality)
        if self.heldout is not None:
            from reverie.data.heldout import heldout_errors

            errors = heldout_errors(self.agent, self.heldout, self.batch[1], int(self.cfg.pretrain.heldout_sequences))
            self.logger.scalars(errors)
            self.quality |= step_means({k: v for k, v in errors.items() if k.startswith("heldout/quality/")})

    def play(self, episodes: int, seed: int) -> dict[str, Any]:
        """:func:`reverie.loop.evaluate.evaluate` of ``episodes`` episodes in ``train.eval_mode`` with the env copies
        seeded from ``seed``, its progress shown (rank 0), without moving the training random streams."""
        release_freed_memory()  # the updates' freed heap, back before the episodes (peak RSS: docs/dreamerv3.md)
        shown = EvalProgress(self.progress if self.info.is_main else None, self.info.is_main)
        with preserved_rng():
            result = evaluate(self.agent, self.cfg.env, episodes, seed, mode=self.cfg.train.eval_mode,
                              on_episode=shown)
        shown.close()
        return result

    def evaluate(self) -> float:
        """Evaluate the agent (``train.eval_episodes``, or ``pretrain.eval_episodes`` offline; policy mode) without
        moving the training random streams; logged at the run's step; returns the mean return."""
        loop, step = self.loop, self.step
        result = self.play(self.eval_episodes, self.cfg.seed)
        for ret, length in zip(result["returns"], result["lengths"]):
            self.logger.episode(step, loop.env_steps * self.repeat, ret, length, mode="eval")
        loop.evals.append((step, loop.wall_s(), result["mean"]))
        if loop.updates == 0 and not self.cfg.get("init_from") and loop.untrained == len(loop.evals) - 1:
            loop.untrained += 1  # the untrained policy: logged, never best.pt
        self.logger.scalars({"eval/return_mean": result["mean"], "eval/return_std": result["std"]})
        if loop.best_eval() == (step, result["mean"]):  # it beats every earlier evaluation: keep it
            save_best(self.run_dir / "checkpoints", self.best_payload(result["mean"]))
        return result["mean"]

    def confirm(self, episodes: int) -> bool:
        """The confirmation of ``train.stop_confirm``: the policy evaluated on ``episodes`` more episodes (env
        copies seeded apart from the regular evaluations'), logged as ``eval/confirm_return_mean``; True when
        their mean reaches the stop target. The regular evaluation's weights are the ones confirmed (no update
        in between)."""
        target, step = self.stop_target, self.step
        result = self.play(episodes, self.cfg.seed + CONFIRM_SEED_OFFSET)
        self.logger.scalars({"eval/confirm_return_mean": result["mean"], "eval/confirm_return_min": result["min"]})
        held = result["mean"] >= target
        print(f"[reverie] env step {step:,}: mean return {result['mean']:.1f} over {episodes} more episodes "
              f"(min {result['min']:.1f}) {'>=' if held else '<'} train.stop_return {target:g}: "
              f"{'solved, stopping' if held else 'not yet, training goes on'}", flush=True)
        return held

    def write_metrics(self) -> None:
        """One ``metrics.jsonl`` row (interval means) with the loop's counters and rates."""
        loop, elapsed = self.loop, max(self.loop.wall_s(), 1e-9)
        self.written = self.step
        self.logger.write(self.step, {
            "updates": loop.updates, "frames": loop.env_steps * self.repeat, "wall_s": elapsed,
            "fps/env_steps": loop.env_steps / elapsed, "fps/updates": loop.updates / elapsed,
            "guard/skipped_updates": loop.skipped, "env/restarts": self.stepper.restarts})

    def final_video(self) -> None:
        """The video of one evaluation episode at the end of a run (``train.video``), logged at the run's step,
        without moving the training random streams."""
        cfg = self.cfg
        release_freed_memory()
        with preserved_rng(), self.logger.clip("eval/episode", self.step) as clip:  # frames streamed as they come
            record_episode(self.agent, cfg.env, cfg.seed, mode=cfg.train.eval_mode, on_frame=clip.add)
