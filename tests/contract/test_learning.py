"""Learning checks: real runs of `reverie train` (the CLI entry users run) with thresholds.

Default suite (`make test`): four checks, each a run from ``exp=debug`` (one thread) on ``IdentityEnv``
(``reverie.envs.testing``: reward for repeating the target shown in the previous observation, 10-step episodes,
an evaluation of 10 episodes every 50 env steps), judged by :func:`learned`: the MEAN of the last
``LAST`` evaluations must reach the check's threshold (the best single evaluation is not enough). Each check has
a counter-check that breaks learning in one way and asserts that the same judgement then fails.

Measured on this project's 2-core CPU shared with other runs (load 10-20, so CPU seconds are inflated; the
previous 2-action check took 42 s here against its documented 28 s), mean of the last 3 evaluations, seeds 0 / 1
/ 2 (the test runs seed 0); "untrained" is the first evaluation (step 50, before the first update):

- dreamerv3-discrete (4 actions, 450 steps, threshold 6.0; random 2.5, untrained 2.7 / 1.1 / 3.2): 8.40 / 6.90 /
  8.97 (seed 1 learns at 400 steps: 2.9, 8.6, 9.2); 49-53 CPU s. Actor learning rate 0 (``actor_lr=0``): 2.47 /
  2.93 / 2.43.
- dreamerv3-continuous (400 steps, threshold 8.3; random 6.67, an action of 0 7.5, untrained 7.71 / 7.06 / 7.14):
  8.65 / 8.87 / 8.52; 48-59 CPU s (seed 2 learns at 300 steps: 5.15 at 250, 8.6 at 300 and 350, so a 350-step
  run fails there with 7.46; hence 400 steps). Reward head cut off from the world-model loss
  (``loss_scales.reward=0``): 5.47 / 6.38 / 6.39 (falling from the untrained values).
- dreamerv3_2025-discrete (4 actions, 450 steps, threshold 6.0; random 2.5, untrained 2.8 / 2.6 / 2.5): 9.17 /
  8.87 / 8.77 (learning shows at 350 / 300 / 250 steps); 71-73 CPU s. Policy loss cut off
  (``loss_scales.policy=0``): 2.80 / 2.77 / 2.80.
- planet-discrete (4 actions, 400 steps, threshold 7.0; random 2.5, untrained 2.8 / 2.2 / 2.5): 9.23 / 9.27 / 8.87;
  21-22 CPU s. Reward loss at 0 (``reward_scale=0``): 2.87 / 2.77 / 2.67.

Slow checks (``make test-slow``) train the default presets on CartPole (judged on its last evaluations, with a
counter-check: the preset's values before its CartPole change do not keep the solve; ~45 min each) and Pendulum,
and ``exp=dmc_cpu`` on DMC proprio cartpole_swingup (30k frames, ~18 min).
"""

from dataclasses import dataclass

import json

import pytest

from reverie.cli import main
from helpers.runs import read_jsonl

LAST = 3  # evaluations averaged by the judgement: the last 100 env steps of the run

# IdentityEnv, one env, 10 evaluation episodes every 50 env steps; no early stop (the judgement reads the end)
IDENTITY = ["exp=debug", "env=gym", "env.id=reverie.envs.testing.IdentityEnv", "+env.kwargs.length=10",
            "env.num_envs=1", "train.checkpoint_every=0", "train.eval_episodes=10", "train.eval_every=50", "seed=0"]
# DreamerV3 (both agents): batch 16 x 8, 2 updates per env step after 100 random steps, faster learning rates
DREAMER = ["train.prefill=100", "agent.batch_size=16", "agent.train_ratio=256"]
DREAMER_2023_LR = ["agent.module.model_lr=3e-3", "agent.module.actor_lr=1e-3", "agent.module.critic_lr=1e-3"]


@dataclass(frozen=True)
class Check:
    args: tuple[str, ...]  # overrides after IDENTITY
    threshold: float  # mean of the last LAST evaluation returns (10 episodes each) that passes
    broken: str  # one override that breaks learning: the counter-check


CHECKS = {
    # 4 actions: random 2.5, best 10
    "dreamerv3-discrete": Check(
        ("+env.kwargs.n=4", *DREAMER, *DREAMER_2023_LR, "train.steps=450"), 6.0,
        "agent.module.actor_lr=0"),
    # a continuous target in [-1, 1], reward 1 - |action - target| / 2: random 6.67, always 0: 7.5, best 10
    "dreamerv3-continuous": Check(
        ("+env.kwargs.discrete=false", *DREAMER, *DREAMER_2023_LR, "train.steps=400"), 8.3,
        "agent.module.loss_scales.reward=0"),
    # the current official DreamerV3 with one-layer MLPs, LaProp at 3e-3 without warmup
    "dreamerv3_2025-discrete": Check(
        ("+env.kwargs.n=4", "agent=dreamerv3_2025", *DREAMER, "agent.module.lr=3e-3", "agent.module.warmup=0",
         "agent.module.enc_layers=1", "agent.module.dec_layers=1", "agent.module.actor_layers=1",
         "agent.module.critic_layers=1", "train.steps=450"), 6.0,
        "agent.module.loss_scales.policy=0"),
    # PlaNet's CEM (categorical) over its model: 20 updates per collected episode after 50 random steps
    "planet-discrete": Check(
        ("+env.kwargs.n=4", "agent=planet", "train.prefill=50", "agent.train_steps=20", "agent.module.model_lr=3e-3",
         "train.steps=400"), 7.0,
        "agent.module.reward_scale=0"),
}


def eval_returns(run_dir):
    return [(r["step"], r["eval/return_mean"]) for r in read_jsonl(run_dir / "metrics.jsonl")
            if "eval/return_mean" in r]


def learned(returns: list[tuple[int, float]], threshold: float, last: int = LAST) -> bool:
    """The judgement of every learning check: the mean of the last ``last`` evaluation returns is at least
    ``threshold``. ``returns``: ``(env step, mean eval return)`` in the order logged.

    Raises:
        ValueError: fewer than ``last`` evaluations (the run was cut short: nothing to judge).
    """
    if len(returns) < last:
        raise ValueError(f"{len(returns)} evaluations, the judgement needs the last {last}")
    return sum(ret for _, ret in returns[-last:]) / last >= threshold


def run_check(tmp_path, check: Check, *extra: str) -> list[tuple[int, float]]:
    run_dir = tmp_path / "run"
    assert main(["train", f"run_dir={run_dir}", *IDENTITY, *check.args, *extra]) == 0
    return eval_returns(run_dir)


def test_learned_reads_the_mean_of_the_last_evaluations():
    assert learned([(50, 2.0), (100, 9.0), (150, 9.0), (200, 9.0)], 9.0)
    # a lucky best evaluation, then a fall: the best is 10, the mean of the last 3 is 5
    assert not learned([(50, 2.0), (100, 10.0), (150, 9.0), (200, 4.0), (250, 2.0)], 9.0)
    assert not learned([(50, 8.9), (100, 9.0), (150, 9.0)], 9.0)  # mean 8.967
    with pytest.raises(ValueError, match="2 evaluations, the judgement needs the last 3"):
        learned([(50, 9.0), (100, 9.0)], 9.0)


@pytest.mark.parametrize("name", CHECKS)
def test_learning_check(tmp_path, name):
    check = CHECKS[name]
    returns = run_check(tmp_path, check)
    assert learned(returns, check.threshold), returns


@pytest.mark.parametrize("name", CHECKS)
def test_broken_learning_fails_the_check(tmp_path, name):
    """The threshold is not reached by chance: with learning broken in one way, the same judgement fails."""
    check = CHECKS[name]
    returns = run_check(tmp_path, check, check.broken)
    assert not learned(returns, check.threshold), returns


# What exp=classic changed to keep CartPole solved (agent_exp/dreamerv3_classic.yaml), and the values before it
CARTPOLE_FIX_REMOVED = ["agent.module.actor_lr=1e-4", "agent.module.critic_lr=1e-4", "agent.module.imag_cont=mode"]


def cartpole_run(tmp_path, *extra: str) -> list[tuple[int, float]]:
    """`make train`'s default run (CartPole-v1, exp=classic, 30k env steps, seed 0) on one thread, as measured, with
    ``extra`` overrides."""
    run_dir = tmp_path / "cartpole"
    assert main(["train", f"run_dir={run_dir}", "seed=0", "threads=1", "train.progress=false", "train.video=false",
                 "train.stop_return=null", "train.eval_every=2500", *extra]) == 0  # all 30k steps, as measured
    return eval_returns(run_dir)


def default_run(tmp_path, name, *extra: str) -> dict:
    """`make train`'s run as it is (CartPole-v1, exp=classic, its stop rule), seed 0; its summary and confirmation."""
    run_dir = tmp_path / name
    assert main(["train", f"run_dir={run_dir}", "seed=0", "train.progress=false", "train.video=false", *extra]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary["confirmed"] = [r["eval/confirm_return_mean"] for r in rows if "eval/confirm_return_mean" in r]
    return summary


@pytest.mark.slow
def test_make_train_stops_with_cartpole_solved(tmp_path):
    """Issue 41: `make train`'s run stops once CartPole-v1 is solved as Gymnasium defines it: an evaluation of 475 or
    more confirmed by a mean of 475 or more over 100 more episodes. Measured (Intel Xeon, AMX, bf16, two threads,
    nothing else running): seeds 0 / 1 solved at 5,000 / 6,000 env steps in 4.0 / 4.2 min, every confirmation
    episode 500 (docs/dreamerv3.md). The counter-check: with the actor's learning rate at 0 the policy never
    learns, no evaluation reaches 475, and the run goes to its (shortened) end."""
    solved = default_run(tmp_path, "solved")
    assert solved["stopped_by"] == "stop_return" and solved["confirmed"][-1] >= 475.0, solved
    frozen = default_run(tmp_path, "frozen", "agent.module.actor_lr=0", "train.steps=6000")
    assert frozen["stopped_by"] is None and frozen["env_steps"] == 6000 and not frozen["confirmed"], frozen


@pytest.mark.slow
def test_dreamerv3_keeps_cartpole_solved(tmp_path):
    """`make train`'s default run, all 30k env steps: the mean of its last 3 evaluations (10 episodes each, at 25k,
    27.5k and 30k env steps) must reach 475, README's "solved". A random policy scores ~22, the first evaluation
    (2.5k env steps) 9-12.
    Measured (one thread, AMD EPYC, bf16, 42-44 min each), last 3 evaluations: seed 0 500 / 496 / 500 (mean 498.7),
    seed 1 500 / 500 / 496 (498.7), seed 2 486 / 478 / 491 (485.0); the curves are in docs/dreamerv3.md. The runs
    are exact per machine, not across machines (bf16 and float sums differ by CPU): seed 2's margin of 10 says a
    seed can end near the threshold."""
    returns = cartpole_run(tmp_path)
    assert learned(returns, 475.0), returns


@pytest.mark.slow
def test_cartpole_without_the_fix_does_not_keep_it(tmp_path):
    """The counter-check: the same run with exp=classic's earlier actor and critic learning rates (1e-4 each) and
    the imagined continue read as its mode learns (far above a random policy's ~22) but does not keep CartPole
    solved. Measured, seed 0, evaluations at 2.5k / 5k / ... / 30k env steps (docs/dreamerv3.md):
    - AMD EPYC (Zen 4, bf16), one thread, this tree: 10 / 104 / 204 / 144 / 169 / 146 / 163 / 347 / 231 / 229 /
      211 / 443, best 443, last 3 mean 294.3 (43.4 min);
    - Intel Xeon (Sapphire Rapids, bf16), the tree before the dynamics-protocol merge: best 487, last 3 201 / 487 /
      211 (mean 300).
    Runs are exact per machine, not across machines; the "it learns" bar (300) sits below both bests."""
    returns = cartpole_run(tmp_path, *CARTPOLE_FIX_REMOVED)
    assert max(ret for _, ret in returns) >= 300.0, returns  # it learns: far above random (~22) at some point
    assert not learned(returns, 475.0), returns  # and does not keep CartPole solved


@pytest.mark.slow
def test_dreamerv3_learns_pendulum(tmp_path):
    run_dir = tmp_path / "pendulum"
    assert main(["train", "env=pendulum", f"run_dir={run_dir}", "train.steps=30000", "train.progress=false",
                 "train.video=false", "train.stop_return=-250"]) == 0
    best = max(ret for _, ret in eval_returns(run_dir))
    assert best >= -250.0


@pytest.mark.slow
def test_planet_learns_pendulum(tmp_path):
    """Issue 4's check: `reverie train agent=planet env=pendulum` reaches an eval return >= -300 (measured with the
    reference's networks: -178 at 1,500 agent steps, 6.4 min of CPU time; docs/planet.md)."""
    run_dir = tmp_path / "planet"
    assert main(["train", "agent=planet", "env=pendulum", f"run_dir={run_dir}", "train.steps=3000",
                 "train.progress=false", "train.video=false", "train.report_every=0", "train.stop_return=-300"]) == 0
    best = max(ret for _, ret in eval_returns(run_dir))
    assert best >= -300.0


# The official DreamerV3 (2023) on DMC proprio cartpole_swingup at 30k frames: the mean of its 5 seeds
# (291.9 / 259.2 / 293.1 / 197.5 / 261.3) in the official score file dmcproprio_dreamerv3 (the one
# `reverie compare` reads); its curve is sampled every 10k frames (62.8 at 10k, 189.0 at 20k).
OFFICIAL_SWINGUP_30K = 260.6


@pytest.mark.slow
def test_dreamerv3_dmc_cpu_cartpole_swingup(tmp_path):
    """`exp=dmc_cpu` on DMC proprio cartpole_swingup, seed 0, for 30k env frames (15,000 agent steps at action
    repeat 2; about 18 minutes on one core of this project's CPU), judged like the fast checks: the mean of the
    last 2 evaluations (25k and 30k frames) must reach half the official curve at 30k frames (0.5 x 260.6 =
    130.3). Measured with the same command (docs/dreamerv3.md), mean eval returns at 5k..30k frames:
    75 / 123 / 139 / 186 / 178 / 208 (seed 0: last 2 -> 193.0), 76 / 130 / 130 / 142 / 133 / 140 (seed 1: 136.5).
    The first evaluation (75-76, before learning shows) stays 54 below. The preset does half the reference's updates
    per frame, each with a sixteenth of its imagination, at a smaller size (docs/dreamerv3.md), so the official
    curve itself (260.6; seed 0 reached 208 at 30k, seed 1 140) is not reachable on this machine. Not rerun for
    this threshold (a 30k-frame run takes ~18 min of a core): the numbers are the documented runs'."""
    pytest.importorskip("dm_control")
    run_dir = tmp_path / "swingup"
    assert main(["train", "exp=dmc_cpu", "env.task=cartpole_swingup", "seed=0", "train.steps=15000",
                 f"run_dir={run_dir}", "train.progress=false", "train.video=false"]) == 0
    returns = eval_returns(run_dir)
    assert len(returns) == 6 and learned(returns, 0.5 * OFFICIAL_SWINGUP_30K, last=2), returns
