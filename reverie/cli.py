"""``reverie train|eval|imagine|play``: turns Hydra configs into objects and calls ``train``; never names an algorithm.

Config loading, the setup checks and run-folder creation are :mod:`reverie.configs.compose` (below every command;
``from reverie.cli import load_config`` still works, as this module imports it). Nothing in reverie but
``__main__`` imports this module (tests/contract/test_layers.py).

Examples::

    reverie train                                   # DreamerV3 xs on CartPole-v1
    reverie train env=pendulum
    reverie train env=gym env.id=Acrobot-v1 size=s agent.train_ratio=256
    reverie train exp=debug                         # tiny smoke run
    reverie eval runs/2026-11-30_120000_classic_dreamerv3_CartPole-v1 --episodes 10
    reverie imagine runs/2026-11-30_120000_classic_dreamerv3_CartPole-v1 --horizon 30
    reverie play runs/2026-11-30_120000_classic_dreamerv3_CartPole-v1
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import socket
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from reverie.configs.compose import (ConfigError, check_init, check_setup, config_diff, exit_code, load_config,
                                     make_run_dir, resume_finished, resume_target)
from reverie.configs.ranges import check_ranges


USAGE = """usage: reverie COMMAND [ARGS]

commands:
  train [OVERRIDE ...]        train an agent (Hydra overrides; `reverie train --help`)
  train --resume RUN [OVR ..] continue a stopped or finished run (docs/resume.md)
  train init_from=RUN [...]   start online from a pretrained run's weights (docs/offline.md)
  pretrain DATA [OVR ...]     learn from logged episodes, no env steps (`reverie pretrain --help`)
  record --out DIR [...]      record episodes from a policy into a dataset (`reverie record --help`)
  eval RUN [--episodes N]     evaluate a trained run: returns table, videos (`reverie eval --help`)
  import-official CKPT [...]  an official DreamerV3 checkpoint (2023 or 2025 code) as a run folder (docs/fidelity.md)
  imagine RUN [--horizon H]   decode the world model's imagination from a run (`reverie imagine --help`)
  play RUN [--port P]         play inside the world model next to the real env, in a browser (`reverie play --help`)
  compare ...                 compare scores with the official ones (`reverie compare --help`)
  scores fetch [--dir DIR]    download the official DreamerV3 score files for compare (checksummed)
  sweep FILE [--address A]    hyperparameter sweep over seeds on Ray Tune (`reverie sweep --help`)

examples:
  reverie train                              DreamerV3 xs on CartPole-v1
  reverie train env=pendulum                 continuous actions
  reverie train exp=debug                    tiny smoke run
  reverie eval runs/<run> --episodes 10
  reverie eval runs/<run> --planner cem      act by planning over the world model and critic
  reverie imagine runs/<run> --horizon 30
  reverie play runs/<run>
  reverie sweep examples/sweeps/cartpole_train_ratio.yaml"""

TRAIN_HELP = ("""usage: reverie train [--cfg [--diff]] [OVERRIDE ...]

Hydra overrides (key=value, group=option, +new.key=value), e.g.
  reverie train env=pendulum size=s seed=1
  reverie train env=gym env.id=Acrobot-v1
  reverie train exp=debug                 # tiny smoke run
  reverie train --cfg                     # print the resolved config and exit
  reverie train exp=atari100k --cfg --diff   # only the keys that differ from the reference """
              """(agent=<agent> exp=reference)
  reverie train --resume RUN [OVERRIDE ...]   # continue RUN exactly (also: the same command with run_dir=RUN)
  reverie train --resume RUN train.steps=50000  # run a finished run longer
  reverie train init_from=RUN             # start from a pretrained run (reverie pretrain; docs/offline.md)
  reverie train trainer.nproc=2           # data parallel: 2 processes through torchrun (docs/speed.md)
On resume only these keys may change: train.steps, log/eval/checkpoint cadence, logger, threads, ... (see
docs/resume.md); other changes are rejected.
Groups: agent (dreamerv3, planet), env (cartpole, pendulum, gym, atari100k, atari, dmc_vision, dmc_proprio),
size (debug, xs, s, m, l, xl), replay (default), logger (tensorboard, wandb, none),
exp (classic, reference, atari100k, debug, planet_dmc); agent_exp is chosen for you (<agent>_<exp>).""")


def cmd_train(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        print(TRAIN_HELP)
        return 0
    args, resume_dir = resume_target(args)
    if resume_dir is not None:  # the run's own overrides first, then the new ones (which win)
        from reverie.state.resume import merge_overrides, saved_overrides

        args = merge_overrides(saved_overrides(resume_dir) or [], args)
    model_from = _model_source(args, resume_dir)  # init_from: that run's model settings (docs/offline.md)
    if "--cfg" in args:
        cfg = _load_train_config([a for a in args if a not in ("--cfg", "--diff")], model_from)
        print("\n".join(config_diff(cfg)) if "--diff" in args else OmegaConf.to_yaml(cfg))
        return 0
    if "--diff" in args:
        raise ConfigError("config error: --diff goes with --cfg: `reverie train [OVERRIDE ...] --cfg --diff`")
    from reverie.runtime import launch, process_group  # deferred: torch import only when training
    from reverie.train import train

    if process_group.launched_by_torchrun():  # one rank of a data-parallel run: the launcher below did the checks
        cfg = _load_train_config(args, model_from)
        if not cfg.get("run_dir"):
            raise ConfigError("config error: a rank started by torchrun needs run_dir=<dir> (every rank writes to the "
                              "same run directory); `reverie train ... trainer.nproc=N` starts torchrun with it")
        return exit_code(train(cfg, cfg.run_dir))
    cfg = _load_train_config(args, model_from)
    try:
        check_ranges(cfg)  # before anything is built or written
        nproc, _ = process_group.trainer_settings(cfg.get("trainer"), cfg.device)
    except ValueError as err:
        raise ConfigError(str(err) if str(err).startswith("config error") else f"config error: {err}") from err
    if resume_dir is not None and resume_finished(cfg, resume_dir):
        return 0
    setup = check_setup(cfg)
    dataset = check_init(cfg, setup, nproc) if cfg.get("init_from") and resume_dir is None else None
    run_dir = make_run_dir(cfg)
    from reverie.state.resume import save_overrides

    save_overrides(run_dir, args)
    if nproc > 1:  # data parallel: torchrun starts nproc copies of this command, all writing to run_dir
        try:
            return launch.launch(nproc, ["train", *[a for a in args if not a.startswith("run_dir=")],
                                              f"run_dir={run_dir}"])
        except RuntimeError as err:
            raise ConfigError(f"config error: {err}") from err
    return exit_code(train(cfg, run_dir, dataset=dataset))


def _model_source(args: list[str], resume_dir: Path | None) -> dict | None:
    """The resolved config whose model settings a run with ``init_from`` takes: the init_from run's for a new run,
    the run's own when resuming one (it was started that way); None without ``init_from``."""
    from reverie.state.init_from import InitError, init_source, source_config

    source = init_source(args)
    if source is None:
        return None
    try:
        return source_config(resume_dir if resume_dir is not None else source)
    except InitError as err:
        raise ConfigError(f"init error: {err}") from err


def _load_train_config(args: list[str], model_from: dict | None) -> DictConfig:
    """:func:`load_config`, with ``model_from``'s agent and ``agent.module`` under the command's model overrides."""
    if model_from is None:
        return load_config(args)
    from reverie.state.init_from import InitError, take_model_settings, with_source_agent

    try:
        args = with_source_agent(args, model_from)
    except InitError as err:
        raise ConfigError(f"init error: {err}") from err
    cfg = load_config(args)
    take_model_settings(cfg, model_from, args, load_config)
    return cfg


def _checkpoint_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="best",
                        help="best (default: checkpoints/best.pt, the weights of the run's best evaluation; the "
                             "newest checkpoint when it has none), last (the newest checkpoint) or a file")


EVAL_HELP = """Evaluate a trained run: reverie eval RUN [options]

RUN is a run directory (--checkpoint best, the default: the weights of its best evaluation; last: its newest
checkpoint), a checkpoint file, or a wandb artifact
wandb:<entity>/<project>/<run id>-checkpoint:latest (logged by runs with logger=wandb).
The env and its wrappers are rebuilt from the run's resolved config (protocol settings included) and seeded
as the run's own evaluations, so the default seed reproduces the run's evaluation at that checkpoint's step
(within the noise of the latent samples; --checkpoint last: its final evaluation). Prints which checkpoint it
used. Writes RUN/eval/<date>_<time>/returns.json and returns.csv (mean, std, min, max,
per-episode returns and lengths) and an mp4 per episode; prints the table (return and length per episode, mean
+- std, min, max).
DreamerV3 runs act with their actor, or with --planner cem|mppi by planning over the world model with the critic
as value bootstrap (docs/planning.md); returns.json then records the planner and its settings."""


def add_planner_arguments(parser: argparse.ArgumentParser) -> None:
    """``--planner`` and ``--plan KEY=VALUE`` (DreamerV3 runs; :mod:`reverie.agents.dreamer_planning`)."""
    from reverie.agents.dreamer_planning import PLAN_DEFAULTS, PLANNERS

    group = parser.add_argument_group("planning (DreamerV3 runs, docs/planning.md)")
    group.add_argument("--planner", choices=PLANNERS, default=None,
                       help="act with the actor, or plan with cem/mppi over the world model with the critic as value "
                            "bootstrap (default: the run's agent.module.planner)")
    group.add_argument("--plan", action="append", default=[], metavar="KEY=VALUE",
                       help=f"planner setting, repeatable, e.g. --plan candidates=500 ({', '.join(PLAN_DEFAULTS)})")


def plan_settings(entries: list[str]) -> dict:
    """``["candidates=500", "sample=false"]`` -> ``{"candidates": 500, "sample": False}`` (values as YAML scalars).

    Raises:
        ConfigError: an entry without ``=``.
    """
    import yaml

    plan = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise ConfigError(f"config error: --plan takes KEY=VALUE (e.g. --plan candidates=500), got {entry!r}")
        plan[key.strip()] = yaml.safe_load(value)
    return plan


def planner_arguments(args: argparse.Namespace) -> tuple[str | None, dict]:
    """``(planner, plan settings)`` from :func:`add_planner_arguments`' options.

    Raises:
        ConfigError: a ``--plan`` entry without ``=``.
    """
    return args.planner, plan_settings(args.plan)


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reverie eval", description=EVAL_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run directory, checkpoint file or wandb:<entity>/<project>/<artifact>:<alias>")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    parser.add_argument("--sample", action="store_true", help="sample actions instead of the policy mode")
    parser.add_argument("--seed", type=int, default=None, help="env seed (default: the run's seed)")
    parser.add_argument("--out", default=None, help="output folder (default RUN/eval/<date>_<time>)")
    parser.add_argument("--no-video", action="store_true", help="no mp4 per episode")
    parser.add_argument("--openloop", action="store_true",
                        help="also write each episode's observations side by side with the world model's open-loop "
                             "prediction of the same actions (episode_<k>_openloop.mp4; a PNG for vector obs)")
    parser.add_argument("--context", type=int, default=5, help="observed steps before the open loop (default 5)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    _checkpoint_option(parser)
    add_planner_arguments(parser)
    args = parser.parse_args(argv)
    from reverie.loop.evaluate import evaluate, format_returns, write_returns
    from reverie.state.saved_run import RunError, describe_checkpoint, load_run, version_mismatches
    from reverie.viz.episodes import EpisodeRecorder

    if args.episodes < 1:  # before the run loads
        print(f"eval error: --episodes must be >= 1, got {args.episodes}", file=sys.stderr)
        return 2
    planner, plan = planner_arguments(args)
    try:
        run = load_run(args.run, device=args.device, checkpoint=args.checkpoint, planner=planner, plan=plan)
    except RunError as err:
        print(f"eval error: {err}", file=sys.stderr)
        return 2
    print(f"[reverie] eval: {describe_checkpoint(run)}", file=sys.stderr)
    for mismatch in version_mismatches(run):
        print(f"eval warning: simulator version differs from the run's ({mismatch}); returns may differ",
              file=sys.stderr)
    seed = run.config["seed"] if args.seed is None else args.seed
    mode = "sample" if args.sample else "eval"
    out = Path(args.out) if args.out else run.directory / "eval" / dt.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    recorder = None
    if not args.no_video or args.openloop:
        recorder = EpisodeRecorder(out, render=not args.no_video, context=args.context,
                                   openloop_agent=run.agent if args.openloop else None)
    started = time.monotonic()
    acting = f" ({run.acting})" if run.acting else ""
    print(f"[reverie] eval: {args.episodes} {mode} episode(s){acting}...", file=sys.stderr, flush=True)

    last_line = [started]

    def episode_done(done: int, episodes: int, episode_return: float) -> None:  # a line per episode: never silent
        print(f"[reverie] eval: episode {done}/{episodes} return {episode_return:.1f} "
              f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        last_line[0] = time.monotonic()

    def step_done(steps: int) -> None:  # inside a long episode (a planner's): a line every 10 s
        now = time.monotonic()
        if now - last_line[0] >= 10.0:
            print(f"[reverie] eval: {steps} steps ({now - started:.0f} s)", file=sys.stderr, flush=True)
            last_line[0] = now

    try:
        result = evaluate(run.agent, run.config["env"], args.episodes, seed, mode=mode, recorder=recorder,
                          on_episode=episode_done, on_step=step_done)
    except TypeError as err:  # a user env whose constructor takes no render_mode
        print(f"eval: no episode videos, the env cannot render ({err}); --no-video skips them", file=sys.stderr)
        recorder = EpisodeRecorder(out, render=False, context=args.context, openloop_agent=run.agent) \
            if args.openloop else None
        result = evaluate(run.agent, run.config["env"], args.episodes, seed, mode=mode, recorder=recorder,
                          on_episode=episode_done, on_step=step_done)
    paths = write_returns(result, out, checkpoint=str(run.checkpoint), env_steps=run.counters.get("env_steps"),
                          mode=mode, seed=seed, **({"acting": run.acting} if run.acting else {}))
    print(format_returns(result, title=f"{args.episodes} {mode} episodes, seed {seed}"))
    if recorder is not None and recorder.quality:  # --openloop: prediction quality per episode (reverie.viz.quality)
        from reverie.viz.quality import summary_line

        for index, metrics in sorted(recorder.quality.items()):
            print(f"open loop, episode {index}: {summary_line(metrics)}")
    print(f"[reverie] wrote {paths[0]}, {paths[1].name}"
          f"{f' and {len(recorder.written)} video/plot files' if recorder and recorder.written else ''} in {out}",
          file=sys.stderr)
    return 0


IMAGINE_HELP = """Imagine with a trained run's world model: reverie imagine RUN [options]

Resets the run's env (seeded as its evaluation envs), observes the first --context frames with the policy,
then rolls the world model forward --horizon steps in latent space with the learned policy (or --actions),
decodes the states and writes imagine.png (frames or features, predicted rewards underneath), imagine.json
and, for image observations, imagine_<key>.mp4 into RUN/imagine/<date>_<time>/ (or --out)."""


def cmd_imagine(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reverie imagine", description=IMAGINE_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run directory, checkpoint file or wandb:<entity>/<project>/<artifact>:<alias>")
    parser.add_argument("--context", type=int, default=5, help="observed steps (default 5)")
    parser.add_argument("--horizon", type=int, default=15, help="imagined steps (default 15)")
    parser.add_argument("--actions", default="policy",
                        help="policy (the actor's mode), random, or a .npy file of (H, A) model actions / (H,) indices")
    parser.add_argument("--seed", type=int, default=None, help="env seed (default: the run's seed)")
    parser.add_argument("--out", default=None, help="output folder (default RUN/imagine/<date>_<time>)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    _checkpoint_option(parser)
    args = parser.parse_args(argv)
    import numpy as np

    from reverie.state.saved_run import RunError, describe_checkpoint, load_run
    from reverie.viz.imagine import imagine, write_imagined

    try:
        run = load_run(args.run, device=args.device, checkpoint=args.checkpoint)
        print(f"[reverie] imagine: {describe_checkpoint(run)}", file=sys.stderr)
        actions = args.actions
        if actions not in ("policy", "random"):
            if not Path(actions).is_file():
                raise RunError(f"--actions {actions!r}: not 'policy', 'random' or an existing .npy file")
            actions = np.load(actions)
        seed = run.config["seed"] if args.seed is None else args.seed
        result = imagine(run.agent, run.config["env"], run.action_spec, seed, args.context, args.horizon, actions)
    except (RunError, ValueError) as err:
        print(f"imagine error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else run.directory / "imagine" / dt.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    paths = write_imagined(result, out)
    print(f"[reverie] imagined {args.horizon} steps after {args.context} observed; predicted reward sum "
          f"{float(result.reward[args.context:].sum()):.3f}; wrote {', '.join(p.name for p in paths)} in {out}")
    return 0


PLAY_HELP = """Play inside a run's world model, next to the real env: reverie play RUN [options]

Starts a local web server and prints its address; open it in a browser. The page shows the real env and the
world model's dream (decoded observations) side by side, both stepped by the keys you press (arrows, Space, digits:
the page lists them; docs/play.md), with the predicted reward and continue probability next to the true reward.
Let the policy drive (watch), and start the dream from the real env's state or from the model's initial state.
Ctrl-C stops the server."""


def _port(text: str) -> int:
    """``--port``: an integer 0-65535 (argparse reports anything else as a usage error)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535 (0: any free port), got {text!r}")
    return port


def cmd_play(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reverie play", description=PLAY_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run directory, checkpoint file or wandb:<entity>/<project>/<artifact>:<alias>")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=_port, default=8765, help="port (default 8765; 0: any free port)")
    parser.add_argument("--seed", type=int, default=None, help="env seed (default: the run's seed)")
    parser.add_argument("--sample", action="store_true", help="sample the dream's latents instead of their mode")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    _checkpoint_option(parser)
    add_planner_arguments(parser)
    args = parser.parse_args(argv)
    try:
        from reverie.play.server import bind, create_app, serve
    except ImportError as err:
        print(f"play error: the web server needs the play extra ({err}): pip install 'reverie[play]'", file=sys.stderr)
        return 2
    from reverie.play.session import PlaySession
    from reverie.state.saved_run import RunError, load_run

    planner, plan = planner_arguments(args)
    try:  # first, so a port in use or a foreign --host is reported before the run loads
        sock = bind(args.host, args.port)
    except OSError as err:
        fix = ("--host must be an address of this machine (default 127.0.0.1; 0.0.0.0: all of them)"
               if err.errno == errno.EADDRNOTAVAIL or isinstance(err, socket.gaierror)
               else "pick another --port (0: any free one)")
        print(f"play error: cannot listen on {args.host}:{args.port} ({err}); {fix}", file=sys.stderr)
        return 2
    try:
        run = load_run(args.run, device=args.device, checkpoint=args.checkpoint, planner=planner, plan=plan)
        seed = run.config["seed"] if args.seed is None else args.seed
        app = create_app(lambda: PlaySession(run.agent, run.config["env"], run.action_spec, seed, sample=args.sample),
                         title=f"reverie play: {run.directory.name}")
    except (RunError, ValueError, TypeError) as err:
        sock.close()
        print(f"play error: {err}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"[reverie] play {run.directory} at http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
    serve(app, sock)
    return 0


def cmd_import_official(argv: list[str]) -> int:
    """``reverie import-official CKPT [overrides]``: an official DreamerV3 checkpoint as a run folder."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: reverie import-official CHECKPOINT [config overrides]\n\n"
              "Load an official DreamerV3 checkpoint (the 2025 code's <logdir>/ckpt, the 2023 code's "
              "checkpoint.ckpt) into the reverie agent the overrides build (agent=dreamerv3_2025 or dreamerv3, the "
              "official run's sizes and env) and write it as runs/<...>_official/checkpoints/best.pt, for reverie "
              "eval / play / imagine and train init_from=RUN (docs/fidelity.md).")
        return 0
    from reverie.state.official_run import import_official

    run_dir = import_official(argv[0], argv[1:])
    print(f"[reverie] imported {argv[0]} into {run_dir} (reverie eval {run_dir})")
    return 0


COMMANDS = {"train": cmd_train, "import-official": cmd_import_official, "eval": cmd_eval, "imagine": cmd_imagine, "play": cmd_play,
            "pretrain": lambda argv: __import__("reverie.data.cli", fromlist=["cmd_pretrain"]).cmd_pretrain(argv),
            "record": lambda argv: __import__("reverie.data.cli", fromlist=["cmd_record"]).cmd_record(argv),
            "compare": lambda argv: __import__("reverie.scores.cli", fromlist=["cmd_compare"]).cmd_compare(argv),
            "scores": lambda argv: __import__("reverie.scores.fetch", fromlist=["cmd_scores"]).cmd_scores(argv),
            "sweep": lambda argv: __import__("reverie.sweep.cli", fromlist=["cmd_sweep"]).cmd_sweep(argv)}


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
