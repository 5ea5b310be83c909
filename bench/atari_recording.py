"""A recording of the official DreamerV3 Atari env (issue 42 item 3), for tests/envs/test_atari_official_recording.py,
which replays it with reverie's Atari env (numpy and reverie only, no official code at test time).

    ~/.cache/reverie/jax2025-venv/bin/pip install ale-py==0.11.2 gymnasium==1.4.0   # see "ale-py" below
    ~/.cache/reverie/jax2025-venv/bin/python bench/atari_recording.py --source ~/.cache/reverie/dreamerv3-e3f0224 \\
        --out tests/envs/data

Runs INSIDE the official venv (numpy, elements, ruamel.yaml and the official source; no torch, no reverie import).
Each case builds the env as the official ``dreamerv3/main.py`` does (``make_env``: ``embodied.envs.atari:Atari``
with ``configs.yaml``'s ``atari100k`` settings, resolved by the official ``elements.Config``, then ``wrap_env``),
with the case's overrides of the Atari constructor (``lives``, ``length``) and ``seed`` :data:`SEED`, and steps it
as the official driver does (``reset`` True at step 0 and after every ``is_last``; the action is ignored on a reset
step) with the actions ``np.random.default_rng(SEED).integers(num_actions, size=steps)``.

Cases (:data:`CASES`; every one uses the atari100k settings: 64x64 RGB, repeat 4, max over the last 2 frames,
pillow bilinear resize, sticky off, minimal actions, up to 30 reset no-ops, unclipped rewards):

- ``pong``: atari100k verbatim (lives ``unused``, length 108,000 frames).
- ``pong_length``: ``length=240``: the official episode time limit, in emulator frames after the reset no-ops
  (``main.py`` applies no ``TimeLimit`` wrapper to Atari; the env's ``length`` is the limit): 60 agent steps.
- ``pong_sticky_off``: as ``pong_length``, with the ROM loaded once more after the constructor, so that
  ``sticky: False`` takes effect (see below).
- ``breakout_unused``, ``breakout_discount``, ``breakout_reset``: Breakout (5 lives) with each ``lives`` option.

Sticky actions: the official constructor calls ``ale.setFloat('repeat_action_probability', 0.25 if sticky else 0.0)``
*after* ``ale.loadROM``, and ALE reads its settings when it loads a ROM: the setting never takes effect and every
official Atari env, atari100k's ``sticky: False`` included, runs with ALE's default sticky actions, p = 0.25, drawn
from ALE's generator seeded with ``random_seed`` (the wrapper's first draw, ``default_rng(seed).integers(0, 2**31)``,
stored in ``meta``). Every case but ``pong_sticky_off`` records that behaviour as it is.

Without editing the official source the script reads, per step: the ``is_terminal`` argument ``Atari.step`` passes
to ``Atari._obs`` (``terminal_arg``: ``_obs`` itself emits ``is_terminal=is_last``, whatever it is given), the
number of emulator frames the step played (``Atari.duration`` before and after; the reset no-ops are not
counted there), the lives, and at every reset the number of no-ops, peeked from a copy of the wrapper's generator
before the step (``Atari._reset`` draws ``rng.integers(noops + 1)``) and checked against ALE's episode frame
number after it.

ale-py: the official code pins ale_py 0.9.0 (requirements.txt) and calls ``ale.setInt(b'random_seed', ...)``,
which ale-py 0.12 refuses (str keys only). Recorded with 0.11.2, the newest ale-py that runs the official code
unchanged (it imports gymnasium without declaring it: install gymnasium too); reverie uses 0.12.1.

The file ``<out>/atari_official_<case>.npz`` (``np.savez_compressed``) holds, for ``T`` steps:

- ``image`` uint8 ``(T, 64, 64, 3)``: the official observation of every step (HWC, as the official env gives it);
- ``action`` int64 ``(T,)`` (index into the minimal action set; ignored where ``reset``), ``reset`` bool ``(T,)``;
- ``reward`` float32, ``is_first``, ``is_last``, ``is_terminal`` (emitted), ``terminal_arg`` bool ``(T,)``;
- ``frames`` int64 ``(T,)``: emulator frames played by the step (0 on reset steps), ``lives`` int64 ``(T,)`` after
  the step, ``noops`` int64 ``(T,)``: the reset no-ops on reset steps, -1 elsewhere;
- ``meta``: a JSON string (commit, case, settings, seed, steps, versions, command).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

COMMIT = "e3f0224"
SEED = 0
CASES = {
    "pong": {"task": "atari100k_pong", "steps": 120, "overrides": {}},
    "pong_length": {"task": "atari100k_pong", "steps": 250, "overrides": {"length": 240}},
    "pong_sticky_off": {"task": "atari100k_pong", "steps": 150, "overrides": {"length": 240}, "reload_rom": True},
    "breakout_unused": {"task": "atari100k_breakout", "steps": 300, "overrides": {"lives": "unused"}},
    "breakout_discount": {"task": "atari100k_breakout", "steps": 300, "overrides": {"lives": "discount"}},
    "breakout_reset": {"task": "atari100k_breakout", "steps": 300, "overrides": {"lives": "reset"}},
}


def official_config(source: Path, task: str):
    """The official ``defaults`` config updated with ``atari100k`` and ``task``, as ``main.py`` resolves it."""
    import elements
    import ruamel.yaml as yaml

    configs = yaml.YAML(typ="safe").load((source / "dreamerv3" / "configs.yaml").read_text())
    return elements.Config(configs["defaults"]).update(configs["atari100k"]).update(task=task)


def record(source: Path, case: dict) -> tuple[dict[str, np.ndarray], dict]:
    """Step the official env of ``case``; returns the arrays of the file and the resolved Atari settings."""
    from dreamerv3 import main

    config = official_config(source, case["task"])
    env = main.make_env(config, 0, seed=SEED, **case["overrides"])  # CheckSpaces(UnifyDtypes(Atari))
    atari = env.env.env
    if case.get("reload_rom"):  # ALE reads repeat_action_probability (set after the constructor's load) now
        import ale_py.roms as roms

        atari.ale.loadROM(roms.get_rom_path(case["task"].split("_", 1)[1]))
    settings = {**dict(config.env.atari100k), **case["overrides"], "length": atari.length, "seed": SEED,
                "ale_random_seed": atari.ale.getInt("random_seed"),
                "effective_sticky": 0.0 if case.get("reload_rom") else 0.25}
    steps = case["steps"]
    actions = np.random.default_rng(SEED).integers(len(atari.actionset), size=steps)
    args = []
    observe = atari._obs
    atari._obs = lambda reward, **kw: (args.append(kw), observe(reward, **kw))[1]  # reads the arguments only
    out = {key: [] for key in ("image", "reward", "is_first", "is_last", "is_terminal", "terminal_arg", "reset",
                               "frames", "lives", "noops")}
    reset = True
    for t in range(steps):
        will_reset = reset or atari.done
        peeked = int(copy.deepcopy(atari.rng).integers(atari.noops + 1)) if will_reset else -1
        before = atari.duration or 0
        obs = env.step({"action": np.int32(actions[t]), "reset": np.bool_(reset)})
        if will_reset:
            assert atari.ale.getEpisodeFrameNumber() == peeked, (atari.ale.getEpisodeFrameNumber(), peeked)
        out["image"].append(obs["image"])
        for key in ("reward", "is_first", "is_last", "is_terminal"):
            out[key].append(obs[key])
        out["terminal_arg"].append(bool(args[-1].get("is_terminal", False)))
        out["reset"].append(reset)
        out["frames"].append(0 if will_reset else atari.duration - before)
        out["lives"].append(atari.ale.lives())
        out["noops"].append(peeked)
        reset = bool(obs["is_last"])
    arrays = {"action": actions.astype(np.int64), "image": np.stack(out.pop("image")).astype(np.uint8),
              "reward": np.asarray(out.pop("reward"), np.float32)}
    for key in ("is_first", "is_last", "is_terminal", "terminal_arg", "reset"):
        arrays[key] = np.asarray(out.pop(key), bool)
    arrays.update({key: np.asarray(value, np.int64) for key, value in out.items()})
    return arrays, settings


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="the official source (dreamerv3 at e3f0224)")
    parser.add_argument("--out", type=Path, default=Path("tests/envs/data"))
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="default: every case")
    args = parser.parse_args()
    source = args.source.expanduser().resolve()
    marker = source / ".fidelity_commit"
    commit = marker.read_text().strip() if marker.exists() else "?"
    if commit != COMMIT:
        raise SystemExit(f"--source {source} holds commit {commit!r}, not {COMMIT}")
    sys.path[:0] = [str(source), str(source / "dreamerv3")]
    args.out.mkdir(parents=True, exist_ok=True)
    versions = {name: metadata.version(name) for name in ("ale-py", "pillow", "numpy", "elements")}
    for name in args.case or sorted(CASES):
        case = CASES[name]
        arrays, settings = record(source, case)
        meta = {"official_commit": commit, "case": name, "task": case["task"], "settings": settings, "seed": SEED,
                "reload_rom": bool(case.get("reload_rom")),
                "steps": case["steps"], "actions": f"np.random.default_rng({SEED}).integers(num_actions, size=steps)",
                "versions": versions,
                "command": f"bench/atari_recording.py --source <official source> --out {args.out} (case {name})",
                "image_sha1": hashlib.sha1(arrays["image"].tobytes()).hexdigest()}
        path = args.out / f"atari_official_{name}.npz"
        np.savez_compressed(path, meta=np.asarray(json.dumps(meta)), **arrays)
        ends = np.flatnonzero(arrays["is_last"]).tolist()
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB, {case['steps']} steps, is_last at {ends}, "
              f"noops {arrays['noops'][arrays['noops'] >= 0].tolist()}, reward sum {arrays['reward'].sum():g}, "
              f"early ends {np.flatnonzero((arrays['frames'] > 0) & (arrays['frames'] < 4)).tolist()}")


if __name__ == "__main__":
    main_()
