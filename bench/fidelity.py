"""Learning fidelity: the official DreamerV3 and reverie trained side by side from one table of settings
(docs/fidelity.md).

    .venv/bin/python bench/fidelity.py table --version 2023                      # the settings, both sides
    .venv/bin/python bench/fidelity.py install --version 2023 --source ~/.cache/reverie/dreamerv3-8fa35f8
    .venv/bin/python bench/fidelity.py run --side official --version 2023 --task cartpole_swingup --seed 0 \\
        --source ~/.cache/reverie/dreamerv3-8fa35f8 --out ~/fidelity --core 0
    .venv/bin/python bench/fidelity.py run --side reverie --version 2023 --task cartpole_swingup --seed 0 \\
        --out ~/fidelity --core 1
    .venv/bin/reverie compare ~/fidelity/reverie_2023_* --baseline ~/fidelity/official_2023_* --mode train

Versions: ``2023`` is danijar/dreamerv3 at 8fa35f8 against ``agent=dreamerv3``; ``2025`` is e3f0224 (the current
code) against ``agent=dreamerv3_2025``. Each version has one table (:data:`SETTINGS`): a row is one setting with the
official flags it sets and the reverie config keys it sets, both from one value. ``table`` prints it with the
values of a run; ``run`` builds both sides' command lines from it, so the two sides cannot drift apart. A value
that one side cannot take (a setting whose official code has no flag, e.g. the 2023 code always imagines from every
replayed state, so ``imag_last`` maps only at 0) is refused before anything runs. Values come from
:data:`PRESETS` (``--preset``, default ``cpu``: the CPU setting of docs/fidelity.md) and ``--set NAME=VALUE``.

``run --side official`` installs nothing: ``install`` first makes the official source folder (from a local mirror
or a clone, ``--from``) and a venv with the versions that run that commit on a CPU (both OUTSIDE the repository).
It runs the whole official training run on the CPU (``taskset -c --core``; DMC envs in-process, as reverie's
``env.vector_mode: sync``) through bench/fidelity_launcher.py, then converts its episode returns into a reverie-format
run folder ``<out>/official_<version>_<task>_s<seed>/`` (``config.yaml``, ``env_metadata.json``, ``scores.jsonl``
with env frames, ``mode: train``: the official DMC runs have training episodes only). ``--side reverie`` runs
``reverie train`` into ``<out>/reverie_<version>_<task>_s<seed>/``. Both sides resume when their folder already holds
a run (the official code from its checkpoint, ``save_every`` 900 s; reverie from its last checkpoint), and both add
the wall seconds of each attempt to ``<folder>/fidelity.json``; each side's output goes to ``<folder>/run.log``.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT  # this tree's reverie, not an installed one (see bench/profile_update.py)
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import argparse
import dataclasses
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from bench.peer_venv import outside_repo, run_steps
from bench.vs_jax import JAX_PACKAGES

COMMITS = {"2023": "8fa35f8", "2025": "e3f0224"}
AGENTS = {"2023": "dreamerv3", "2025": "dreamerv3_2025"}
SCRIPTS = {"2023": "dreamerv3/train.py", "2025": "dreamerv3/main.py"}
# Versions that run each commit on a CPU with Python 3.11 (the 2023 code: jax of mid 2023, TFP's JAX substrate for
# its distributions, no TensorFlow: bench/fidelity_launcher.py switches the TensorBoard output off; the 2025 code:
# bench/vs_jax.py's set).
PACKAGES = {
    "2023": ["jax==0.4.13", "jaxlib==0.4.13", "optax==0.1.5", "chex<0.1.82", "tensorflow-probability==0.21.0",
             "numpy<1.25", "scipy<1.12", "ruamel.yaml<0.18", "rich", "cloudpickle", "dm_control==1.0.14", "mujoco==2.3.7"],
    "2025": JAX_PACKAGES,
}
PROBES = {"2023": "import jax, optax, tensorflow_probability.substrates.jax, dm_control, ruamel.yaml",
          "2025": "import jax, elements, ninjax, dm_control"}
LAUNCHER = Path(__file__).resolve().with_name("fidelity_launcher.py")
CACHE = Path.home() / ".cache" / "reverie"


class MappingError(ValueError):
    """A setting one side cannot take, an unknown setting name or a bad value."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One row of the table: ``official`` flags and ``reverie`` config keys set from the same value.

    ``official_value`` / ``reverie_value`` turn the value into each side's (e.g. env frames into agent steps);
    ``only``: the one value both sides can share when a side has no flag or key for it (else None).
    """

    name: str
    doc: str
    official: tuple[str, ...]
    reverie: tuple[str, ...]
    official_value: Callable[[object, dict], object] = lambda v, s: v
    reverie_value: Callable[[object, dict], object] = lambda v, s: v
    only: object = None


def agent_steps(frames, values: dict) -> int:
    """Env frames -> agent steps (both codes count steps summed over their parallel envs)."""
    frames, repeat = int(frames), int(values["action_repeat"])
    if frames % repeat:
        raise MappingError(f"frames={frames} is not a multiple of action_repeat={repeat}")
    return frames // repeat


COMMON = [
    Setting("task", "DMC proprio task (dm_control domain_task)", ("--task",), ("env.task",),
            official_value=lambda v, s: f"dmc_{v}"),
    Setting("seed", "run seed", ("--seed",), ("seed",)),
    Setting("frames", "env frames of the whole run (agent steps x action_repeat)", ("--run.steps",), ("train.steps",),
            official_value=agent_steps, reverie_value=agent_steps),
    Setting("action_repeat", "physics steps per agent step", ("--env.dmc.repeat",), ("env.action_repeat",)),
    Setting("batch_size", "B, windows per update", ("--batch_size",), ("agent.batch_size",)),
    Setting("batch_length", "T, rows per window", ("--batch_length",), ("agent.batch_length",)),
    Setting("train_ratio", "replayed steps per env (agent) step", ("--run.train_ratio",), ("agent.train_ratio",)),
    Setting("deter", "RSSM deterministic state D", ("--rssm.deter",), ("size.deter",)),
    Setting("stoch", "S latent groups", ("--rssm.stoch",), ("size.stoch",)),
    Setting("classes", "K classes per group", ("--rssm.classes",), ("size.classes",)),
    Setting("horizon", "imagination horizon H", ("--imag_horizon",), ("agent.module.horizon",)),
]
SETTINGS: dict[str, list[Setting]] = {
    # danijar/dreamerv3 8fa35f8 (dreamerv3/configs.yaml line numbers) -> agent=dreamerv3
    "2023": COMMON + [
        Setting("envs", "parallel envs (configs.yaml:49 envs.amount)", ("--envs.amount",), ("env.num_envs",)),
        Setting("units", "RSSM hidden and the reward, continue, actor, critic MLP width (configs.yaml:67-79)",
                ("--rssm.units", "--reward_head.units", "--cont_head.units", "--actor.units", "--critic.units"),
                ("size.units",)),
        Setting("layers", "reward, continue, actor, critic MLP depth (configs.yaml:70-79)",
                ("--reward_head.layers", "--cont_head.layers", "--actor.layers", "--critic.layers"),
                ("size.layers",)),
        Setting("mlp_units", "vector encoder/decoder width (configs.yaml:68-69)",
                ("--encoder.mlp_units", "--decoder.mlp_units"), ("agent.module.mlp_units",)),
        Setting("mlp_layers", "vector encoder/decoder depth (configs.yaml:68-69)",
                ("--encoder.mlp_layers", "--decoder.mlp_layers"), ("agent.module.mlp_layers",)),
        Setting("model_lr", "world model Adam lr (configs.yaml:75)", ("--model_opt.lr",), ("agent.module.model_lr",)),
        Setting("actor_lr", "actor Adam lr (configs.yaml:80)", ("--actor_opt.lr",), ("agent.module.actor_lr",)),
        Setting("critic_lr", "critic Adam lr (configs.yaml:81)", ("--critic_opt.lr",), ("agent.module.critic_lr",)),
        Setting("prefill", "env steps of the random policy before training (configs.yaml:36 run.train_fill; the "
                "official loop fills max(batch_size x batch_length, train_fill) in chunks of 100 steps)",
                ("--run.train_fill",), ("train.prefill",)),
        Setting("precision", "compute dtype (configs.yaml:16 jax.precision)", ("--jax.precision",),
                ("agent.module.precision",)),
        Setting("imag_last", "imagine from the last K rows of each window (0: every row; the 2023 code has no such "
                "setting and always imagines from every replayed state, agent.py:82-84)", (), ("agent.module.imag_last",),
                only=0),
    ],
    # danijar/dreamerv3 e3f0224 (dreamerv3/configs.yaml) -> agent=dreamerv3_2025
    "2025": COMMON[:7] + [
        Setting("deter", "RSSM deterministic state D (configs.yaml:91)", ("--agent.dyn.rssm.deter",), ("size.deter",)),
        Setting("stoch", "S latent groups", ("--agent.dyn.rssm.stoch",), ("size.stoch",)),
        Setting("classes", "K classes per group", ("--agent.dyn.rssm.classes",), ("size.classes",)),
        Setting("hidden", "RSSM hidden width", ("--agent.dyn.rssm.hidden",), ("size.hidden",)),
        Setting("blocks", "GRU blocks", ("--agent.dyn.rssm.blocks",), ("size.blocks",)),
        Setting("horizon", "imagination horizon H (configs.yaml:104 imag_length)", ("--agent.imag_length",),
                ("agent.module.horizon",)),
        Setting("envs", "parallel envs (configs.yaml run.envs)", ("--run.envs",), ("env.num_envs",)),
        Setting("units", "encoder, decoder, heads, policy and value width (the size presets' .*\\.units)",
                ("--agent.enc.simple.units", "--agent.dec.simple.units", "--agent.rewhead.units",
                 "--agent.conhead.units", "--agent.policy.units", "--agent.value.units"), ("size.units",)),
        Setting("lr", "LaProp lr of every module (configs.yaml:89 opt.lr)", ("--agent.opt.lr",), ("agent.module.lr",)),
        Setting("precision", "compute dtype (jax.compute_dtype)", ("--jax.compute_dtype",),
                ("agent.module.precision",)),
        Setting("imag_last", "imagine from the last K rows (configs.yaml agent.imag_last)", ("--agent.imag_last",),
                ("agent.module.imag_last",)),
        Setting("replay_context", "context rows per window, started from stored latents (configs.yaml:15)",
                ("--replay_context",), ("agent.module.replay_context",)),
        Setting("online", "fresh windows trained on before uniform samples (configs.yaml:41 replay.online)",
                ("--replay.online",), ("agent.replay_online",)),
        Setting("prefill", "env steps of a random policy before training (the current code has none: its agent acts "
                "from the first step and trains once replay holds batch_size x batch_length steps, "
                "embodied/run/train.py:71-72)", (), ("train.prefill",), only=0),
    ],
}
FIXED_OFFICIAL = {
    # official flags that are not settings of the comparison: where and how the run goes, never what it learns
    "2023": ["--configs", "dmc_proprio", "--jax.platform", "cpu", "--jax.prealloc", "False", "--envs.parallel", "none",
             "--run.log_every", "120"],
    "2025": ["--configs", "dmc_proprio", "--jax.platform", "cpu", "--jax.prealloc", "False", "--logger.outputs",
             "jsonl", "--run.log_every", "120", "--run.report_every", "1e9"],
}
_RUN = ["env=dmc_proprio", "threads=1", "train.progress=false", "train.video=false", "train.eval_every=0",
        "train.checkpoint_every=5000", "replay.capacity=1000000"]
FIXED_REVERIE = {  # the base every row's key overrides; then how the run goes (one thread, final evaluation only)
    "2023": ["exp=dmc_cpu", *_RUN],
    "2025": ["exp=dmc_cpu", "size=size1m", *_RUN],  # size1m: the official dmc_proprio size, with hidden and blocks
}
PRESETS = {
    # The CPU setting of docs/fidelity.md: exp=dmc_cpu's sizes and learning rates, imagination from every replayed
    # state (the 2023 code has no other choice), 100k frames.
    "cpu": {
        "2023": {"frames": 100_000, "action_repeat": 2, "envs": 4, "batch_size": 16, "batch_length": 32,
                 "train_ratio": 32, "deter": 128, "units": 128, "layers": 1, "stoch": 16, "classes": 16,
                 "mlp_units": 128, "mlp_layers": 1, "horizon": 15, "model_lr": 3e-4, "actor_lr": 1e-4,
                 "critic_lr": 1e-4, "prefill": 1000, "precision": "float32", "imag_last": 0},
        "2025": {"frames": 100_000, "action_repeat": 2, "envs": 4, "batch_size": 16, "batch_length": 32,
                 "train_ratio": 32, "deter": 512, "hidden": 64, "units": 64, "stoch": 32, "classes": 4, "blocks": 8,
                 "horizon": 15, "lr": 4e-5, "precision": "float32", "imag_last": 0, "replay_context": 1,
                 "online": True, "prefill": 0},
    },
}


def parse_value(text: str):
    """``--set`` values: int, then float, then the string itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def resolve_values(version: str, preset: str, sets: list[str], task: str | None, seed: int | None,
                   complete: bool = True) -> dict:
    """The run's values: the preset's, then ``--set NAME=VALUE``, then task and seed (``complete=False``: the
    settings still without a value are left out instead of refused, for ``table``).

    Raises:
        MappingError: an unknown version, preset or setting name, a ``--set`` without ``=``, a value a side
            cannot take (see :func:`official_flags`), or a setting without a value.
    """
    if version not in SETTINGS:
        raise MappingError(f"unknown version {version!r}; choose one of {sorted(SETTINGS)}")
    if preset not in PRESETS:
        raise MappingError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    names = {s.name for s in SETTINGS[version]}
    values = dict(PRESETS[preset][version])
    for item in sets:
        if "=" not in item:
            raise MappingError(f"--set {item!r}: write NAME=VALUE, e.g. --set train_ratio=128")
        name, text = item.split("=", 1)
        if name not in names:
            raise MappingError(f"--set {name}: no such setting in the {version} table; the settings are "
                               f"{sorted(names)} (`bench/fidelity.py table --version {version}` lists them)")
        values[name] = parse_value(text)
    if task is not None:
        values["task"] = task
    if seed is not None:
        values["seed"] = int(seed)
    missing = sorted(names - set(values))
    if missing and complete:
        raise MappingError(f"settings without a value: {missing}; pass them with --task/--seed or --set NAME=VALUE")
    check_mappable(version, values)  # refuse what one side cannot take before anything runs
    return values


def check_mappable(version: str, values: dict) -> None:
    """Raises MappingError for a value of a setting that one side has no flag or key for, other than the one value
    both sides share."""
    for setting in SETTINGS[version]:
        if not setting.official and setting.name in values and values[setting.name] != setting.only:
            raise MappingError(f"{setting.name}={values[setting.name]!r} cannot be mapped onto the official {version} "
                               f"code: {setting.doc}; only {setting.name}={setting.only!r} is the same on both sides")


def official_flags(version: str, values: dict) -> list[str]:
    """The official script's flags for ``values`` (after :data:`FIXED_OFFICIAL`).

    Raises:
        MappingError: a value of a setting the official code has no flag for, other than the one it shares.
    """
    check_mappable(version, values)
    flags = list(FIXED_OFFICIAL[version])
    for setting in SETTINGS[version]:
        value = values[setting.name]
        for flag in setting.official:
            flags += [flag, str(setting.official_value(value, values))]
    return flags


def reverie_overrides(version: str, values: dict) -> list[str]:
    """``reverie train`` overrides for ``values``: the agent, :data:`FIXED_REVERIE`, then one per row key."""
    overrides = [f"agent={AGENTS[version]}", *FIXED_REVERIE[version]]
    for setting in SETTINGS[version]:
        for key in setting.reverie:
            overrides.append(f"{key}={setting.reverie_value(values[setting.name], values)}")
    return overrides


def print_table(version: str, values: dict) -> None:
    """The table with this run's values: setting, value, official flags, reverie keys."""
    print(f"official danijar/dreamerv3 {COMMITS[version]} vs reverie agent={AGENTS[version]}")
    print(f"{'setting':<14} {'value':<18} {'official flag(s)':<44} reverie key(s)")
    for s in SETTINGS[version]:
        value = values.get(s.name, "(per run)")
        official = " ".join(s.official) if s.official else f"(none: only {s.only!r} maps)"
        print(f"{s.name:<14} {str(value):<18} {official:<44} {' '.join(s.reverie)}")
    print(f"fixed, official: {' '.join(FIXED_OFFICIAL[version])}")
    print(f"fixed, reverie:  {' '.join(FIXED_REVERIE[version])}")


# ------------------------------------------------------------------------------------------------- official runs
def ensure_venv(version: str, venv: Path, python_exe: str) -> Path:
    """Install :data:`PACKAGES` of ``version`` into ``venv`` (outside the repository) unless it imports them."""
    venv = outside_repo(venv, "--venv")
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", PROBES[version]], capture_output=True).returncode == 0:
        print(f"[fidelity] {venv}: the {version} packages are installed")
        return python
    steps = [] if python.exists() else [[python_exe, "-m", "venv", str(venv)]]
    run_steps(steps + [[str(python), "-m", "pip", "install", "-q", *PACKAGES[version]]], "fidelity")
    return python


def ensure_source(version: str, source: Path, origin: str) -> Path:
    """The official source at the version's commit in ``source`` (outside the repository): exported from
    ``origin`` (a git repository, local mirror or URL) unless ``source`` already holds it."""
    source = outside_repo(source, "--source")
    marker = source / ".fidelity_commit"
    if marker.is_file() and marker.read_text().strip() == COMMITS[version]:
        return source
    if source.exists() and any(source.iterdir()):
        raise MappingError(f"--source {source} exists and is not an export of {COMMITS[version]}; pass an empty or "
                           f"new folder")
    source.mkdir(parents=True, exist_ok=True)
    clone = source.with_name(source.name + ".git")
    if not clone.exists():
        run_steps([["git", "clone", "--bare", "-q", origin, str(clone)]], "fidelity")
    # the code only: the official score files (scores/, large blobs that a partial mirror may lack) are not needed
    # to train; `reverie scores fetch` gets them
    tree = subprocess.run(["git", "--git-dir", str(clone), "ls-tree", "--name-only", COMMITS[version]],
                          capture_output=True, text=True)
    paths = [p for p in tree.stdout.split() if p != "scores"]
    archive = subprocess.run(["git", "--git-dir", str(clone), "archive", COMMITS[version], *paths], capture_output=True)
    if archive.returncode:
        raise RuntimeError(f"git archive {COMMITS[version]} failed: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    marker.write_text(COMMITS[version] + "\n")
    return source


def check_source(version: str, source: Path) -> Path:
    source = outside_repo(source, "--source")
    if not (source / SCRIPTS[version]).is_file():
        raise FileNotFoundError(f"--source {source} has no {SCRIPTS[version]}: run `bench/fidelity.py install "
                                f"--version {version} --source {source}` first")
    return source


def convert_official(logdir: Path, run_dir: Path, version: str, values: dict, flags: list[str],
                     allow_empty: bool = False) -> int:
    """The official run's episodes -> a reverie-format run folder; returns the number of episodes.

    Reads ``<logdir>/episodes.jsonl`` (every episode, written by bench/fidelity_launcher.py), else the official
    ``scores.jsonl`` (which keeps one episode per step when several envs end at once), with the lengths from
    ``metrics.jsonl`` (``episode/length`` at the same step, agent steps). ``step`` is env frames in both: the official
    logger multiplies its agent-step counter by the env's ``repeat``. Writes ``scores.jsonl`` (``step`` agent
    steps, ``frames``, ``return``, ``length``, ``mode: train``), ``config.yaml`` (seed, env task and action repeat,
    the official commit and flags) and ``env_metadata.json`` (suite ``dmc``, vector observations), so that
    ``reverie compare`` reads it as a ``dmc_proprio`` run. ``allow_empty``: no ``scores.jsonl`` yet gives an empty
    run (written before the official run starts, so that the folder is a run folder from the start and a search
    for runs never descends into the official ``logdir``).

    Raises:
        FileNotFoundError: no ``scores.jsonl`` in ``logdir`` (the official run wrote no episode yet).
        ValueError: a line that is not an official score record.
    """
    scores = logdir / "episodes.jsonl"  # written by bench/fidelity_launcher.py: every episode, lengths included
    if not scores.is_file():
        scores = logdir / "scores.jsonl"  # the official file: one episode per step when several end at once
    if not scores.is_file() and not allow_empty:
        raise FileNotFoundError(f"{scores} does not exist: the official run has not finished an episode yet")
    repeat = int(values["action_repeat"])
    lengths: dict[int, list[int]] = {}
    metrics = logdir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if "episode/length" in rec:
                lengths.setdefault(int(rec["step"]), []).append(int(rec["episode/length"]))
    rows = []
    for number, line in enumerate(scores.read_text().splitlines() if scores.is_file() else [], 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            frames, ret = int(rec["step"]), float(rec["episode/score"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{scores} line {number} is not an official score record "
                             f'{{"step": frames, "episode/score": return}}: {line[:80]!r}') from err
        pending = lengths.get(frames, [])
        length = rec["episode/length"] if "episode/length" in rec else (pending.pop(0) if pending else None)
        row = {"step": frames // repeat, "frames": frames, "return": ret, "length": length, "mode": "train"}
        if "time" in rec:  # unix seconds of the episode's end (bench/fidelity_launcher.py), for wall-time readings
            row["time"] = float(rec["time"])
        rows.append(row)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {"suite": "dmc", "task": values["task"], "action_repeat": repeat, "image": False, "proprio": True,
           "num_envs": values["envs"]}
    config = {"seed": values["seed"], "env": env, "official": {"commit": COMMITS[version], "flags": flags}}
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    metadata = {"suite": "dmc", "task": values["task"], "action_repeat": repeat, "observations": ["vector"],
                "official": f"danijar/dreamerv3 {COMMITS[version]}", "num_envs": values["envs"]}
    (run_dir / "env_metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    return len(rows)


def add_wall(run_dir: Path, seconds: float, info: dict, cpu_seconds: float | None = None) -> float:
    """Adds one attempt's wall seconds (and, where measured, the CPU seconds of the run's process: user + system,
    from ``getrusage(RUSAGE_CHILDREN)``) to ``<run_dir>/fidelity.json``; returns the total wall minutes.
    ``cpu_minutes`` sums the attempts that measured it: on a shared machine wall time moves with the load, the CPU
    time of a single-threaded run much less."""
    path = run_dir / "fidelity.json"
    data = json.loads(path.read_text()) if path.is_file() else {"attempts": []}
    data.update(info)
    attempt = {"wall_s": round(seconds, 1), "ended": time.strftime("%Y-%m-%d %H:%M:%S")}
    if cpu_seconds is not None:
        attempt["cpu_s"] = round(cpu_seconds, 1)
    data["attempts"].append(attempt)
    data["wall_minutes"] = round(sum(a["wall_s"] for a in data["attempts"]) / 60.0, 1)
    measured = [a["cpu_s"] for a in data["attempts"] if "cpu_s" in a]
    if measured:
        data["cpu_minutes"] = round(sum(measured) / 60.0, 1)
        data["cpu_measured_attempts"] = f"{len(measured)} of {len(data['attempts'])}"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data["wall_minutes"]


def children_cpu() -> float:
    """User + system CPU seconds of the waited-for child processes so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pinned(command: list[str], core: int | None) -> list[str]:
    return command if core is None else ["taskset", "-c", str(core), *command]


def run_official(args, values: dict) -> None:
    source = check_source(args.version, args.source)
    python = outside_repo(args.venv or CACHE / f"jax{args.version}-venv", "--venv") / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no venv at {python.parent.parent}: run `bench/fidelity.py install --version "
                                f"{args.version}` first")
    out = outside_repo(args.out, "--out")
    run_dir = out / f"official_{args.version}_{values['task']}_s{values['seed']}"
    logdir = run_dir / "logdir"
    flags = ["--logdir", str(logdir), *official_flags(args.version, values)]
    command = pinned([str(python), str(LAUNCHER), "--source", str(source), "--version", args.version, "--", *flags],
                     args.core)
    print("[fidelity] $ " + " ".join(command), flush=True)
    convert_official(logdir, run_dir, args.version, values, flags, allow_empty=True)  # a run folder from the start
    env = os.environ | {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "JAX_PLATFORMS": "cpu"}
    run_dir.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), children_cpu()
    with open(run_dir / "run.log", "a") as log:
        done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    minutes = add_wall(run_dir, time.perf_counter() - start, {"side": "official", "version": args.version,
                                                               "commit": COMMITS[args.version], "values": values},
                       children_cpu() - cpu)
    if done.returncode and not (logdir / "scores.jsonl").is_file():
        raise RuntimeError(f"the official run failed (exit code {done.returncode}) before its first episode; its "
                           f"output is in {run_dir / 'run.log'}")
    episodes = convert_official(logdir, run_dir, args.version, values, flags)
    print(f"[fidelity] official run exit {done.returncode}; {episodes} episodes in {run_dir}; {minutes} wall minutes "
          f"so far")


def run_reverie(args, values: dict) -> None:
    out = outside_repo(args.out, "--out")
    run_dir = out / f"reverie_{args.version}_{values['task']}_s{values['seed']}"
    overrides = reverie_overrides(args.version, values)
    reverie = [sys.executable, "-m", "reverie", "train"]
    resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("ckpt_*.pt"))
    command = reverie + (["--resume", str(run_dir)] if resume else [*overrides, f"run_dir={run_dir}"])
    command = pinned(command, args.core)
    print("[fidelity] $ " + " ".join(command), flush=True)
    env = os.environ | {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": _ROOT}
    run_dir.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), children_cpu()
    with open(run_dir / "run.log", "a") as log:
        done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=_ROOT)
    minutes = add_wall(run_dir, time.perf_counter() - start, {"side": "reverie", "version": args.version,
                                                               "overrides": overrides, "values": values},
                       children_cpu() - cpu)
    print(f"[fidelity] reverie run exit {done.returncode}; {run_dir}; {minutes} wall minutes so far")


# ------------------------------------------------------------------------------------------------------ report
WINDOW = (90_000, 110_000)  # the dmc_proprio score window of reverie compare (env frames, episodes ending inside)
OFFICIAL_LOG_EVERY = 120.0  # FIXED_OFFICIAL --run.log_every: seconds between the official metrics.jsonl lines


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def attempt_starts(fidelity: dict) -> list[tuple[float, float, float]]:
    """``(start, end, wall before)`` unix seconds of each attempt of ``fidelity.json`` (an attempt ends at its
    ``ended`` time, local, and lasted ``wall_s``)."""
    out, before = [], 0.0
    for attempt in fidelity.get("attempts", []):
        end = time.mktime(time.strptime(attempt["ended"], "%Y-%m-%d %H:%M:%S"))
        out.append((end - attempt["wall_s"], end, before))
        before += attempt["wall_s"]
    return out


def wall_curve(run_dir: Path) -> list[tuple[float, float]]:
    """``(frames, wall seconds)`` points of a run, increasing in frames, from which the wall time at which the run
    reached a frame count is interpolated.

    reverie: its ``metrics.jsonl`` rows (``frames``, ``wall_s``: the run's wall time, summed over resumes). Official:
    each episode's ``time`` (unix seconds, written by the launcher) placed in its attempt of ``fidelity.json``; a run
    without them (an older launcher): the ``step`` (frames) of its ``metrics.jsonl`` lines, one every
    ``--run.log_every`` seconds (:data:`OFFICIAL_LOG_EVERY`), an approximation to about one interval.
    """
    points = [(0.0, 0.0)]
    if (run_dir / "logdir").is_dir():  # official
        rows = [r for r in _jsonl(run_dir / "scores.jsonl") if "time" in r]
        attempts = attempt_starts(json.loads((run_dir / "fidelity.json").read_text())) \
            if (run_dir / "fidelity.json").is_file() else []
        if rows and attempts:
            for r in rows:
                start, _, before = next((a for a in attempts if a[0] - 1 <= r["time"] <= a[1] + 1), attempts[-1])
                points.append((float(r["frames"]), before + r["time"] - start))
        else:
            lines = [r for r in _jsonl(run_dir / "logdir" / "metrics.jsonl") if "step" in r]
            points += [(float(r["step"]), OFFICIAL_LOG_EVERY * (k + 1)) for k, r in enumerate(lines)]
    else:
        points += [(float(r["frames"]), float(r["wall_s"])) for r in _jsonl(run_dir / "metrics.jsonl")
                   if "frames" in r and "wall_s" in r]
    points.sort()
    return points


def frames_at(points: list[tuple[float, float]], wall_s: float) -> float:
    """The frames a run had reached after ``wall_s`` seconds (linear between the points of :func:`wall_curve`;
    its last frames beyond its end)."""
    for (f0, w0), (f1, w1) in zip(points, points[1:]):
        if w0 <= wall_s <= w1:
            return f0 + (f1 - f0) * (wall_s - w0) / max(w1 - w0, 1e-9)
    return points[-1][0]


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% confidence interval from the t distribution over ``values`` (seeds); a single value
    gives an interval of zero width."""
    import numpy as np
    from scipy import stats

    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), float(x.mean()), float(x.mean())
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def window_mean(rows: list[dict], lo: float, hi: float) -> float | None:
    """Mean return of the training episodes ending in ``[lo, hi]`` env frames (None: none there)."""
    inside = [r["return"] for r in rows if r.get("mode", "train") == "train" and lo <= r["frames"] <= hi]
    return sum(inside) / len(inside) if inside else None


def report(out: Path, version: str) -> str:
    """The fidelity table of every run folder of ``version`` under ``out``: per run its window mean (training
    episodes ending in :data:`WINDOW`), last frames, wall and CPU minutes; per task and side the mean over seeds
    with a 95% t interval; and each official run's return at the median wall time of reverie's runs of that task
    (the mean over the training episodes ending in the 10k frames before the frame count it had reached then).
    Returns markdown."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for run_dir in sorted(out.glob(f"*_{version}_*_s*")):
        side, _, rest = run_dir.name.partition(f"_{version}_")
        task, _, seed = rest.rpartition("_s")
        rows = _jsonl(run_dir / "scores.jsonl")
        fid = json.loads((run_dir / "fidelity.json").read_text()) if (run_dir / "fidelity.json").is_file() else {}
        runs.setdefault((task, side), []).append({
            "dir": run_dir, "seed": int(seed), "rows": rows, "window": window_mean(rows, *WINDOW),
            "frames": max((r["frames"] for r in rows), default=0), "wall": fid.get("wall_minutes"),
            "cpu": fid.get("cpu_minutes"), "curve": wall_curve(run_dir)})
    lines = ["| task | side | seed | window mean (90k-110k frames) | last frames | wall min | CPU min |",
             "|---|---|---|---|---|---|---|"]
    for (task, side), items in sorted(runs.items()):
        for r in items:
            window = "-" if r["window"] is None else f"{r['window']:.1f}"
            lines.append(f"| {task} | {side} | {r['seed']} | {window} | {r['frames']:,} | {r['wall'] or '-'} | "
                         f"{r['cpu'] or '-'} |")
    lines += ["", "| task | side | seeds | window mean [95% CI] | median wall min |", "|---|---|---|---|---|"]
    for (task, side), items in sorted(runs.items()):
        done = [r["window"] for r in items if r["window"] is not None]
        walls = sorted(r["wall"] for r in items if r["wall"])
        wall = f"{walls[len(walls) // 2]:.1f}" if walls else "-"
        if done:
            m, lo, hi = mean_ci(done)
            lines.append(f"| {task} | {side} | {len(done)} | {m:.1f} [{lo:.1f}, {hi:.1f}] | {wall} |")
    equal = []
    for (task, side), items in sorted(runs.items()):
        ours = [r["wall"] for r in runs.get((task, "reverie"), []) if r["wall"] and r["window"] is not None]
        if side != "official" or not ours:
            continue
        at = sorted(ours)[len(ours) // 2] * 60.0
        for r in items:
            reached = frames_at(r["curve"], at)
            value = window_mean(r["rows"], reached - 10_000, reached)
            if value is not None:
                equal.append(f"| {task} | {r['seed']} | {at / 60:.1f} | {reached:,.0f} | {value:.1f} |")
    if equal:
        lines += ["", "| task | official seed | at reverie's median wall min | official frames then | "
                      "official return then (last 10k frames) |", "|---|---|---|---|---|", *equal]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("report", help="the table of the run folders under --out (markdown)")
    p.add_argument("--version", required=True, choices=sorted(SETTINGS))
    p.add_argument("--out", type=Path, required=True)
    for name in ("table", "install", "run"):
        p = sub.add_parser(name)
        p.add_argument("--version", required=True, choices=sorted(SETTINGS))
        p.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
        p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="change one setting")
        p.add_argument("--task", default=None)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--source", type=Path, default=None, help="official source folder (outside the repository)")
        p.add_argument("--venv", type=Path, default=None, help="official code's venv (default ~/.cache/reverie/jax<V>-venv)")
        if name == "install":
            p.add_argument("--from", dest="origin", default="https://github.com/danijar/dreamerv3",
                           help="git repository to export the commit from (URL or local mirror)")
            p.add_argument("--python", default="python3.11")
        if name == "run":
            p.add_argument("--side", required=True, choices=["official", "reverie"])
            p.add_argument("--out", type=Path, required=True, help="folder of the run folders (outside the repository)")
            p.add_argument("--core", type=int, default=None, help="CPU core to pin the run to (taskset -c)")
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report(args.out, args.version), end="")
        return 0
    try:
        values = resolve_values(args.version, args.preset, args.set, args.task, args.seed,
                                complete=args.command == "run")
    except MappingError as err:
        parser.exit(2, f"fidelity: config error: {err}\n")
    if args.command == "table":
        print_table(args.version, values)
        return 0
    source = args.source or CACHE / f"dreamerv3-{COMMITS[args.version]}"
    if args.command == "install":
        ensure_source(args.version, source, args.origin)
        ensure_venv(args.version, args.venv or CACHE / f"jax{args.version}-venv", args.python)
        print(f"[fidelity] official {args.version} code in {source}")
        return 0
    args.source = source
    if shutil.which("taskset") is None and args.core is not None:
        parser.exit(2, "fidelity: --core needs taskset (util-linux)\n")
    (run_official if args.side == "official" else run_reverie)(args, values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
