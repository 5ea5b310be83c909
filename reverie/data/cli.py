"""``reverie pretrain DATA [OVERRIDE ...]`` and ``reverie record ...`` (docs/offline.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from reverie.configs.compose import (ConfigError, check_setup, exit_code, load_config, make_run_dir, resume_finished,
                                     resume_target)

PRETRAIN_HELP = """usage: reverie pretrain DATA [OVERRIDE ...]
       reverie pretrain --resume RUN [OVERRIDE ...]

Learn from logged episodes without stepping an env: fill the replay with DATA and run pretrain.updates updates
of the world model (pretrain.behavior=true: the full agent update, actor and critic in imagination too), with the
logging, open-loop reports, checkpoints and exact resume of `reverie train`. Writes an ordinary run directory
(runs/<date>_<time>_<exp>_<agent>_<env>_pretrain/) that `reverie eval`, `load_run` and `reverie train init_from=RUN`
read.

DATA: a folder of episode_<n>.npz files, a Minari dataset folder, minari:<dataset id> (installed locally; nothing
is downloaded), or a run directory (its replay). The env config (env=..., the Hydra overrides) must be the one the
data was recorded in: every episode is checked against it before anything is written.

  reverie pretrain data/cartpole env=cartpole pretrain.updates=2000
  reverie pretrain data/cartpole pretrain.behavior=true pretrain.heldout=data/cartpole_heldout
  reverie pretrain minari:reverie/pendulum-mix-v0 env=pendulum
  reverie train init_from=runs/<pretrain run> env=cartpole      # then fine-tune online

Keys: pretrain.updates, behavior, log_every, eval_every, eval_episodes (0: never act in the env),
checkpoint_every, report_every, heldout, heldout_sequences (reverie/configs/config.yaml; docs/offline.md)."""

RECORD_HELP = """Record episodes from a policy into a dataset: reverie record --out DIR [options] [OVERRIDE ...]

The env comes from the Hydra overrides (env=pendulum seed=3 ...), or from the run given as --policy. Rows are
those `reverie train` would store (docs/offline.md). npz: appends episode_<n>.npz files to DIR and records the
policy, mix, seed and returns in DIR/dataset.json. minari: writes a Minari dataset to DIR (DIR/data/), or installs
it under --minari-id in Minari's local datasets root."""


def cmd_pretrain(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(PRETRAIN_HELP)
        return 0
    from reverie.configs.ranges import check_ranges
    from reverie.data import DatasetError, load_dataset
    from reverie.data.fill import column_rows
    from reverie.pretrain import pretrain
    from reverie.runtime.process_group import trainer_settings
    from reverie.state.resume import merge_overrides, save_overrides, saved_overrides

    args, resume_dir = resume_target(argv, command="pretrain")
    positional = [a for a in args if "=" not in a and not a.startswith("-")]
    if len(positional) > 1:
        raise ConfigError(f"pretrain takes one DATA argument, got {positional}; overrides are key=value")
    args = [a for a in args if a not in positional]
    if positional:
        args.append(f"pretrain.data={_quoted(_absolute(positional[0]))}")
    if resume_dir is not None:  # the run's own overrides first (its pretrain.data included), then the new ones
        args = merge_overrides(saved_overrides(resume_dir) or [], args)
    if "--cfg" in args:
        print(OmegaConf.to_yaml(load_config([a for a in args if a != "--cfg"])))
        return 0
    cfg = load_config(args)
    if not cfg.pretrain.data:
        raise ConfigError("pretrain needs a dataset: `reverie pretrain DATA [OVERRIDE ...]` "
                          "(`reverie pretrain --help`)")
    try:
        check_ranges(cfg)  # before anything is built or written
        nproc, _ = trainer_settings(cfg.get("trainer"), cfg.device)
    except ValueError as err:
        raise ConfigError(str(err) if str(err).startswith("config error") else f"config error: {err}") from err
    if nproc != 1:
        raise ConfigError("config error: reverie pretrain runs in one process; set trainer.nproc=1")
    if resume_dir is not None and resume_finished(cfg, resume_dir, length=("pretrain", "updates")):
        return 0
    agent, _, _ = check_setup(cfg)
    if not cfg.pretrain.behavior and not hasattr(agent, "update_model"):
        raise ConfigError(f"config error: {type(agent).__name__} has no world-model-only update (update_model); set "
                          f"pretrain.behavior=true to pretrain with its full update")
    dataset = None
    try:
        if resume_dir is None:  # a resumed run's replay is in its checkpoint
            dataset = load_dataset(cfg.pretrain.data, cfg.env)
            column_rows(dataset.steps, int(cfg.replay.capacity), int(cfg.env.get("num_envs", 1) or 1))
        if cfg.pretrain.heldout:
            load_dataset(cfg.pretrain.heldout, cfg.env)
    except DatasetError as err:
        raise ConfigError(str(err)) from err
    if dataset is not None:
        print(f"[reverie] dataset {dataset.source}: {dataset.describe()}")
    run_dir = make_run_dir(cfg, kind="_pretrain")
    save_overrides(run_dir, args)
    return exit_code(pretrain(cfg, run_dir, dataset=dataset))


def _absolute(source: str) -> str:
    """A path made absolute (a resume may start elsewhere); ``minari:<id>`` and bare ids unchanged."""
    return str(Path(source).resolve()) if Path(source).exists() else source


def _quoted(value: str) -> str:
    """``value`` as a quoted Hydra override value (any path characters survive)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cmd_record(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reverie record", description=RECORD_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="npz: the folder to append to; minari: the dataset folder to create")
    parser.add_argument("--policy", default="random",
                        help="random (default), a run directory or checkpoint, or pkg.module.function (a scripted "
                             "controller: obs dict of (N, ...) arrays -> (N,) indices or (N, A) actions in [-1, 1])")
    parser.add_argument("--episodes", type=int, default=10, help="finished episodes to record (default 10)")
    parser.add_argument("--epsilon", type=float, default=0.0,
                        help="per-step probability of a uniform random action instead of the policy's (default 0)")
    parser.add_argument("--mode", default="explore", choices=("explore", "sample", "eval"),
                        help="how a run's agent acts (default explore: as it collected its own data)")
    parser.add_argument("--format", default="npz", choices=("npz", "minari"), help="dataset format (default npz)")
    parser.add_argument("--minari-id", default=None,
                        help="minari: install under this id in Minari's local root (e.g. reverie/cartpole-mix-v0)")
    args, overrides = parser.parse_known_args(argv)
    from reverie.data import DatasetError

    try:
        cfg = _record_config(args, overrides)
        return _record(cfg, args)
    except DatasetError as err:
        print(err, file=sys.stderr)
        return 2


def _record_config(args: argparse.Namespace, overrides: list[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"record: unknown argument(s) {bad}; options are --out, --policy, --episodes, --epsilon, "
                          f"--mode, --format, --minari-id, and key=value overrides (`reverie record --help`)")
    if args.format == "npz" and (not args.out or args.minari_id):
        raise ConfigError("record: --format npz writes to --out DIR (--minari-id needs --format minari)")
    if args.format == "minari" and (args.out is None) == (args.minari_id is None):
        raise ConfigError("record: --format minari writes to --out DIR or under --minari-id ID (one of them)")
    cfg = load_config(overrides)
    if Path(args.policy).exists() and not any(o.lstrip("+~").startswith("env") for o in overrides):
        from reverie.state.checkpoint import load_checkpoint

        cfg.env = OmegaConf.create(load_checkpoint(args.policy)["config"]["env"])  # the run's own env
    if args.format == "npz" and args.out:
        meta = Path(args.out) / "dataset.json"
        held = json.loads(meta.read_text()) if meta.is_file() else {"env": cfg.env, "recordings": []}
        there, here = _data_env(held["env"]), _data_env(cfg.env)
        if there != here:
            keys = sorted(k for k in there.keys() | here.keys() if there.get(k) != here.get(k))
            differ = ", ".join(f"env.{k}: {there.get(k)!r} there, {here.get(k)!r} here" for k in keys)
            raise ConfigError(f"record: {args.out} holds episodes of another env config (its dataset.json; {differ}). "
                              f"Pass the overrides its recordings used (e.g. the same exp=...) or record into another "
                              f"folder")
        if any(_same_recording(rec, args, cfg) for rec in held["recordings"]):
            raise ConfigError(f"record: {args.out} already holds a recording of --policy {args.policy} with seed="
                              f"{int(cfg.seed)}, --epsilon {args.epsilon} and --mode {args.mode}: recording it again "
                              f"would append the same episodes. Pass another seed (seed=N) or record into another "
                              f"folder")
    return cfg


def _recording_key(args: argparse.Namespace, cfg: DictConfig) -> dict:
    """What decides a recording's episodes besides the env: the same key and env give the same rows again."""
    return {"policy_arg": args.policy, "seed": int(cfg.seed), "epsilon": args.epsilon, "mode": args.mode}


def _same_recording(entry: dict, args: argparse.Namespace, cfg: DictConfig) -> bool:
    return all(entry.get(k) == v for k, v in _recording_key(args, cfg).items())  # entries before the key: never


def _data_env(env_cfg) -> dict:
    """What of an env config the recorded rows depend on (not how many copies step, nor how)."""
    plain = OmegaConf.to_container(env_cfg, resolve=True) if isinstance(env_cfg, DictConfig) else dict(env_cfg)
    return {k: v for k, v in plain.items() if k not in ("num_envs", "vector_mode")}


def _record(cfg: DictConfig, args: argparse.Namespace) -> int:
    from reverie.data import Dataset, validate
    from reverie.data.npz import write_npz
    from reverie.data.record import record
    from reverie.envs.convert import SpaceConverter
    from reverie.replay import Replay

    converter = SpaceConverter(cfg.env)
    started, shown = time.monotonic(), [time.monotonic()]

    def progress(done: int, total: int, episode_return: float) -> None:  # at most a line every 10 s, and the last
        now = time.monotonic()
        if now - shown[0] >= 10.0 or done == total:
            shown[0] = now
            print(f"[reverie] record: {done}/{total} episodes (last return {episode_return:.1f}, "
                  f"{now - started:.0f} s)", file=sys.stderr, flush=True)

    episodes, description = record(cfg.env, args.policy, args.episodes, int(cfg.seed), args.epsilon, args.mode,
                                   on_episode=progress)
    spec = Replay.spec_for(converter.observation_space, converter.action_spec.dim)
    dataset = Dataset(args.out or args.minari_id, validate(episodes, spec, converter.action_spec.discrete))
    returns = dataset.returns()
    entry = {"policy": description, **_recording_key(args, cfg), "episodes": len(returns), "steps": dataset.steps,
             "returns": returns}
    if args.format == "npz":
        paths = write_npz(args.out, dataset.episodes)
        meta = Path(args.out) / "dataset.json"
        old = json.loads(meta.read_text()) if meta.is_file() else {"recordings": []}
        meta.write_text(json.dumps({"env": OmegaConf.to_container(cfg.env, resolve=True),
                                    "recordings": [*old["recordings"], entry | {"files": [paths[0].name,
                                                                                         paths[-1].name]}]}, indent=1))
        where = f"{paths[0].name} .. {paths[-1].name} in {args.out}"
    else:
        from reverie.envs.minari_data import write_minari

        folder = write_minari(dataset.episodes, converter, cfg.env, folder=args.out if args.out else None,
                              dataset_id=args.minari_id, description=json.dumps(entry | {
                                  "env": OmegaConf.to_container(cfg.env, resolve=True)}))
        where = f"Minari dataset {folder.parent}" + (f" (id {args.minari_id})" if args.minari_id else "")
    mean = sum(returns) / len(returns)
    print(f"[reverie] recorded {dataset.describe()} (min {min(returns):.1f}, max {max(returns):.1f}) with "
          f"{description}; wrote {where}")
    return 0
