"""``agent.module.actor_grad_disc``: how the 2023 DreamerV3 trains a discrete actor (danijar/dreamerv3 8fa35f8,
``configs.yaml:84`` ``actor_grad_disc: reinforce``; ``agent.py`` ``ImagActorCritic.loss``: ``{'backprop': -adv,
'reinforce': -logpi * sg(adv)}[self.grad]``). ``backprop`` sends the return's gradient through the imagined
dynamics into the actor by straight-through one-hot samples (the reference's ``OneHotDist.sample``), as for
continuous actions; ``reinforce`` (the default) weights ``log pi`` by the detached advantage."""

import copy

import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.configs.compose import load_config
from reverie.types import ActionSpec

from helpers.actor_grads import reference_actor_grads
from helpers.agents import dreamer, vector_batch

TINY = dreamer(deter=16, units=16, horizon=3)


def trained_agent(actor_grad_disc):
    """A tiny discrete agent after one update, its critic and reward head moved off their zero-initialised outputs
    (values that vary by state), and imagination starts from the posterior of another batch."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 3), **TINY, actor_grad_disc=actor_grad_disc)
    agent.update(vector_batch(A=3))
    with torch.no_grad():
        for p in [*agent.critic.parameters(), *agent.wm.reward_head.parameters()]:
            p.add_(0.3 * torch.randn_like(p))
    data = agent._update_inputs(vector_batch(A=3, seed=5))
    with torch.no_grad():
        post = agent.wm.loss(data).post
    start = {k: v.flatten(0, 1) for k, v in post.items()}  # (T, B, ...) -> (T*B, ...)
    return agent, start, torch.ones(start["deter"].shape[0])


def behaviour_actor_grads(agent, start, start_cont):
    """The actor's gradient of one ``_behavior`` call (read at the optimiser step, which is then skipped)."""
    got = {}
    agent.actor_opt.step = lambda *a, **k: got.setdefault("grads", [p.grad.clone() for p in agent.actor.parameters()])
    agent._behavior(start, start_cont)
    return got["grads"]


def test_backprop_actor_gradient_is_the_reference_through_straight_through_actions():
    agent, start, start_cont = trained_agent("backprop")
    rng, norm = torch.get_rng_state(), copy.deepcopy(agent.retnorm.state_dict())
    expected = reference_actor_grads(agent, start, start_cont)
    torch.set_rng_state(rng)
    agent.retnorm.load_state_dict(norm)
    got = behaviour_actor_grads(agent, start, start_cont)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)
    assert sum(float(e.norm()) for e in expected) > 1e-3  # the returns' gradient does reach the actor

    # the same agent, the same draws, by REINFORCE (the default): another gradient
    torch.set_rng_state(rng)
    agent.retnorm.load_state_dict(norm)
    agent.estimator = "reinforce"  # the estimator is chosen at construction: switch it here
    reinforce = behaviour_actor_grads(agent, start, start_cont)
    diff = sum(float((e - r).norm()) for e, r in zip(expected, reinforce))
    assert diff > 0.1 * sum(float(e.norm()) for e in expected)


def test_backprop_imagines_with_autograd_and_one_hot_actions():
    """The rollout records autograd (its actions carry the probabilities' gradient) and the actions are exactly
    one-hot in value; with REINFORCE the rollout runs without autograd."""
    for mode, grad in (("backprop", True), ("reinforce", False)):
        agent, start, start_cont = trained_agent(mode)
        rssm, rolled = agent.wm.dynamics, {}
        imagine = rssm.imagine
        rssm.imagine = lambda *a, **k: rolled.setdefault("out", imagine(*a, **k))
        agent._behavior(start, start_cont)
        actions = rolled["out"][1]  # (H+1, N, A)
        assert actions.requires_grad == grad, mode
        assert torch.equal(actions.detach().sum(-1), torch.ones(actions.shape[:-1]))
        assert set(actions.detach().unique().tolist()) == {0.0, 1.0}


def test_actor_grad_disc_refuses_an_unknown_choice_before_building():
    with pytest.raises(ValueError, match="actor_grad_disc must be one of \\('reinforce', 'backprop'\\)"):
        DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **TINY, actor_grad_disc="dynamics")


def test_the_agents_default_is_the_references_reinforce():
    assert load_config(["exp=reference"]).agent.module.actor_grad_disc == "reinforce"
    assert load_config(["agent.module.actor_grad_disc=backprop"]).agent.module.actor_grad_disc == "backprop"
