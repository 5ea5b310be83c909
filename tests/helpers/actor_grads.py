"""The 2023 DreamerV3 reference's actor loss by dynamics backpropagation, written out step by step on dense features
(danijar/dreamerv3 8fa35f8 ``agent.py`` ``ImagActorCritic.loss`` with ``actor_grad_cont``/``actor_grad_disc:
backprop``), for tests that hold the agent's actor gradient against it."""

from __future__ import annotations

import torch

from reverie.agents.returns import imagination_weights, lambda_return
from reverie.models.distributions import TwoHotSymlog


def reference_actor_grads(agent, start, start_cont, detach_baseline=False):
    """Roll the prior from ``start`` ``(N, ...)`` with the actor's samples, lambda-returns through the reward head
    and critic, advantage ``(ret - value[:-1]) / scale`` (``base = value[:-1]`` keeps its gradient unless
    ``detach_baseline``), entropy bonus, weights; returns the gradient of that loss for the actor's parameters.

    Continuous actions: reparameterised samples (``dist.rsample()``). Discrete actions: the reference's
    straight-through ``OneHotDist.sample``, written out here: a one-hot draw ``x`` (``dist.sample()``, the same
    random draws as the agent's) plus ``p - sg(p)``, so the value is ``x`` and the gradient that of the unimix
    probabilities ``p``."""
    rssm, H = agent.wm.dynamics, agent.horizon
    state, feats, entropies = start, [], []
    for t in range(H + 1):
        feat = torch.cat([state["deter"], state["stoch"].flatten(-2)], -1)  # (N, D + S*K), dense
        feats.append(feat)
        dist = agent.actor(feat.detach())
        entropies.append(dist.entropy())
        if agent.spec.discrete:
            probs = dist.probs
            action = dist.sample() + (probs - probs.detach())
        else:
            action = dist.rsample()
        if t < H:
            state = rssm.img_step(state, action)
    feat = torch.stack(feats)  # (H+1, N, F)
    reward = torch.cat([torch.zeros_like(start_cont)[None], agent.wm.reward(feat[1:]).mean])
    cont = torch.cat([start_cont[None], agent.wm.cont(feat[1:]).mode])
    value = TwoHotSymlog(agent.critic(feat)).mean
    ret = lambda_return(reward, value, cont, agent.gamma, agent.lam)
    agent.retnorm.update(ret.detach())
    base = value[:-1].detach() if detach_baseline else value[:-1]
    adv = (ret - base) / agent.retnorm.scale()
    weight = imagination_weights(cont, agent.gamma)[:-1]
    loss = -(weight * (adv + agent.actor_entropy * torch.stack(entropies[:-1]))).mean()
    return torch.autograd.grad(loss, list(agent.actor.parameters()))
