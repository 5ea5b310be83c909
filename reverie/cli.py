"""``reverie train|eval``: turns Hydra configs into objects and calls ``train``; never names an algorithm.

Examples::

    reverie train                                   # DreamerV3 xs on CartPole-v1
    reverie train env=pendulum
    reverie train env=gym env.id=Acrobot-v1 size=s agent.train_ratio=256
    reverie train exp=debug                         # tiny smoke run
    reverie eval runs/2026-11-30_120000_default --episodes 10
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
        parent, _, leaf = key.rpartition(".")
        try:
            with initialize_config_module("reverie.configs", version_base="1.3"):
                base = compose("config", overrides=[o for o in overrides if not o.startswith(key + "=")])
            node = OmegaConf.select(base, parent) if parent else base
            known = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else "(not a mapping)"
        except Exception:  # noqa: BLE001 - the hint is best effort; the key name is the message
            known = "see `reverie train --cfg`"
        where = f"'{parent}'" if parent else "the root config"
        return (f"config error: unknown key '{key}': {where} has no key '{leaf}'. Supported keys there: {known}. "
                f"(`reverie train --cfg` prints the whole config.)")
    return f"config error: {text}"


def check_env(cfg: DictConfig) -> None:
    """Build (and close) one env copy so a bad id or an unsupported space fails before any run directory exists.

    Raises:
        ConfigError: the env cannot be created or uses a space reverie cannot handle.
    """
    from reverie.envs import make_env

    try:
        make_env(cfg.env, cfg.seed).close()
    except (ValueError, ImportError, TypeError) as err:
        raise ConfigError(f"env error: {err}") from err


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
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return run_dir


def cmd_train(args: list[str]) -> int:
    if "--cfg" in args:
        print(OmegaConf.to_yaml(load_config([a for a in args if a != "--cfg"])))
        return 0
    from reverie.train import train  # deferred: torch import only when training

    cfg = load_config(args)
    check_env(cfg)
    train(cfg, make_run_dir(cfg))
    return 0


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reverie eval", description="Evaluate a trained run.")
    parser.add_argument("run", help="run directory or checkpoint file")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--sample", action="store_true", help="sample actions instead of the policy mode")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    from reverie.evaluate import evaluate
    from reverie.run import load_run

    run = load_run(args.run)
    seed = run.config["seed"] if args.seed is None else args.seed
    result = evaluate(run, run.config["env"], args.episodes, seed, mode="sample" if args.sample else "eval")
    print(json.dumps({k: result[k] for k in ("mean", "std", "min", "max", "returns")}, indent=1))
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``reverie`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
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
