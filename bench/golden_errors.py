"""The largest differences between reverie's update and the official goldens, per case and kernel setting (the
table in docs/fidelity.md; the tolerances are tests/goldens/test_official_update.py's).

    .venv/bin/python bench/golden_errors.py

For each golden in tests/goldens/data and each of ``kernels=off`` and ``auto``, runs updates 1 and 2 as the test
does and prints: the largest relative error of any loss, the largest gradient error relative to its tensor's
largest entry (and which tensor), the largest absolute parameter error after updates 1 and 2 (return normaliser
apart), the return normaliser's error relative to its size, and the largest difference between reverie's and the
official distributions at the replayed draws.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.join(_ROOT, "tests", "goldens")]

import numpy as np  # noqa: E402

from helpers.official_goldens import (DATA, build_agent, group, load, official_in_reverie,  # noqa: E402
                                      reverie_batch, run_update)
from test_official_update import LOSSES, OBS_LOSS, extra_draws  # noqa: E402


def errors(name: str, kernels: str) -> dict[str, float | str]:
    meta, arrays = load(name)
    agent = build_agent(meta, arrays, kernels=kernels)
    batch = reverie_batch(meta, arrays)
    state = dict(agent.named_parameters()) | dict(agent.named_buffers())
    out = {"loss": 0.0, "grad": 0.0, "grad_at": "", "param": 0.0, "retnorm": 0.0, "draw": 0.0}
    version = meta["version"]
    for update in (1, 2):
        metrics, grads, source = run_update(agent, batch, group(arrays, f"draw{update}"), extra_draws(meta))
        official = group(arrays, f"metric{update}")
        losses = {f"loss/{k}": OBS_LOSS[version].format(k) for k in meta["obs"]} | LOSSES[version]
        for ours, theirs in losses.items():
            want = float(official[theirs])
            out["loss"] = max(out["loss"], abs(metrics[ours] - want) / abs(want))
        for key, want in official_in_reverie(agent, group(arrays, f"grad{update}")).items():
            error = float((grads[key] - want).abs().max() / want.abs().max())
            if error > out["grad"]:
                out["grad"], out["grad_at"] = error, key
        params = official_in_reverie(agent, group(arrays, f"param{update}"))
        size = max(float(params["retnorm.low"].abs()), float(params["retnorm.high"].abs()))
        for key, want in params.items():
            error = float((state[key].detach() - want.to(state[key].dtype)).abs().max())
            if key.startswith("retnorm."):
                out["retnorm"] = max(out["retnorm"], error / max(size, 1e-12))
            else:
                out["param"] = max(out["param"], error)
        out["draw"] = max(out["draw"], max(source.errors))
    return out


def main() -> None:
    names = sorted(p.stem for p in DATA.glob("official*.npz") if not p.stem.endswith("_replay"))  # updates only
    print(f"| case | kernels | loss (rel) | gradient (rel to max) | parameter (abs) | return normaliser (rel) | "
          f"draws (abs prob) |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for kernels in ("off", "auto"):
            e = errors(name, kernels)
            print(f"| {name} | {kernels} | {e['loss']:.1e} | {e['grad']:.1e} (`{e['grad_at']}`) | {e['param']:.1e} | "
                  f"{e['retnorm']:.1e} | {e['draw']:.1e} |", flush=True)
    size = sum((DATA / f"{n}.npz").stat().st_size for n in names)
    print(f"\ngolden files: {len(names)}, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
