"""Config composition below the command line: loading and explaining Hydra configs, the checks that run before a
run directory exists, and creating it. ``reverie train`` (:mod:`reverie.cli`), ``reverie pretrain`` / ``record``
(:mod:`reverie.data.cli`) and ``reverie sweep`` (:mod:`reverie.sweep`) build on these; nothing here imports a command.

Examples::

    cfg = load_config(["env=pendulum", "size=s"])      # ConfigError names a bad key and the fix
    agent, obs_shapes, spec = check_setup(cfg)         # bad env id / space / agent value: ConfigError, nothing written
    run_dir = make_run_dir(cfg)                        # runs/<date>_<time>_<exp>_<agent>_<env>/config.yaml
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


CONFIG_DIR = Path(__file__).parent  # reverie/configs: config.yaml and one folder per group


class ConfigError(ValueError):
    """A config that cannot be composed or validated; the message names the key and the fix."""


def load_config(overrides: list[str]) -> DictConfig:
    """Compose ``reverie/configs/config.yaml`` with Hydra ``overrides`` and resolve it.

    Raises:
        ConfigError: unknown key, unknown group option, missing mandatory value (e.g. ``env=gym`` without
            ``env.id``), or a value that fails to resolve.
    """
    from reverie.configs.added_keys import unread_added_key

    try:
        with initialize_config_module("reverie.configs", version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
            unread = unread_added_key(list(overrides), lambda base: compose("config", overrides=base))
        if unread:  # `+key=...` / `++key=...` adds a key nothing reads: refused like a misspelt one
            raise ConfigError(_unknown_key(unread[1], overrides) + f" `{unread[0]}` would add it, but nothing reads "
                              f"it: `+`/`++` add keys only where they are read (env.kwargs, a loss scale, an "
                              f"argument of a block with _target_); drop it or fix the name")
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_explain(err, overrides)) from err
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"config error: mandatory value(s) missing: {', '.join(missing)}; set them on the command "
                          f"line, e.g. `reverie train env=gym env.id=Acrobot-v1`")
    return cfg


def _explain(err: Exception, overrides: list[str]) -> str:
    """A short message for a Hydra/OmegaConf composition error: which key or option, and what exists."""
    text = str(err).strip().split("\nConfig search path:")[0]
    missing_option = re.search(r"Could not find '([\w]+)/([^']+)'", text)
    if missing_option:
        return _unknown_option(*missing_option.groups())
    match = re.search(r"Could not override '([^']+)'", text)
    return _unknown_key(match.group(1), overrides) if match else f"config error: {text}"


def _unknown_option(group: str, option: str) -> str:
    """``config error: env=Acrobot-v1: the group 'env' has no option 'Acrobot-v1'`` with the close names, the
    options, and for the env group a Gymnasium-style id the ``env=gym env.id=...`` form."""
    options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
    text = f"config error: {group}={option}: the group '{group}' has no option '{option}'."
    if group == "env" and re.search(r"-v\d+$|/", option):
        text += f" A Gymnasium id goes in `env=gym env.id={option}`."
    close = difflib.get_close_matches(option.lower(), options, n=3, cutoff=0.6)
    if close:
        text += f" Did you mean {' or '.join(f'{group}={c}' for c in close)}?"
    return text + f" Options: {', '.join(options)}."


def _unknown_key(key: str, overrides: list[str]) -> str:
    """``config error: unknown key 'a.b': 'a' has no key 'b'. Did you mean ...? Supported keys there: ...``."""
    try:
        with initialize_config_module("reverie.configs", version_base="1.3"):
            base = compose("config", overrides=[o for o in overrides if not o.lstrip("+~").startswith(key + "=")])
    except Exception:  # noqa: BLE001 - the hint is best effort; the key name is the message
        base = None
    parts = key.split(".")
    depth = len(parts) - 1  # the deepest existing mapping on the key's path
    while base is not None and depth > 0 and not isinstance(
            OmegaConf.select(base, ".".join(parts[:depth])), DictConfig):
        depth -= 1
    parent, missing = ".".join(parts[:depth]), parts[depth]
    node = (OmegaConf.select(base, parent) if parent else base) if base is not None else None
    where = f"'{parent}'" if parent else "the root config"
    if isinstance(node, DictConfig) and len(node) > 0:
        known = f"Supported keys there: {', '.join(sorted(node.keys()))}."
        nested = _nested_match(node, missing) or next(iter(difflib.get_close_matches(missing, list(node.keys()), n=1,
                                                                                     cutoff=0.8)), None)
        if nested:
            known = f"Did you mean '{parent + '.' if parent else ''}{nested}'? " + known
    elif isinstance(node, DictConfig):
        known = (f"{where} is a free-form mapping (e.g. keyword arguments): add the key with "
                 f"`+{key}=...`.")
    else:
        known = "`reverie train --cfg` prints the whole config."
    return f"config error: unknown key '{key}': {where} has no key '{missing}'. {known}"


def _nested_match(node: DictConfig, name: str) -> str | None:
    """The path, relative to ``node``, of the closest key named like ``name`` one level below it (for keys that
    moved into a sub-block, e.g. ``agent.module.free_nats`` -> ``agent.module.dynamics.free_nats``), or None."""
    import difflib

    paths = {f"{k}.{sub}": sub for k, v in node.items() if isinstance(v, DictConfig) for sub in v.keys()}
    close = difflib.get_close_matches(name, [*node.keys(), *paths.values()], n=1, cutoff=0.8)
    if not close or close[0] in node:
        return None
    return next(path for path, sub in paths.items() if sub == close[0])


def check_setup(cfg: DictConfig) -> tuple[Any, dict[str, tuple[int, ...]], Any]:
    """Build one env copy and the agent so that a bad id, an unsupported space or a bad agent value fails
    before any run directory exists (numeric ranges: :func:`reverie.configs.ranges.check_ranges`, called first);
    returns ``(agent, obs_shapes, action_spec)``.

    Raises:
        ConfigError: the env cannot be created or uses a space reverie cannot handle; the agent cannot be
            built from ``agent.module`` (unknown or invalid argument); a bad update schedule.
    """
    from hydra.errors import InstantiationException

    from reverie.envs import action_spec, make_env
    from reverie.replay.cycle import make_schedule
    from reverie.loop.collector import check_async_collect
    from reverie.loop.evaluate import stop_target
    from reverie.agents.build import build_agent

    try:
        env = make_env(cfg.env, cfg.seed)
        obs_space = env.observation_space
        obs_shapes = {k: tuple(s.shape) for k, s in obs_space.spaces.items()}
        spec = action_spec(env.action_space)
        env.close()
    except (ValueError, ImportError, TypeError) as err:
        raise ConfigError(f"env error: {err}") from err
    try:
        check_async_collect(cfg)
        stop_target(cfg.train, cfg.env)  # train.stop_return=solved needs an env with a registered threshold
    except ValueError as err:
        raise ConfigError(f"config error: {err}") from err
    try:
        make_schedule(cfg.agent)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config error: {err}. Check agent.schedule, agent.train_ratio, agent.batch_size and "
                          f"agent.batch_length.") from err
    try:
        agent = build_agent(cfg.agent, obs_shapes, spec)
    except (InstantiationException, ValueError, TypeError) as err:
        cause = err.__cause__ or err
        hint = _dynamics_hint(cfg) if "unexpected keyword argument" in str(cause) else ""
        what = f"{hint} ({cause})" if hint else str(cause)  # the combination first, the constructor's words after
        raise ConfigError(f"agent error: {what}\n(the agent is built from `agent.module`; `reverie train "
                          f"--cfg` prints it)") from err
    if cfg.replay.get("preflight", True):  # before any run directory exists
        from reverie.state.preflight import PreflightError, preflight
        from reverie.replay import Replay

        replay_spec = Replay.spec_for(obs_space, spec.dim)
        run_dir = Path(cfg.get("run_dir") or "runs")
        try:
            preflight(replay_spec, int(cfg.replay.capacity), agent, cfg.replay.storage,
                      cfg.replay.directory or run_dir / "replay", run_dir / "checkpoints",
                      int(cfg.train.get("checkpoint_keep", 2)), steps=int(cfg.train.steps),
                      num_envs=int(cfg.env.get("num_envs", 1) or 1))
        except PreflightError as err:
            raise ConfigError(str(err)) from err
    return agent, obs_shapes, spec


def config_diff(cfg: DictConfig) -> list[str]:
    """One ``key: reference -> value`` line (``(absent)`` for a key one side lacks) per key of the resolved ``cfg``
    that differs from ``agent=<agent> exp=reference`` (the paper's values), after a header naming the reference."""
    from reverie.state.resume import flatten

    reference = f"agent={cfg.agent.name} exp=reference"
    ref = flatten(OmegaConf.to_container(load_config(reference.split()), resolve=True))
    new = flatten(OmegaConf.to_container(cfg, resolve=True))
    missing = "(absent)"
    lines = [f"# keys that differ from `reverie train {reference}` (reference -> this config)"]
    for key in sorted(ref.keys() | new.keys()):
        old, value = ref.get(key, missing), new.get(key, missing)
        if old != value:
            lines.append(f"{key}: {old} -> {value}")
    return lines


def _dynamics_option(target: str) -> str | None:
    """The ``dynamics=`` group option whose block sets ``agent.module.dynamics._target_`` to ``target`` (``storm``
    for ``reverie.models.dynamics.TransformerDynamics``), or None."""
    for path in sorted((CONFIG_DIR / "dynamics").glob("*.yaml")):
        block = OmegaConf.load(path).get("agent", {}).get("module", {}).get("dynamics", {})
        if str(block.get("_target_", "")) == target:
            return path.stem
    return None


def variant(cfg: DictConfig) -> list[tuple[str, str, str]]:
    """``(tag, what, text)`` per change against the agent config's own pieces: another dynamics
    (``("storm", "dynamics", "TransformerDynamics (dynamics=storm)")``), another representation objective
    (``("r2", "representation", "r2")``), a start from another run (``("init", "init_from", RUN)``); empty for a
    plain run. Used by the run folder's name and the start-up lines."""
    agent = cfg.get("agent") or {}
    module = agent.get("module") or {}
    out: list[tuple[str, str, str]] = []
    target = str((module.get("dynamics") or {}).get("_target_") or "")
    own = CONFIG_DIR / "agent" / f"{agent.get('name')}.yaml"
    default = str(OmegaConf.load(own).get("module", {}).get("dynamics", {}).get("_target_", "")) if own.is_file() \
        else target
    if target and target != default:
        name = target.rsplit(".", 1)[-1]
        option = _dynamics_option(target)  # dynamics=storm; else the tag is the class's name
        tag = option or re.sub(r"(Dynamics|RSSM)$", "", name).lower() or name.lower()
        out.append((tag, "dynamics", f"{name} (dynamics={option})" if option else name))
    representation = module.get("representation")
    if representation and representation != "reconstruction":
        out.append((str(representation), "representation", str(representation)))
    if cfg.get("init_from"):
        out.append(("init", "init_from", str(cfg.init_from)))
    return out


def _dynamics_hint(cfg: DictConfig) -> str:
    """For an agent that refuses a key a ``dynamics=`` group option added to ``agent.module``: which agents that
    option serves (the agents whose config builds with it: the DreamerV3 agents take ``imag_last``)."""
    option = _dynamics_option(str(((cfg.agent.get("module") or {}).get("dynamics") or {}).get("_target_") or ""))
    if option is None:
        return ""
    return (f"dynamics={option} serves agent=dreamerv3 (agent=dreamerv3_2025 with its dynamics block replaced: "
            f"docs/transformer.md), not agent={cfg.agent.get('name')}: it sets agent.module keys for the DreamerV3 "
            f"agent")


def run_name(cfg: DictConfig) -> str:
    """``<exp>_<agent>_<env>``, e.g. ``classic_dreamerv3-storm-r2_CartPole-v1`` (agent with its :func:`variant` tags),
    ``debug_planet_dmc_vision-walker_walk``: env ``<suite>-<task>`` or the Gymnasium id (an import path's last
    part; ``ALE/Pong-v5`` -> ``ALE-Pong-v5``), cut to 40 characters; characters outside ``[A-Za-z0-9._-]`` -> ``-``."""
    env = cfg.get("env") or {}
    if env.get("suite") and env.get("task"):
        suite = str(env.suite)
        if suite == "dmc":  # which observations: the env groups' names
            suite = "dmc_vision" if env.get("image", True) and not env.get("proprio") else "dmc_proprio" \
                if not env.get("image", True) else "dmc"
        label = f"{suite}-{env.task}"
    else:
        label = str(env.get("id") or "env")
        if ":" in label or ("." in label and not re.search(r"-v\d+$", label)):  # an import path: the class
            label = re.split(r"[.:]", label)[-1]
    safe = lambda text: re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.") or "x"  # noqa: E731
    agent = "-".join([(cfg.get("agent") or {}).get("name") or "agent"] + [tag for tag, _, _ in variant(cfg)])
    return f"{safe(cfg.get('exp_name', 'run'))}_{safe(agent)}_{safe(label)[:40]}"


def make_run_dir(cfg: DictConfig, root: str | Path = "runs", kind: str = "") -> Path:
    """``runs/<date>_<time>_<exp>_<agent>_<env><kind>/`` (:func:`run_name`; or ``cfg.run_dir``), created, with the
    resolved ``config.yaml``."""
    if cfg.get("run_dir"):
        run_dir = Path(cfg.run_dir)
    else:
        stamp = dt.datetime.now().strftime("%Y-%m-%d_%H%M%S")
        name = run_name(cfg)
        run_dir = Path(root) / f"{stamp}_{name}{kind}"
        suffix = 1
        while run_dir.exists():
            suffix += 1
            run_dir = Path(root) / f"{stamp}_{name}{kind}_{suffix}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.run_dir = str(run_dir)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return run_dir


def resume_target(args: list[str], command: str = "train") -> tuple[list[str], Path | None]:
    """Split ``--resume RUN`` off ``args``; a ``run_dir=D`` override whose D has a checkpoint also resumes."""
    from reverie.state.checkpoint import list_checkpoints

    args = list(args)
    if "--resume" in args:
        i = args.index("--resume")
        if i + 1 >= len(args) or "=" in args[i + 1]:
            raise ConfigError(f"{command} --resume needs a run directory: `reverie {command} --resume runs/<run> "
                              f"[OVERRIDE ...]`")
        target = Path(args[i + 1])
        del args[i:i + 2]
        if not target.is_dir():
            raise ConfigError(f"--resume {target}: {'not a folder' if target.exists() else 'no such folder'}; pass "
                              f"a run directory written by `reverie {command}` (`ls runs/` lists them)")
        if not list_checkpoints(target / "checkpoints"):
            raise ConfigError(f"--resume {target}: no checkpoint under {target / 'checkpoints'}; pass a run directory "
                              f"written by `reverie {command}` (it checkpoints every {command}.checkpoint_every "
                              f"{'updates' if command == 'pretrain' else 'env steps'})")
        return [a for a in args if not a.startswith("run_dir=")] + [f"run_dir={target}"], target
    for a in args:
        if a.startswith("run_dir=") and list_checkpoints(Path(a.split("=", 1)[1]) / "checkpoints"):
            return args, Path(a.split("=", 1)[1])
    return args, None


def exit_code(summary: dict) -> int:
    """0 finished, 130 interrupted (Ctrl-C / SIGTERM), 1 stopped by non-finite updates."""
    return 130 if summary["interrupted"] else 1 if summary.get("diverged") else 0


def resume_finished(cfg: DictConfig, resume_dir: Path, length: tuple[str, str] = ("train", "steps")) -> bool:
    """Check that ``resume_dir``'s checkpoint can be resumed with ``cfg``; True when the run is finished and ``cfg``
    does not lengthen it (a message says so; nothing to run).

    Raises:
        ConfigError: the checkpoint lacks run state, or ``cfg`` changes keys that are not safe to change.
    """
    from reverie.state.checkpoint import load_checkpoint
    from reverie.state.resume import ResumeError, check_resumable, check_resume_config, finished

    payload = load_checkpoint(resume_dir)
    try:
        check_resumable(payload, payload["checkpoint_path"])
        check_resume_config(payload["config"], OmegaConf.to_container(cfg, resolve=True))
    except ResumeError as err:
        raise ConfigError(f"resume error ({resume_dir}): {err}") from err
    return finished(resume_dir, cfg, payload["config"], length) is not None


def check_init(cfg: DictConfig, setup: tuple, nproc: int) -> Any:
    """Check a fresh run's ``init_from`` before its run directory exists: that run's agent loads into the agent of
    ``setup`` (:func:`check_setup`) and, with ``init.keep_data``, its replay validates against the env config and
    fits ``replay.capacity``. Returns that replay as a dataset (or None) for :func:`reverie.train.train`.

    Raises:
        ConfigError: naming what does not fit and the fix.
    """
    from reverie.data import DatasetError, load_dataset
    from reverie.data.fill import column_rows
    from reverie.state.init_from import InitError, apply_init, load_init

    if nproc > 1:
        raise ConfigError("config error: init_from runs in one process for now; set trainer.nproc=1")
    try:
        payload = load_init(cfg.init_from)
        agent, obs_shapes, spec = setup
        apply_init(agent, payload, obs_shapes, spec, OmegaConf.to_container(cfg, resolve=True))
        if not cfg.init.keep_data:
            return None
        dataset = load_dataset(cfg.init_from, cfg.env)
        column_rows(dataset.steps, int(cfg.replay.capacity), int(cfg.env.get("num_envs", 1) or 1))
        return dataset
    except (InitError, DatasetError) as err:
        raise ConfigError(str(err) if str(err).startswith("dataset error") else f"init error: {err}") from err
