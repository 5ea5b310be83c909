"""``reverie train|eval``: turns Hydra configs into objects and calls ``train``; never names an algorithm.

Examples::

    reverie train                                   # DreamerV3 xs on CartPole-v1
    reverie train env=pendulum
    reverie train env=gym env.id=Acrobot-v1 size=s agent.train_ratio=256
    reverie train exp=debug                         # tiny smoke run
    reverie eval runs/2026-11-30_120000_classic --episodes 10
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


USAGE = """usage: reverie COMMAND [ARGS]

commands:
  train [OVERRIDE ...]        train an agent (Hydra overrides; `reverie train --help`)
  train --resume RUN [OVR ..] continue a stopped or finished run (docs/resume.md)
  eval RUN [--episodes N]     evaluate a trained run directory or checkpoint file
  compare ...                 compare scores with the official ones (`reverie compare --help`)

examples:
  reverie train                              DreamerV3 xs on CartPole-v1
  reverie train env=pendulum                 continuous actions
  reverie train exp=debug                    tiny smoke run
  reverie eval runs/<run> --episodes 10"""

TRAIN_HELP = """usage: reverie train [--cfg] [OVERRIDE ...]

Hydra overrides (key=value, group=option, +new.key=value), e.g.
  reverie train env=pendulum size=s seed=1
  reverie train env=gym env.id=Acrobot-v1
  reverie train exp=debug                 # tiny smoke run
  reverie train --cfg                     # print the resolved config and exit
  reverie train --resume RUN [OVERRIDE ...]   # continue RUN exactly (also: the same command with run_dir=RUN)
  reverie train --resume RUN train.steps=50000  # run a finished run longer
On resume only these keys may change: train.steps, log/eval/checkpoint cadence, logger, threads, ... (see
docs/resume.md); other changes are rejected.
Groups: agent (dreamerv3), env (cartpole, pendulum, gym, atari100k, atari, dmc_vision, dmc_proprio),
size (debug, xs, s, m, l, xl), replay (default), logger (tensorboard, wandb, none),
exp (classic, reference, atari100k, debug)."""


class ConfigError(ValueError):
    """A config that cannot be composed or validated; the message names the key and the fix."""


def load_config(overrides: list[str]) -> DictConfig:
    """Compose ``reverie/configs/config.yaml`` with Hydra ``overrides`` and resolve it.

    Raises:
        ConfigError: unknown key, unknown group option, missing mandatory value (e.g. ``env=gym`` without
            ``env.id``), or a value that fails to resolve.
    """
    try:
        with initialize_config_module("reverie.configs", version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
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
    match = re.search(r"Could not override '([^']+)'", text)
    if match:
        key = match.group(1)
        try:
            with initialize_config_module("reverie.configs", version_base="1.3"):
                base = compose("config", overrides=[o for o in overrides if not o.lstrip("+~").startswith(key + "=")])
        except Exception:  # noqa: BLE001 - the hint is best effort; the key name is the message
            base = None
        parts = key.split(".")
        depth = len(parts) - 1  # the deepest existing mapping on the key's path
        while base is not None and depth > 0 and not isinstance(OmegaConf.select(base, ".".join(parts[:depth])), DictConfig):
            depth -= 1
        parent, missing = ".".join(parts[:depth]), parts[depth]
        node = (OmegaConf.select(base, parent) if parent else base) if base is not None else None
        where = f"'{parent}'" if parent else "the root config"
        if isinstance(node, DictConfig) and len(node) > 0:
            known = f"Supported keys there: {', '.join(sorted(node.keys()))}."
        elif isinstance(node, DictConfig):
            known = (f"{where} is a free-form mapping (e.g. keyword arguments): add the key with "
                     f"`+{key}=...`.")
        else:
            known = "`reverie train --cfg` prints the whole config."
        return f"config error: unknown key '{key}': {where} has no key '{missing}'. {known}"
    return f"config error: {text}"


def check_setup(cfg: DictConfig) -> None:
    """Build one env copy and the agent so that a bad id, an unsupported space or a bad agent value fails
    before any run directory exists.

    Raises:
        ConfigError: the env cannot be created or uses a space reverie cannot handle; the agent cannot be
            built from ``agent.module`` (unknown or invalid argument); a numeric setting is not a number.
    """
    from hydra.errors import InstantiationException

    from reverie.envs import action_spec, make_env
    from reverie.replay import Ratio
    from reverie.train import build_agent

    try:
        env = make_env(cfg.env, cfg.seed)
        obs_space = env.observation_space
        obs_shapes = {k: tuple(s.shape) for k, s in obs_space.spaces.items()}
        spec = action_spec(env.action_space)
        env.close()
    except (ValueError, ImportError, TypeError) as err:
        raise ConfigError(f"env error: {err}") from err
    try:
        Ratio(float(cfg.agent.train_ratio), int(cfg.agent.batch_size), int(cfg.agent.batch_length))
        for key in ("steps", "prefill", "log_every", "eval_every", "eval_episodes", "checkpoint_every"):
            int(cfg.train[key])
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config error: a numeric setting is not a number: {err}. Check agent.train_ratio, "
                          f"agent.batch_size, agent.batch_length and the train.* counts.") from err
    try:
        agent = build_agent(cfg.agent, obs_shapes, spec)
    except (InstantiationException, ValueError, TypeError) as err:
        cause = err.__cause__ or err
        raise ConfigError(f"agent error: {cause}\n(the agent is built from `agent.module`; `reverie train --cfg` "
                          f"prints it)") from err
    if cfg.replay.get("preflight", True):  # before any run directory exists
        from reverie.preflight import PreflightError, preflight
        from reverie.replay import Replay

        replay_spec = Replay.spec_for(obs_space, spec.dim)
        run_dir = Path(cfg.get("run_dir") or "runs")
        try:
            preflight(replay_spec, int(cfg.replay.capacity), agent, cfg.replay.storage,
                      cfg.replay.directory or run_dir / "replay", run_dir / "checkpoints",
                      int(cfg.train.get("checkpoint_keep", 2)))
        except PreflightError as err:
            raise ConfigError(str(err)) from err


def make_run_dir(cfg: DictConfig, root: str | Path = "runs") -> Path:
    """``runs/<date>_<time>_<exp_name>/`` (or ``cfg.run_dir``), created, with the resolved ``config.yaml``."""
    if cfg.get("run_dir"):
        run_dir = Path(cfg.run_dir)
    else:
        stamp = dt.datetime.now().strftime("%Y-%m-%d_%H%M%S")
        run_dir = Path(root) / f"{stamp}_{cfg.exp_name}"
        suffix = 1
        while run_dir.exists():
            suffix += 1
            run_dir = Path(root) / f"{stamp}_{cfg.exp_name}_{suffix}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.run_dir = str(run_dir)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return run_dir


def _resume_target(args: list[str]) -> tuple[list[str], Path | None]:
    """Split ``--resume RUN`` off ``args``; a ``run_dir=D`` override whose D has a checkpoint also resumes."""
    from reverie.checkpoint import list_checkpoints

    args = list(args)
    if "--resume" in args:
        i = args.index("--resume")
        if i + 1 >= len(args) or "=" in args[i + 1]:
            raise ConfigError("train --resume needs a run directory: `reverie train --resume runs/<run> [OVERRIDE ...]`")
        target = Path(args[i + 1])
        del args[i:i + 2]
        if not list_checkpoints(target / "checkpoints"):
            raise ConfigError(f"--resume {target}: no checkpoint under {target / 'checkpoints'}; pass a run directory "
                              f"written by `reverie train` (it checkpoints every train.checkpoint_every env steps)")
        return [a for a in args if not a.startswith("run_dir=")] + [f"run_dir={target}"], target
    for a in args:
        if a.startswith("run_dir=") and list_checkpoints(Path(a.split("=", 1)[1]) / "checkpoints"):
            return args, Path(a.split("=", 1)[1])
    return args, None


def cmd_train(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        print(TRAIN_HELP)
        return 0
    args, resume_dir = _resume_target(args)
    if resume_dir is not None:  # the run's own overrides first, then the new ones (which win)
        from reverie.resume import merge_overrides, saved_overrides

        args = merge_overrides(saved_overrides(resume_dir) or [], args)
    if "--cfg" in args:
        print(OmegaConf.to_yaml(load_config([a for a in args if a != "--cfg"])))
        return 0
    from reverie.train import train  # deferred: torch import only when training

    cfg = load_config(args)
    if resume_dir is not None:
        from reverie.checkpoint import load_checkpoint
        from reverie.resume import ResumeError, check_resumable, check_resume_config, read_summary

        payload = load_checkpoint(resume_dir)
        saved = payload["config"]
        try:
            check_resumable(payload, payload["checkpoint_path"])
            check_resume_config(saved, OmegaConf.to_container(cfg, resolve=True))
        except ResumeError as err:
            raise ConfigError(f"resume error ({resume_dir}): {err}") from err
        done = read_summary(resume_dir)
        if done is not None and int(cfg.train.steps) <= int(saved["train"]["steps"]):
            print(f"[reverie] {resume_dir} already finished ({done['env_steps']} env steps, summary.json); raise "
                  f"train.steps above {saved['train']['steps']} to continue it")
            return 0
    check_setup(cfg)
    run_dir = make_run_dir(cfg)
    from reverie.resume import save_overrides

    save_overrides(run_dir, args)
    summary = train(cfg, run_dir)
    return 130 if summary["interrupted"] else 1 if summary.get("diverged") else 0


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reverie eval", description="Evaluate a trained run.")
    parser.add_argument("run", help="run directory or checkpoint file")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--sample", action="store_true", help="sample actions instead of the policy mode")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    from reverie.evaluate import evaluate
    from reverie.run import load_run

    try:
        run = load_run(args.run)
    except FileNotFoundError as err:
        print(f"eval error: {err}", file=sys.stderr)
        return 2
    seed = run.config["seed"] if args.seed is None else args.seed
    result = evaluate(run.agent, run.config["env"], args.episodes, seed, mode="sample" if args.sample else "eval")
    print(json.dumps({k: result[k] for k in ("mean", "std", "min", "max", "returns")}, indent=1))
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval,
            "compare": lambda argv: __import__("reverie.scores.cli", fromlist=["cmd_compare"]).cmd_compare(argv)}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``reverie`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(USAGE)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
