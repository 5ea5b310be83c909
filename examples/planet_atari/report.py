"""Held-out open-loop PSNR against the prediction step k, per configuration, for the PlaNet-on-Atari study's sweeps
(docs/planet.md, "PlaNet on Atari"): the curves the sweeps' own summaries (one number per trial) do not show.

    python examples/planet_atari/report.py sweeps/planet_atari_divergence sweeps/planet_atari_knobs \\
        --out docs/results/planet_atari_psnr_k.png

For every finished trial (``summary.json`` present) of every sweep folder given, reads the last ``metrics.jsonl`` row
holding ``heldout/quality/<key>_psnr_k<k>`` and averages it over the configuration's seeds; writes one panel per
sweep (a line per configuration, labelled by its swept values) and prints a table of the mean PSNR at each k.
``--baseline`` adds what a model must beat on the same held-out windows: every open-loop frame predicted as the last
context frame, and as the mean of the training frames (:func:`baselines`); run from the folder the sweeps ran in,
whose relative data paths the trials' configs hold.

Two configurations of two sweeps (e.g. action repeat 8 against the repeat-4 baseline, which are sweeps on different
datasets) are compared step by step with ``--pair``; ``--time-ratio 2`` compares the first one's step k with the
second one's step 2k (equal game time when the first repeats each action twice as long)::

    python examples/planet_atari/report.py --pair sweeps/planet_atari_repeat8 "divergence_scale=1.0" \
        sweeps/planet_atari_knobs "free_nats=3.0, overshooting=0, global_divergence_scale=0.0, image_bits=5" \
        --time-ratio 2
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

STEP = re.compile(r"^heldout/quality/(\w+)_psnr_k(\d+)$")
BASELINES = ("copy the last context frame", "the training frames' mean")  # --baseline's rows (dashed)


def trial_curves(sweep: Path, key: str = "image") -> dict[str, dict[int, list[float]]]:
    """``{label: {k: [psnr per seed]}}`` of a sweep folder's finished trials; the label is the swept values."""
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trial in sorted((sweep / "trials").glob("*")):
        if not (trial / "summary.json").is_file() or not (trial / "sweep_trial.json").is_file():
            continue
        params = json.loads((trial / "sweep_trial.json").read_text())["params"]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(params.items()))
        last: dict[int, float] = {}
        for line in (trial / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            found = {int(m.group(2)): v for name, v in row.items() if (m := STEP.match(name)) and m.group(1) == key}
            last = found or last
        for k, value in last.items():
            curves[label][k].append(float(value))
    return curves


def baselines(trial: Path, key: str = "image") -> dict[str, dict[str, float]]:
    """What a model must beat, on the held-out windows a trial is scored on (its ``pretrain.heldout``,
    ``pretrain.heldout_sequences`` windows of ``agent.batch_length`` rows drawn with seed 0, the 5 context rows;
    ``reverie.data.heldout.run_heldout_windows``), keyed by :data:`BASELINES`' labels: every open-loop frame predicted
    as the last context frame (:func:`copy_last_scores`: ``psnr_k<k>``, their mean ``psnr`` as the trials'
    ``heldout/quality/<key>_psnr``, and the reward error of predicting 0), and as the mean of every frame of the
    trial's training dataset (``pretrain.data``; :func:`constant_frame_scores`). Paths in the trial's config are
    relative to the folder the sweep ran in."""
    import numpy as np
    from omegaconf import OmegaConf

    from reverie.data.heldout import run_heldout_windows
    from reverie.data.load import load_dataset

    cfg = OmegaConf.load(trial / "config.yaml")
    batch, context = run_heldout_windows(cfg)
    frames = np.asarray(batch[key])
    dataset = load_dataset(cfg.pretrain.data, cfg.env)
    mean = sum(e.rows[key].astype(np.float64).sum(axis=0) for e in dataset.episodes) / dataset.steps
    copy_last, mean_frame = BASELINES
    return {copy_last: copy_last_scores(frames, np.asarray(batch["reward"]), context),
            mean_frame: constant_frame_scores(frames, mean, context)}


def copy_last_scores(frames, reward, context: int) -> dict[str, float]:
    """The copy-last-frame baseline of :func:`baselines` on arrays: ``frames (T, B, C, H, W)`` uint8, ``reward
    (T, B)``, ``context`` = C: ``psnr_k<k>`` (mean over B of the PSNR of frame ``C - 1 + k`` against frame ``C - 1``),
    ``psnr`` (their mean) and ``reward_error`` (mean ``|reward|`` of rows ``C ..``)."""
    import numpy as np

    out = constant_frame_scores(frames, frames[context - 1], context)  # each window's last context frame
    out["reward_error"] = float(np.abs(reward[context:]).mean())
    return out


def constant_frame_scores(frames, frame, context: int) -> dict[str, float]:
    """PSNR of predicting every open-loop frame as ``frame`` (pixel values; ``(C, H, W)``, or ``(B, C, H, W)``: one
    per window), against ``frames (T, B, C, H, W)`` uint8 from row ``context`` on: ``psnr_k<k>`` (mean over B) and
    ``psnr`` (their mean)."""
    import numpy as np

    from reverie.viz.quality import psnr

    steps = psnr(frames[context:], np.broadcast_to(frame, frames[context:].shape))  # (T - C, B)
    out = {f"psnr_k{k}": float(steps[k - 1].mean()) for k in range(1, len(steps) + 1)}
    out["psnr"] = float(steps.mean())
    return out


def paired_steps(first: dict[int, list[float]], second: dict[int, list[float]], time_ratio: int = 1,
                 reps: int = 2000) -> list[dict[str, float]]:
    """Per step k of ``first`` that ``second`` has at ``time_ratio * k``: both means over seeds and ``diff`` = IQM
    first - IQM second with its 95% bootstrap CI (``lo, hi``) and permutation / Welch p-values
    (``reverie.scores.aggregate.compare_sets``, each seed one run)."""
    import numpy as np

    from reverie.scores.aggregate import compare_sets

    rows = []
    for k in sorted(first):
        if time_ratio * k not in second:
            continue
        a, b = (np.asarray(v, np.float64)[:, None] for v in (first[k], second[time_ratio * k]))
        result = compare_sets(a, b, reps=reps)
        rows.append({"k": k, "k_second": time_ratio * k, "mean_first": float(a.mean()), "mean_second": float(b.mean()),
                     **{name: float(result[name]) for name in ("diff", "lo", "hi", "p_permutation", "p_welch")}})
    return rows


def paired_mean(first: dict[int, list[float]], second: dict[int, list[float]], time_ratio: int = 1,
                reps: int = 2000) -> dict[str, float]:
    """The two configurations over all the steps :func:`paired_steps` matches: each seed's mean PSNR over those
    steps (the steps' lists are in seed order), compared as there (``mean_first``, ``mean_second``, ``diff``, ``lo``,
    ``hi``, ``p_permutation``, ``p_welch``; ``steps``: how many)."""
    import numpy as np

    from reverie.scores.aggregate import compare_sets

    ks = [k for k in sorted(first) if time_ratio * k in second]
    if not ks:
        raise ValueError("paired_mean: the two configurations share no step")
    a = np.mean([first[k] for k in ks], axis=0)[:, None]  # (seeds, 1)
    b = np.mean([second[time_ratio * k] for k in ks], axis=0)[:, None]
    result = compare_sets(a, b, reps=reps)
    return {"steps": len(ks), "mean_first": float(a.mean()), "mean_second": float(b.mean()),
            **{name: float(result[name]) for name in ("diff", "lo", "hi", "p_permutation", "p_welch")}}


def print_pair(args) -> None:
    """``--pair``: the step-by-step comparison table of two configurations."""
    (dir_a, label_a), (dir_b, label_b) = args.pair[:2], args.pair[2:]
    first, second = trial_curves(Path(dir_a), args.key)[label_a], trial_curves(Path(dir_b), args.key)[label_b]
    if not first or not second:
        raise SystemExit(f"no finished trial of {label_a!r} in {dir_a} or of {label_b!r} in {dir_b}")
    print(f"| k | k of the second | first: {label_a} | second: {label_b} | first - second (IQM) [95% CI] | "
          f"p perm / Welch |\n|---|---|---|---|---|---|")
    for r in paired_steps(first, second, args.time_ratio):
        print(f"| {r['k']} | {r['k_second']} | {r['mean_first']:.2f} | {r['mean_second']:.2f} | {r['diff']:.2f} "
              f"[{r['lo']:.2f}, {r['hi']:.2f}] | {r['p_permutation']:.2g} / {r['p_welch']:.2g} |")
    m = paired_mean(first, second, args.time_ratio)
    print(f"| mean over the {m['steps']} steps | | {m['mean_first']:.2f} | {m['mean_second']:.2f} | {m['diff']:.3f} "
          f"[{m['lo']:.3f}, {m['hi']:.3f}] | {m['p_permutation']:.2g} / {m['p_welch']:.2g} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="*", type=Path)
    parser.add_argument("--pair", nargs=4, metavar=("SWEEP_A", "LABEL_A", "SWEEP_B", "LABEL_B"),
                        help="compare two configurations step by step instead of drawing the curves")
    parser.add_argument("--time-ratio", type=int, default=1, help="--pair: A's step k against B's step ratio * k")
    parser.add_argument("--baseline", action="store_true",
                        help="also print (and draw) the copy-the-last-context-frame baseline of each sweep's data")
    parser.add_argument("--key", default="image", help="the image observation key (default image)")
    parser.add_argument("--out", type=Path, default=Path("planet_atari_psnr_k.png"))
    args = parser.parse_args()
    if args.pair:
        return print_pair(args)
    if not args.sweeps:
        parser.error("give the sweep folders to draw, or --pair")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.sweeps), figsize=(6 * len(args.sweeps), 4), squeeze=False)
    for ax, sweep in zip(axes[0], args.sweeps):
        curves = trial_curves(sweep, args.key)
        print(f"## {sweep.name}\n\n| configuration | seeds | PSNR (dB) at k = 1 / 5 / 10 / last | mean over k |\n"
              f"|---|---|---|---|")
        rows = {label: {k: sum(v) / len(v) for k, v in per_k.items()} for label, per_k in sorted(curves.items())}
        if args.baseline and curves:
            trial = next(t for t in sorted((sweep / "trials").glob("*")) if (t / "summary.json").is_file())
            for label, scores in baselines(trial, args.key).items():
                rows[label] = {int(name[6:]): v for name, v in scores.items() if name.startswith("psnr_k")}
        for label, by_k in rows.items():
            ks = sorted(by_k)
            means = [by_k[k] for k in ks]
            ax.plot(ks, means, label=label, ls="--" if label in BASELINES else "-")
            picks = [by_k[k] for k in (1, 5, 10) if k in by_k] + [means[-1]]
            seeds = len(curves[label][ks[0]]) if label in curves else "-"
            print(f"| {label} | {seeds} | {' / '.join(f'{m:.2f}' for m in picks)} | {sum(means) / len(means):.2f} |")
        print()
        ax.set(title=sweep.name, xlabel="open-loop step k (after the context frames)", ylabel="held-out PSNR (dB)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
