"""Issue 27: the start-up estimate ("checkpoints up to X each") is within 15% of the checkpoint a DMC run writes.

The DMC envs used to be pickled whole (12 MB each: the model's textures), so a run that announced 4.0 MiB wrote
58 MB checkpoints. Now they hold a few KiB of state each, and the estimate counts what remains, measured by
pickling the stepper's state at start-up (``Session._checkpoint_extra_bytes``).
"""

from pathlib import Path

import pytest

from reverie.cli import main


def checkpoint_bytes(run_dir: Path) -> int:
    """The newest ``ckpt_*.pt`` plus its replay snapshot folder, in bytes."""
    newest = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1]
    replay = newest.with_suffix(".replay")
    return newest.stat().st_size + sum(f.stat().st_size for f in replay.iterdir())


@pytest.mark.parametrize("env", ["dmc_proprio", "dmc_vision"])
def test_estimate_is_within_15_percent_of_the_dmc_checkpoint(tmp_path, monkeypatch, env):
    pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")
    from reverie.envs import dmc
    from reverie.loop import session_build as session

    if env == "dmc_vision":
        try:
            dmc.select_gl(required=True)
        except dmc.GLUnavailableError as err:
            pytest.skip(f"no headless OpenGL for DMC pixels here: {err}")
    reports = []
    real_preflight = session.preflight
    monkeypatch.setattr(session, "preflight", lambda *a, **k: reports.append(real_preflight(*a, **k)) or reports[-1])
    run_dir = tmp_path / env
    # the replay holds all 24 steps at the end: the last checkpoint is the largest the estimate speaks of
    assert main(["train", "exp=debug", f"env={env}", "env.num_envs=2", "env.time_limit=10", f"run_dir={run_dir}",
                 "train.steps=24", "train.prefill=12", "train.eval_every=0", "train.eval_episodes=1",
                 "train.checkpoint_every=0"]) == 0
    (report,) = reports
    real = checkpoint_bytes(run_dir)
    assert abs(report["checkpoint_bytes"] - real) <= 0.15 * real, (report, real)
    assert report["env_bytes"] < 200_000  # the envs' state, rows and the rest: no pickled simulator
