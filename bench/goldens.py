"""Golden tensors of the official DreamerV3 update, made by the official code itself (issue 40), for
tests/goldens/test_official_update.py, which checks reverie's update against them with numpy and torch only.

    .venv/bin/python bench/fidelity.py install --version 2025 --source ~/.cache/reverie/dreamerv3-e3f0224
    ~/.cache/reverie/jax2025-venv/bin/python bench/goldens.py --source ~/.cache/reverie/dreamerv3-e3f0224 \\
        --case vector_continuous --out tests/goldens/data

Runs INSIDE the official venv (jax, ninjax, elements; no torch, no reverie import). It builds the official agent
(``dreamerv3/agent.py`` ``Agent`` through ``embodied.jax.Agent``, as ``main.py``'s ``make_agent`` does) from the
official ``configs.yaml`` resolved by the official ``elements.Flags`` code, at a tiny size and float32
(:data:`FLAGS` and the case's flags), on observation and action spaces given here (the case's shapes: DMC proprio's
``position (3,)``, ``velocity (2,)`` with one continuous action; Atari's ``image (64, 64, 3)`` with 6 discrete
actions), and runs two official train steps on one fixed batch (:func:`make_batch`, seed 0; the same batch both
times). Without editing the official source it records, by wrapping two of its functions:

- every random draw the update uses (``embodied.jax.outs.Categorical.sample``'s index and ``Normal.sample``'s
  noise, through an identity ``jax.pure_callback``): the latent and action draws with the logits or mean and std
  they were drawn from (in no fixed order, a draw possibly twice: the test finds each by its distribution);
- the gradient of every parameter (an identity transformation put before the official optimiser chain; it reads
  the gradients the chain receives and changes nothing).

The file ``<out>/official2025_<case>.npz`` holds: ``meta`` (a JSON string: commit, flags, seed, case, shapes),
``init/<name>`` (the parameters before update 1, official names), ``batch/<key>`` (``(B, T, ...)``, official
layout), ``draw<u>/<i>/<field>`` (update ``u``'s draws), ``grad<u>/<name>``, ``param<u>/<name>`` (after update
``u``), ``metric<u>/<name>`` (the official train metrics), for ``u`` in 1, 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

COMMITS = {"2023": "8fa35f8", "2025": "e3f0224"}
SEED = 0
B, T = 2, 6  # batch size and length of the golden batch
# Tiny widths (every layer kind kept: 2 blocks of the block GRU, 3-layer encoder/decoder/policy/value MLPs),
# float32 on the CPU, no replay context (a window starts from zeros; the replay context is checked separately),
# horizon 4, and a learning rate of 1e-3 with a warmup of 2 updates (lr 0 at update 1, 5e-4 at update 2), so that
# update 2's step is large enough to compare and comes from moments that both updates wrote; free nats 0.5 (at this
# size the KL of 4 latents of 4 classes stays below the default 1 nat, where the KL losses pass no gradient; 0.5
# clips some rows and not others).
FLAGS = ("--jax.platform cpu --jax.compute_dtype float32 --jax.prealloc False "
         "--agent.dyn.rssm.deter 16 --agent.dyn.rssm.hidden 8 --agent.dyn.rssm.stoch 4 --agent.dyn.rssm.classes 4 "
         "--agent.dyn.rssm.blocks 2 --agent.enc.simple.units 8 --agent.dec.simple.units 8 "
         "--agent.rewhead.units 8 --agent.conhead.units 8 --agent.policy.units 8 --agent.value.units 8 "
         "--agent.enc.simple.depth 4 --agent.dec.simple.depth 4 --agent.imag_length 4 --agent.opt.lr 1e-3 "
         "--agent.opt.warmup 2 --agent.dyn.rssm.free_nats 0.5 "
         f"--replay_context 0 --batch_size {B} --batch_length {T} --seed {SEED} --logdir /tmp/reverie_goldens")
# The 2023 code (8fa35f8) at the same tiny widths, float32 (--jax.precision float32), metrics every update; two
# hidden layers per MLP; one learning rate of 1e-3 for its three Adam optimisers (their first step is ~lr * sign(g):
# large enough to compare); free nats 0.5 for the same reason as above.
FLAGS_2023 = ("--jax.platform cpu --jax.precision float32 --jax.prealloc False --jax.metrics_every 1 "
              "--rssm.deter 16 --rssm.units 8 --rssm.stoch 4 --rssm.classes 4 "
              "--encoder.mlp_units 8 --encoder.mlp_layers 2 --encoder.cnn_depth 4 "
              "--decoder.mlp_units 8 --decoder.mlp_layers 2 --decoder.cnn_depth 4 "
              "--reward_head.units 8 --reward_head.layers 2 --cont_head.units 8 --cont_head.layers 2 "
              "--actor.units 8 --actor.layers 2 --critic.units 8 --critic.layers 2 --imag_horizon 4 "
              "--model_opt.lr 1e-3 --actor_opt.lr 1e-3 --critic_opt.lr 1e-3 --dyn_loss.free 0.5 --rep_loss.free 0.5 "
              f"--batch_size {B} --batch_length {T} --seed {SEED} --logdir /tmp/reverie_goldens")
REPLAY_STEPS, REPLAY_WINDOWS = 40, [(0, 0), (0, 7), (0, 13), (0, 20), (1, 3), (1, 9), (1, 15), (1, 24)]
CASES = {
    "vector_continuous": {"configs": ["defaults", "dmc_proprio"], "obs": {"position": (3,), "velocity": (2,)},
                          "action": ("continuous", 1)},
    "image_discrete": {"configs": ["defaults", "atari100k"], "obs": {"image": (64, 64, 3)},
                       "action": ("discrete", 6)},
    # the data path (2025 only): one recorded stream of two envs through the official replay and the official
    # agent's _apply_replay_context; the windows REPLAY_WINDOWS as (env, first row)
    "replay": {"configs": ["defaults", "dmc_proprio"], "obs": {"position": (3,), "velocity": (2,)},
               "action": ("continuous", 1)},
}


def make_batch(case: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One replay chunk ``(B, T, ...)`` in the official layout: observations, ``action`` (the action taken after
    each row's observation), ``reward``, the flags (``is_first`` at row 0 and once inside, a terminal before it, a
    time limit), ``stepid``, ``consec``."""
    data = {}
    for key, shape in case["obs"].items():
        if len(shape) == 3:
            data[key] = rng.integers(0, 256, (B, T, *shape), dtype=np.uint8)
        else:
            data[key] = rng.normal(0.0, 2.0, (B, T, *shape)).astype(np.float32)
    kind, dim = case["action"]
    if kind == "continuous":
        data["action"] = rng.uniform(-1.0, 1.0, (B, T, dim)).astype(np.float32)
    else:
        data["action"] = rng.integers(0, dim, (B, T), dtype=np.int32)
    data["reward"] = rng.normal(0.0, 1.0, (B, T)).astype(np.float32)
    is_first, is_last, is_terminal = (np.zeros((B, T), bool) for _ in range(3))
    is_first[:, 0] = True
    is_last[0, 3], is_terminal[0, 3], is_first[0, 4] = True, True, True  # an episode ends in a terminal at row 3
    is_last[1, 4] = True  # a time limit: the last row of an episode that did not terminate
    is_first[1, 5] = True
    data.update(is_first=is_first, is_last=is_last, is_terminal=is_terminal)
    data["stepid"] = np.zeros((B, T, 20), np.uint8)
    data["consec"] = np.zeros((B, T), np.int32)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="the official source (bench/fidelity.py install)")
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--version", choices=sorted(COMMITS), default="2025")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="also save the official agent after update 2 with the official checkpoint code here")
    args = parser.parse_args()
    source = args.source.expanduser().resolve()
    commit = (source / ".fidelity_commit").read_text().strip() if (source / ".fidelity_commit").exists() else "?"
    if not commit.startswith(COMMITS[args.version]):
        raise SystemExit(f"--source {source} holds commit {commit!r}, not {COMMITS[args.version]}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.case == "replay" and args.version != "2025":
        raise SystemExit("--case replay is a 2025 case (the replay context)")
    make = make_2023 if args.version == "2023" else make_replay if args.case == "replay" else make_2025
    files, flags, draws = make(source, CASES[args.case], args.checkpoint)
    meta = {"version": args.version, "commit": commit, "case": args.case, "configs": CASES[args.case]["configs"],
            "flags": flags, "seed": SEED, "batch": [B, T], "obs": CASES[args.case]["obs"],
            "action": CASES[args.case]["action"],
            "command": f"bench/goldens.py --source <official source> --version {args.version} --case {args.case} "
                       f"--out <dir>"}
    files["meta"] = np.array(json.dumps(meta))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"official{args.version}_{args.case}.npz"
    np.savez_compressed(path, **files)
    print(f"[goldens] {path}: {len(files)} arrays, {path.stat().st_size / 1e3:.1f} kB; {draws} draws in update 2")


def perturb(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The official initial parameters, moved off their special values (zero biases and output layers, unit norm
    scales) so that a swapped or missing entry in a parameter map shows: N(0, 0.05) added to kernels, N(0, 0.1)
    to the rest, seeded (``SEED + 1``), in the order of ``params``."""
    rng = np.random.default_rng(SEED + 1)
    out = {}
    for key, value in params.items():
        value = np.asarray(value)
        noise = rng.normal(0.0, 0.05 if key.endswith(("/kernel", "/w")) else 0.1, value.shape)
        out[key] = (value + noise).astype(value.dtype)
    return out


def make_2023(source: Path, case: dict, checkpoint: Path | None = None) -> tuple[dict[str, np.ndarray], str, int]:
    """The goldens of the 2023 official code (8fa35f8): ``(files, flags, draws in update 2)``. Its agent is built as
    its ``train.py`` builds it (``agent.Agent(obs_space, act_space, step, config)``, the ``JAXAgent`` wrapper) and
    trained with ``agent.train(data, state)``; its three optimisers' gradients are recorded by name."""
    sys.path[:0] = [str(source), str(source / "dreamerv3")]
    import jax
    import jax.numpy as jnp
    import optax
    from tensorflow_probability.substrates import jax as tfp
    from tensorflow_probability.substrates.jax.internal import samplers

    from dreamerv3 import agent as agt
    from dreamerv3 import embodied, jaxagent, jaxutils

    config = embodied.Config(agt.Agent.configs["defaults"])
    for name in case["configs"][1:]:
        block = dict(agt.Agent.configs[name])
        # 8fa35f8's atari100k block sets actor_eval_sample, a key its defaults lack (Config.update refuses it); it
        # changes only how evaluation episodes act, not the update
        block.pop("actor_eval_sample", None)
        config = config.update(block)
    config = embodied.Flags(config).parse(FLAGS_2023.split())

    draws: list[dict[str, np.ndarray]] = []
    grads: dict[str, dict[str, np.ndarray]] = {}
    sg = jax.lax.stop_gradient

    def record(kind: str, **arrays) -> None:
        draws.append({"kind": np.array(kind), **{k: np.asarray(v) for k, v in arrays.items()}})

    # the draws, recorded as in make_2025: the one-hot latents and discrete actions (jaxutils.OneHotDist: the
    # index of TFP's one-hot sample, then the official straight-through one-hot) and the continuous actions
    # (tfd.Normal: loc + scale * N(0, 1) noise, the noise recorded)
    onehot_sample = tfp.distributions.OneHotCategorical.sample

    def onehot(self, sample_shape=(), seed=None):
        sample = sg(onehot_sample(self, sample_shape, seed))
        index = jnp.argmax(sample, -1)
        logits = self.logits_parameter()

        def keep(lg, ix):
            record("categorical", logits=lg, index=np.reshape(ix, np.shape(lg)[:-1]))
            return np.asarray(ix, index.dtype)
        index = jax.pure_callback(keep, jax.ShapeDtypeStruct(index.shape, index.dtype), sg(logits), index)
        sample = jax.nn.one_hot(index, sample.shape[-1], dtype=sample.dtype)
        probs = self._pad(self.probs_parameter(), sample.shape)
        return sg(sample) + (probs - sg(probs)).astype(sample.dtype)

    def normal_n(self, n, seed=None):
        loc, scale = jnp.broadcast_arrays(self.loc, self.scale)
        eps = jax.random.normal(samplers.sanitize_seed(seed), (n, *loc.shape), loc.dtype)

        def keep(mean, std, noise):
            record("normal", mean=mean, std=std, eps=noise[0])
            return np.asarray(noise, np.float32)
        eps = jax.pure_callback(keep, jax.ShapeDtypeStruct(eps.shape, eps.dtype), sg(loc), sg(scale), eps)
        return eps * scale + loc

    jaxutils.OneHotDist.sample = onehot
    tfp.distributions.Normal._sample_n = normal_n

    optimizer_init = jaxutils.Optimizer.__init__

    def recording_optimizer(self, *args, **kwargs):
        optimizer_init(self, *args, **kwargs)
        name = self.name

        def update(updates, state, params=None):
            jax.debug.callback(lambda g: grads.__setitem__(name, jax.tree_util.tree_map(np.asarray, g)), updates)
            return updates, state
        self.opt = optax.chain(optax.GradientTransformation(lambda params: optax.EmptyState(), update), self.opt)

    jaxutils.Optimizer.__init__ = recording_optimizer
    setup = jaxagent.JAXAgent._setup

    def allow_transfers(self):  # the callbacks move arrays between host and device
        setup(self)
        jax.config.update("jax_transfer_guard", "allow")

    jaxagent.JAXAgent._setup = allow_transfers

    obs = {k: embodied.Space(np.uint8 if len(s) == 3 else np.float32, s) for k, s in case["obs"].items()}
    obs |= {"reward": embodied.Space(np.float32), "is_first": embodied.Space(bool),
            "is_last": embodied.Space(bool), "is_terminal": embodied.Space(bool)}
    kind, dim = case["action"]
    if kind == "continuous":
        action = embodied.Space(np.float32, (dim,), -1, 1)
    else:  # one-hot, as the official OneHotAction wrapper gives it
        action = embodied.Space(np.float32, (dim,), 0, 1)
        action._discrete = True
    agent = agt.Agent(obs, {"action": action}, embodied.Counter(), config)
    jax.effects_barrier()

    def is_model(key: str) -> bool:  # parameters, not optimiser states, step counters or the return statistics
        return "_opt/" not in key and not key.endswith("/step") and "/retnorm" not in key

    names = [k for k in agent.varibs if is_model(k)]
    moved = perturb({k: agent.varibs[k] for k in names})
    agent.varibs = {**agent.varibs, **{k: jax.device_put(v, agent.train_devices[0]) for k, v in moved.items()}}
    agent.sync()
    kept = [k for k in agent.varibs if is_model(k) or "/retnorm" in k]  # the optimiser states are not kept
    files: dict[str, np.ndarray] = {f"init/{k}": np.asarray(agent.varibs[k]) for k in kept}
    batch = make_batch(case, np.random.default_rng(SEED))
    data = {k: batch[k] for k in (*case["obs"], "reward", "is_first", "is_last", "is_terminal")}
    data["action"] = batch["action"] if kind == "continuous" else np.eye(dim, dtype=np.float32)[batch["action"]]
    files |= {f"batch/{k}": v for k, v in batch.items()}
    state = None
    agent.rng = np.random.default_rng(SEED)  # the train keys: the wrapper's own generator, from the seed
    for update in (1, 2):
        draws.clear()
        grads.clear()
        _, state, mets = agent.train({k: v.copy() for k, v in data.items()}, state)
        jax.effects_barrier()
        if sorted(grads) != ["actor_opt", "critic_opt", "model_opt"]:
            raise RuntimeError(f"update {update}: recorded the gradients of {sorted(grads)}")
        for opt, tree in grads.items():
            files |= {f"grad{update}/{k}": v for k, v in tree.items()}
        files |= {f"param{update}/{k}": np.asarray(agent.varibs[k]) for k in kept}
        for i, draw in enumerate(draws):
            files |= {f"draw{update}/{i:03d}/{k}": v for k, v in draw.items()}
        files |= {f"metric{update}/{k}": np.asarray(v) for k, v in mets.items() if np.asarray(v).size == 1}
    if checkpoint is not None:  # the official checkpoint code: one pickle file (its folder must exist)
        checkpoint.mkdir(parents=True, exist_ok=True)
        saver = embodied.Checkpoint(checkpoint / "checkpoint.ckpt", parallel=False)
        saver.agent = agent
        saver.save()
    return files, FLAGS_2023, len(draws)


def make_stream(case: dict, rng: np.random.Generator) -> list[list[dict[str, np.ndarray]]]:
    """Two envs' steps as the official driver stores them: observations, ``action`` (taken after the step's
    observation), ``reward``, the flags, and the policy's replay-context entries ``dyn/deter``, ``dyn/stoch``
    (random: as if written at acting time). Env 0: an episode of 9 steps ending in a terminal, then one cut by a
    time limit at 12 steps, then one running on; env 1: a terminal at 17 steps, then one running on."""
    ends = {0: {8: True, 20: False}, 1: {16: True}}  # last step of an episode -> terminal (else a time limit)
    streams = []
    for env in range(2):
        steps, first = [], True
        for t in range(REPLAY_STEPS):
            step = {k: rng.normal(0.0, 2.0, s).astype(np.float32) for k, s in case["obs"].items()}
            step["action"] = rng.uniform(-1, 1, (case["action"][1],)).astype(np.float32)
            step["reward"] = np.float32(0.0 if first else rng.normal())
            end = ends[env].get(t)
            step.update(is_first=np.bool_(first), is_last=np.bool_(end is not None),
                        is_terminal=np.bool_(bool(end)))
            step["dyn/deter"] = rng.normal(size=(16,)).astype(np.float32)
            step["dyn/stoch"] = np.eye(4, dtype=np.float32)[rng.integers(4, size=4)]
            steps.append(step)
            first = end is not None
        streams.append(steps)
    return streams


def make_replay(source: Path, case: dict, checkpoint: Path | None = None) -> tuple[dict[str, np.ndarray], str, int]:
    """The data path's golden: the stream of :func:`make_stream` added to the official ``embodied.core.Replay``
    (``length = batch_length + replay_context``), the windows ``REPLAY_WINDOWS`` read from it as its ``sample``
    reads one (``_getseq``, ``_assemble_batch``, ``_annotate_batch``), then through the official agent's
    ``_apply_replay_context``: the carry, observations and previous actions the official update starts from."""
    sys.path[:0] = [str(source), str(source / "dreamerv3")]
    import elements
    import jax
    import ruamel.yaml as yaml
    import embodied.jax.internal as internal
    from dreamerv3.agent import Agent
    from embodied.core.replay import Replay

    setup = internal.setup  # _apply_replay_context runs eagerly here: allow its host-to-device transfers
    internal.setup = lambda **kwargs: setup(**{**kwargs, "transfer_guard": False})
    configs = yaml.YAML(typ="safe").load((source / "dreamerv3" / "configs.yaml").read_text())
    config = elements.Config(configs["defaults"]).update(configs["dmc_proprio"])
    flags = FLAGS.replace("--replay_context 0", "--replay_context 1")
    config = elements.Flags(config).parse(flags.split())
    spaces = {k: elements.Space(np.float32, s) for k, s in case["obs"].items()}
    spaces |= {"reward": elements.Space(np.float32), "is_first": elements.Space(bool),
               "is_last": elements.Space(bool), "is_terminal": elements.Space(bool)}
    act = {"action": elements.Space(np.float32, (case["action"][1],), -1, 1)}
    agent = Agent(spaces, act, elements.Config(
        **config.agent, logdir=config.logdir, seed=config.seed, jax=config.jax, batch_size=config.batch_size,
        batch_length=config.batch_length, replay_context=config.replay_context, report_length=config.report_length,
        replica=config.replica, replicas=config.replicas))
    streams = make_stream(case, np.random.default_rng(SEED))
    length = config.batch_length + config.replay_context
    replay = Replay(length, chunksize=1024)
    for t in range(REPLAY_STEPS):
        for env, steps in enumerate(streams):
            replay.add(steps[t], worker=env)
    chunks = {env: replay.current[env][0] for env in range(2)}  # one chunk per env (1024 > REPLAY_STEPS)
    seqs = [replay._getseq(chunks[env], start, concat=False) for env, start in REPLAY_WINDOWS]
    data = replay._annotate_batch(replay._assemble_batch(seqs, 0, length), [False] * len(seqs), True)
    data["consec"] = np.zeros(data["is_first"].shape, np.int32)  # the first chunk of each window (consec_train 1)
    carry = agent.init_train(len(seqs))[:3]  # (enc, dyn, dec) carries: what _apply_replay_context unpacks with the
    carry = (*carry, {"action": np.zeros((len(seqs), case["action"][1]), np.float32)})  # previous action
    window = {k: jax.numpy.asarray(v) for k, v in data.items()}
    carry, obs, prevact, _ = agent.model._apply_replay_context(carry, window)
    files = {f"stream{env}/{k}": np.stack([s[k] for s in steps]) for env, steps in enumerate(streams)
             for k in steps[0]}
    files["windows"] = np.asarray(REPLAY_WINDOWS, np.int64)
    files |= {f"window/{k}": np.asarray(v) for k, v in data.items() if k != "stepid"}
    files |= {f"carry/{k}": np.asarray(v) for k, v in carry[1].items()}  # the dynamics' carry (enc/dec: none)
    files |= {f"obs/{k}": np.asarray(v) for k, v in obs.items()}
    files |= {f"prevact/{k}": np.asarray(v) for k, v in prevact.items()}
    return files, flags, 0


def make_2025(source: Path, case: dict, checkpoint: Path | None = None) -> tuple[dict[str, np.ndarray], str, int]:
    """The goldens of the current official code (e3f0224): ``(files, flags, draws in update 2)``."""
    sys.path[:0] = [str(source), str(source / "dreamerv3")]
    import elements
    import jax
    import optax
    import ruamel.yaml as yaml
    import embodied.jax.internal as internal
    import embodied.jax.outs as outs
    from dreamerv3.agent import Agent

    configs = yaml.YAML(typ="safe").load((source / "dreamerv3" / "configs.yaml").read_text())
    config = elements.Config(configs["defaults"])
    for name in case["configs"][1:]:
        config = config.update(configs[name])
    config = elements.Flags(config).parse(FLAGS.split())

    draws: list[dict[str, np.ndarray]] = []
    grads: list[dict[str, np.ndarray]] = []

    def record(kind: str, **arrays) -> None:
        draws.append({"kind": np.array(kind), **{k: np.asarray(v) for k, v in arrays.items()}})

    # Each draw passes through an identity jax.pure_callback that records it. Unlike a debug callback, a pure
    # callback whose result is unused is removed with the rest of the unused computation, so only the draws the
    # update really uses are recorded (the official code also traces samples it discards). The callback's inputs
    # carry no gradient (the draw's noise and index depend on the random key only; the logits, mean and std are
    # stop-gradient copies), so autodiff never needs its derivative.
    categorical_sample = outs.Categorical.sample
    sg = jax.lax.stop_gradient

    def categorical(self, seed, shape=()):
        index = categorical_sample(self, seed, shape)

        def keep(logits, ix):
            record("categorical", logits=logits, index=ix)
            return np.asarray(ix, index.dtype)
        return jax.pure_callback(keep, jax.ShapeDtypeStruct(index.shape, index.dtype), sg(self.logits), index)

    def normal(self, seed, shape=()):  # official Normal.sample: mean + stddev * N(0, 1) noise
        eps = jax.random.normal(seed, shape + self.mean.shape, jax.numpy.float32)

        def keep(mean, std, noise):
            record("normal", mean=mean, std=std, eps=noise)
            return np.asarray(noise, np.float32)
        eps = jax.pure_callback(keep, jax.ShapeDtypeStruct(eps.shape, eps.dtype), sg(self.mean), sg(self.stddev), eps)
        return eps * self.stddev + self.mean

    outs.Categorical.sample, outs.Normal.sample = categorical, normal

    make_opt = Agent._make_opt

    def recording_opt(self, **kwargs):
        def update(updates, state, params=None):
            jax.debug.callback(lambda g: grads.append(jax.tree.map(np.asarray, g)), updates, ordered=True)
            return updates, state
        return optax.chain(optax.GradientTransformation(lambda params: optax.EmptyState(), update),
                           make_opt(self, **kwargs))

    Agent._make_opt = recording_opt
    setup = internal.setup  # the debug callbacks' ordering token needs host-to-device transfers: allow them
    internal.setup = lambda **kwargs: setup(**{**kwargs, "transfer_guard": False})

    spaces = {k: elements.Space(np.uint8 if len(s) == 3 else np.float32, s) for k, s in case["obs"].items()}
    spaces |= {"reward": elements.Space(np.float32), "is_first": elements.Space(bool),
               "is_last": elements.Space(bool), "is_terminal": elements.Space(bool)}
    kind, dim = case["action"]
    act = ({"action": elements.Space(np.float32, (dim,), -1, 1)} if kind == "continuous"
           else {"action": elements.Space(np.int32, (), 0, dim)})
    agent = Agent(spaces, act, elements.Config(
        **config.agent, logdir=config.logdir, seed=config.seed, jax=config.jax, batch_size=config.batch_size,
        batch_length=config.batch_length, replay_context=config.replay_context, report_length=config.report_length,
        replica=config.replica, replicas=config.replicas))
    jax.effects_barrier()

    model_keys = [k for k in agent.params if not k.startswith("opt/")]
    # the return normaliser and counters stay as the official code made them
    moved = perturb({k: agent.params[k] for k in model_keys
                     if not (k.startswith("retnorm/") or k.endswith("_count/value"))})
    for key, value in moved.items():
        agent.params[key] = jax.device_put(value, agent.params[key].sharding)
    files: dict[str, np.ndarray] = {f"init/{k}": np.asarray(agent.params[k]) for k in model_keys}
    batch = make_batch(case, np.random.default_rng(SEED))
    files |= {f"batch/{k}": v for k, v in batch.items()}
    carry = agent.init_train(B)
    metrics = []
    for update in (1, 2):
        draws.clear()
        grads.clear()
        data = {k: v.copy() for k, v in batch.items()}
        data["seed"] = np.array([SEED, update], np.uint32)
        carry, _, _ = agent.train(carry, data)
        jax.effects_barrier()
        if len(grads) != 1:
            raise RuntimeError(f"update {update}: recorded {len(grads)} gradients, expected 1")
        files |= {f"grad{update}/{k}": v for k, v in grads[0].items()}
        files |= {f"param{update}/{k}": np.asarray(agent.params[k]) for k in model_keys}
        for i, draw in enumerate(draws):
            files |= {f"draw{update}/{i:03d}/{k}": v for k, v in draw.items()}
        metrics.append(agent._take_outs(agent.pending_mets))
    for update, mets in enumerate(metrics, 1):
        files |= {f"metric{update}/{k}": np.asarray(v) for k, v in mets.items() if np.asarray(v).size == 1}
    if checkpoint is not None:  # the official checkpoint code: <dir>/ckpt/<stamp>/agent.pkl and ckpt/latest
        saver = elements.Checkpoint(checkpoint / "ckpt")
        saver.agent = agent
        saver.save()
    return files, FLAGS, len(draws)


if __name__ == "__main__":
    main()
