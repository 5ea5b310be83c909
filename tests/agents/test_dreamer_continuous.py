"""Continuous control as in the 2023 DreamerV3 reference (danijar/dreamerv3 at 8fa35f8): actions scaled into [-1, 1]
before they enter the dynamics, the dynamics-backprop actor loss with the baseline's gradient, and every replay
window starting from the initial state with a zero previous action."""

import copy

import torch

from reverie.agents.dreamer import DreamerV3
from reverie.models.dynamics import CategoricalRSSM, scale_action
from reverie.types import ActionSpec

from helpers.agents import dreamer, vector_batch
from helpers.actor_grads import reference_actor_grads

TINY = dreamer(deter=16, units=16, horizon=3)


def test_scale_action_values_and_gradient():
    a = torch.tensor([-4.25, -1.0, 0.5, 2.0], requires_grad=True)
    out = scale_action(a, 1.0)
    torch.testing.assert_close(out, torch.tensor([-1.0, -1.0, 0.5, 1.0]), rtol=0, atol=0)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (out * w).sum().backward()
    # d/da of a * sg(1 / max(1, |a|)): the scale itself, 1 / 4.25 and 1 / 2 where |a| > 1 (a clamp would give 0)
    torch.testing.assert_close(a.grad, w * torch.tensor([1 / 4.25, 1.0, 1.0, 0.5]), rtol=1e-7, atol=0)
    assert scale_action(a, 0.0) is a


def test_img_step_sees_the_scaled_action():
    torch.manual_seed(0)
    rssm = CategoricalRSSM(action_dim=2, embed_dim=3, deter=8, stoch=2, classes=3, units=8)
    state = rssm.initial(4)
    inside = torch.tensor([[0.3, -1.0]] * 4)
    outside = torch.tensor([[0.3, -4.0]] * 4)  # scales to exactly the value of `inside`
    with torch.no_grad():
        a = rssm.img_step(state, inside, sample=False)
        b = rssm.img_step(state, outside, sample=False)
        c = CategoricalRSSM(action_dim=2, embed_dim=3, deter=8, stoch=2, classes=3, units=8, action_clip=0.0)
        c.load_state_dict(rssm.state_dict())
        unscaled = c.img_step(state, outside, sample=False)
    torch.testing.assert_close(a["deter"], b["deter"], rtol=0, atol=0)
    assert not torch.allclose(unscaled["deter"], a["deter"])


def test_imagined_actions_enter_the_dynamics_inside_the_unit_box():
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    rssm, seen, rolled = agent.wm.dynamics, [], {}
    hook = rssm.in_a.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().abs().max()))
    imagine = rssm.imagine
    rssm.imagine = lambda *a, **k: rolled.setdefault("out", imagine(*a, **k))
    agent.update(vector_batch(discrete=False))
    hook.remove()
    actions = rolled["out"][1]  # (H+1, N, A) as the actor sampled them
    assert float(actions.detach().abs().max()) > 1.0  # the normal's samples leave the box ...
    assert max(float(m) for m in seen) <= 1.0  # ... and are scaled back into it before the dynamics read them


def test_continuous_actor_gradient_is_the_reference_with_the_baseline_gradient():
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    agent.update(vector_batch(discrete=False))
    with torch.no_grad():  # critic and reward head off their zero-initialised outputs: values that vary by state
        for p in [*agent.critic.parameters(), *agent.wm.reward_head.parameters()]:
            p.add_(0.3 * torch.randn_like(p))
    data = agent._update_inputs(vector_batch(seed=5, discrete=False))
    with torch.no_grad():
        post = agent.wm.loss(data).post
    start = {k: v.flatten(0, 1) for k, v in post.items()}  # (T, B, ...) -> (T*B, ...)
    start_cont = torch.ones(start["deter"].shape[0])
    rng, norm = torch.get_rng_state(), copy.deepcopy(agent.retnorm.state_dict())

    expected = reference_actor_grads(agent, start, start_cont, detach_baseline=False)
    torch.set_rng_state(rng)
    agent.retnorm.load_state_dict(norm)
    detached = reference_actor_grads(agent, start, start_cont, detach_baseline=True)
    torch.set_rng_state(rng)
    agent.retnorm.load_state_dict(norm)

    got = {}
    agent.actor_opt.step = lambda *a, **k: got.setdefault("grads", [p.grad.clone() for p in agent.actor.parameters()])
    agent._behavior(start, start_cont)
    for g, e in zip(got["grads"], expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)
    # the baseline's gradient is not negligible: detaching it (reverie before this change) moves the gradient
    diff = sum(float((e - d).norm()) for e, d in zip(expected, detached))
    assert diff > 0.01 * sum(float(e.norm()) for e in expected)


def test_replay_window_row_zero_starts_from_the_initial_state_with_no_previous_action():
    """Row 0 of every window is treated as is_first: the update does not depend on the replayed previous action of
    row 0 nor on its is_first flag (reference: embodied/replay/generic.py sets seq['is_first'][0] = True)."""
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    twin = copy.deepcopy(agent)
    mid = vector_batch(seed=3, discrete=False)
    mid["is_first"][0] = False  # a window that starts inside an episode, with a real previous action
    mid["prev_action"][0] = 0.75
    other = {k: v.copy() for k, v in mid.items()}
    other["prev_action"][0] = -0.5
    torch.manual_seed(1)
    a = agent.update(mid)
    torch.manual_seed(1)
    b = twin.update(other)
    assert a["loss/model"] == b["loss/model"] and a["loss/actor"] == b["loss/actor"]
    for p, q in zip(agent.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
