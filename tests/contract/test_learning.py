"""Learning checks: real runs with thresholds.

The fast check runs in the default suite: DreamerV3 and PlaNet, each from ``exp=debug``, must solve
``IdentityEnv`` (``reverie.envs.testing``: reward 1 for repeating the target shown in the observation, 2 actions,
10-step episodes, so a random policy returns 5 and the best policy 10): a mean evaluation return of at
least 9 (10 episodes) within a few hundred env steps. Measured on this project's CPU (one core, seeds 0 / 1 / 2):
DreamerV3 reached it at 300 / 250 / 350 env steps, in 28 / 20 / 33 CPU seconds; PlaNet at 150 agent steps in 8-9
CPU seconds. With learning broken the best evaluation stayed far below: 7.0 with DreamerV3's actor learning rate
0 (its untrained actor maps the targets to actions by chance), 5.4 with PlaNet's model learning rate 0
(``test_broken_learning_fails_the_fast_check``, slow). The slow checks (``make test-slow``) also train the
default presets on CartPole and Pendulum, and `exp=dmc_cpu` on DMC proprio cartpole_swingup (30k frames, ~18 min).
"""

import json

import pytest

from reverie.cli import main

# IdentityEnv, one env, an evaluation every 50 env steps; the run stops once it is solved
IDENTITY = ["exp=debug", "env=gym", "env.id=reverie.envs.testing.IdentityEnv", "+env.kwargs.n=2",
            "+env.kwargs.length=10", "env.num_envs=1", "train.checkpoint_every=0", "train.eval_episodes=10",
            "train.eval_every=50", "train.stop_return=9", "seed=0"]
# exp=debug with faster learning rates, so that a few hundred updates suffice
FAST = {"dreamerv3": ["train.prefill=100", "train.steps=500", "agent.train_ratio=64", "agent.module.model_lr=3e-3",
                      "agent.module.actor_lr=1e-3", "agent.module.critic_lr=1e-3"],
        "planet": ["agent=planet", "train.prefill=50", "train.steps=300", "agent.train_steps=20",
                   "agent.module.model_lr=3e-3"]}
SOLVED = 9.0  # a random policy: 5 (the mean of 10 episodes: 5 +- 0.5)


def eval_returns(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/return_mean"]) for r in rows if "eval/return_mean" in r]


@pytest.mark.parametrize("agent", ["dreamerv3", "planet"])
def test_fast_learning_check(tmp_path, agent):
    run_dir = tmp_path / agent
    assert main(["train", f"run_dir={run_dir}", *IDENTITY, *FAST[agent]]) == 0
    returns = eval_returns(run_dir)
    assert max(ret for _, ret in returns) >= SOLVED, returns


@pytest.mark.slow
@pytest.mark.parametrize("agent, broken", [("dreamerv3", "agent.module.actor_lr=0"),
                                           ("planet", "agent.module.model_lr=0")])
def test_broken_learning_fails_the_fast_check(tmp_path, agent, broken):
    """The fast check's threshold is not reached by chance: with learning switched off it is not solved."""
    run_dir = tmp_path / agent
    assert main(["train", f"run_dir={run_dir}", *IDENTITY, *FAST[agent], broken]) == 0
    returns = eval_returns(run_dir)
    assert max(ret for _, ret in returns) < SOLVED, returns


@pytest.mark.slow
def test_dreamerv3_learns_cartpole(tmp_path):
    """`make train`'s default run, stopped once the mean eval return over 10 episodes reaches 475."""
    run_dir = tmp_path / "cartpole"
    assert main(["train", f"run_dir={run_dir}", "train.progress=false", "train.video=false",
                 "train.stop_return=475"]) == 0
    best = max(ret for _, ret in eval_returns(run_dir))
    assert best >= 475.0


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


@pytest.mark.slow
def test_dreamerv3_dmc_cpu_cartpole_swingup(tmp_path):
    """`exp=dmc_cpu` on DMC proprio cartpole_swingup, seed 0, for 30k env frames (15,000 agent steps at action
    repeat 2; about 18 minutes on one core of this project's CPU). Measured with the same command, mean eval
    returns at 5k..30k frames: 75 / 123 / 139 / 186 / 178 / 208 (seed 0), 76 / 130 / 130 / 142 / 133 / 140 (seed 1);
    the official DreamerV3 curve: 261 at 30k. 120 is above every first evaluation (75-76, before learning shows)
    and below the best of both seeds. The whole 100k-frame runs are in docs/dreamerv3.md."""
    pytest.importorskip("dm_control")
    run_dir = tmp_path / "swingup"
    assert main(["train", "exp=dmc_cpu", "env.task=cartpole_swingup", "seed=0", "train.steps=15000",
                 f"run_dir={run_dir}", "train.progress=false", "train.video=false"]) == 0
    returns = eval_returns(run_dir)
    assert len(returns) == 6 and max(ret for _, ret in returns) >= 120.0, returns
