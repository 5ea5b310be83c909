"""How much bf16 rounding moves a two-hot critic's value, and where it comes from (issue 41; docs/dreamerv3.md,
"bf16 and the two-hot heads").

    .venv/bin/python bench/two_hot_bf16.py RUN_DIR CHECKPOINT.pt

Loads the run's agent from the checkpoint and its saved replay (``CHECKPOINT.replay``), samples one 16 x 64 batch
(seed 0), computes the posteriors and one imagined rollout in float32, and then evaluates the critic on those
imagined features four ways, each against the all-float32 value: hidden layers in bf16 (as under autocast) with the
255-bin output layer in bf16 or float32, and the expectation ``softmax(logits) @ bins`` under bf16 autocast or in
float32. Prints the value's mean and the error's standard deviation for each, and the spread of the advantages
``R - v`` the actor sees, so the error can be read in their units.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from reverie.agents.returns import lambda_return
from reverie.models.distributions import TwoHotSymlog
from reverie.replay.buffer import Replay
from reverie.state.saved_run import load_run


def bf16_mean(logits: torch.Tensor) -> torch.Tensor:
    """The expectation as it was computed under bf16 autocast before the fix (the product in bf16)."""
    d = TwoHotSymlog(logits.float())
    m = d.bins.shape[-1] // 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        diff = d.probs[..., m + 1:] - d.probs[..., :m].flip(-1)
        return d._unsquash(diff @ d.bins[m + 1:]).float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(1)
    agent = load_run(args.run, checkpoint=args.checkpoint).agent
    folder = args.checkpoint.replace(".pt", ".replay")
    meta = json.load(open(f"{folder}/replay.json"))
    spec = {k: (tuple(s), np.dtype(d)) for k, (s, d) in meta["spec"].items()}
    replay = Replay(meta["length"] * meta["num_envs"], meta["num_envs"], spec, seed=0)
    replay.load(folder)
    torch.manual_seed(0)
    data = agent._inputs(replay.sample(16, 64))
    with torch.no_grad():
        _, post, _, _ = agent.wm.loss(data)
        start, start_cont = agent._posterior_starts(post, data)
        dynamics, estimator = agent.wm.dynamics, agent._estimator()
        states, _ = dynamics.imagine(lambda s: estimator.act(dynamics.features(s)), start, agent.horizon)
        feat = dynamics.features(states).float()  # (H+1, N, F)
        critic = agent.critic
        exact = TwoHotSymlog(critic(feat)).mean  # all float32 (no autocast here)
        reward = torch.cat([torch.zeros_like(start_cont)[None], agent.wm.reward(feat[1:]).mean])
        cont = torch.cat([start_cont[None], agent.wm.cont(feat[1:]).mean])
        advantage = lambda_return(reward, exact, cont, agent.gamma, agent.lam) - exact[:-1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = critic.hidden(feat)
            logits_bf16 = critic.out(hidden)
        logits_f32 = critic.out(hidden.float())
    print(f"{args.checkpoint}: value mean {exact.mean():.2f}, advantage (R - v) std {advantage.std():.4f}")
    print("| output layer | expectation | value error (std) | in advantage std |\n|---|---|---|---|")
    for layer, logits in (("bf16", logits_bf16), ("float32", logits_f32)):
        for where, value in (("bf16", bf16_mean(logits)), ("float32", TwoHotSymlog(logits.float()).mean)):
            err = float((value - exact).std())
            print(f"| {layer} | {where} | {err:.4f} | {err / float(advantage.std()):.3f} |")


if __name__ == "__main__":
    main()
