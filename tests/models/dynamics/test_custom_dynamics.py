"""A third dynamics, defined here and nowhere in reverie, trains through the normal CLI/config path: the
:class:`reverie.models.dynamics.Dynamics` protocol is all the world model, DreamerV3, the loop and the viz use."""

from __future__ import annotations

import json

import numpy as np
import torch
from torch import nn

from reverie.cli import main
from reverie.models.distributions import one_hot_index, unimix_sample
from reverie.models.dynamics import kl_losses, rollout
from reverie.models.dynamics.base import reset
from reverie.state.saved_run import load_run


class MLPDynamics(nn.Module):
    """No recurrent state: ``h_t = silu(W [z_{t-1}, a_t])`` from the previous latent alone, categorical latents
    ``z_t`` (``S x K``, unimix) from ``h_t`` (prior) or ``[h_t, e_t]`` (posterior); features ``cat(h, z)``; the
    DreamerV3 KL losses (``dyn``, ``rep``)."""

    loss_keys = ("dyn", "rep")

    def __init__(self, action_dim: int, embed_dim: int, stoch: int = 4, classes: int = 4, units: int = 16,
                 free_nats: float = 1.0, unimix: float = 0.01):
        super().__init__()
        self.stoch, self.classes, self.units, self.free_nats, self.unimix = stoch, classes, units, free_nats, unimix
        self.feat_dim = units + stoch * classes
        self.transition = nn.Sequential(nn.Linear(stoch * classes + action_dim, units), nn.SiLU())
        self.prior = nn.Linear(units, stoch * classes)
        self.posterior = nn.Linear(units + embed_dim, stoch * classes)

    def initial(self, batch: int) -> dict[str, torch.Tensor]:
        zeros = self.prior.weight.new_zeros(batch, self.stoch, self.classes)
        return {"hidden": self.prior.weight.new_zeros(batch, self.units), "stoch": zeros, "logits": zeros}

    def _latent(self, hidden: torch.Tensor, logits: torch.Tensor, sample: bool) -> dict[str, torch.Tensor]:
        logits = logits.unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)
        stoch = unimix_sample(logits, self.unimix) if sample else one_hot_index(logits.argmax(-1), self.classes)
        return {"hidden": hidden, "stoch": stoch, "logits": logits}

    def img_step(self, state, action, sample=True):
        hidden = self.transition(torch.cat([state["stoch"].flatten(-2), action], -1))
        return self._latent(hidden, self.prior(hidden), sample)

    def observe(self, embed, prev_action, is_first, state=None, sample=True):
        init = self.initial(is_first.shape[1])
        state = init if state is None else state
        first = is_first.to(embed.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
        posts, priors = [], []
        for t in range(is_first.shape[0]):
            state = reset(state, init, first[t])
            hidden = self.transition(torch.cat([state["stoch"].flatten(-2), prev_action[t] * (1 - first[t])], -1))
            priors.append(self._latent(hidden, self.prior(hidden), sample))
            state = self._latent(hidden, self.posterior(torch.cat([hidden, embed[t]], -1)), sample)
            posts.append(state)
        stack = lambda states: {k: torch.stack([s[k] for s in states]) for k in states[0]}  # noqa: E731
        return stack(posts), stack(priors)  # T x (B, ...) -> (T, B, ...)

    def imagine(self, policy, start, horizon):
        return rollout(self.img_step, policy, start, horizon)

    def features(self, state):
        return torch.cat([state["hidden"], state["stoch"].flatten(-2)], -1)  # (..., U + S*K)

    def loss(self, post, prior, prev_action, is_first):
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {"kl": kl["kl"].mean()}


def test_a_dynamics_defined_in_a_test_file_trains_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    target = f"{__name__}.MLPDynamics"  # this module, imported by pytest under its file name
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.report_every=10", "~agent.module.dynamics",
                 f"+agent.module.dynamics={{_target_: {target}, _partial_: true, units: 16}}"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["updates"] > 0 and any("eval/return_mean" in r for r in rows)
    losses = [r for r in rows if "loss/dyn" in r]
    assert losses and all(np.isfinite(r["loss/model"]) and r["loss/dyn"] >= 1.0 for r in losses)  # free bits
    assert list((run_dir / "plots").glob("openloop_reward_*.png"))  # the open-loop report ran on it too
    run = load_run(run_dir)
    assert type(run.agent.wm.dynamics).__name__ == "MLPDynamics" and run.agent.wm.dynamics.units == 16
    assert run.config["agent"]["module"]["dynamics"]["_target_"] == target
