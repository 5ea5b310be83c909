"""reverie.agents.objectives and the guard's bookkeeping (issue 46 items 1 and 4): each loss by hand on small
numbers, where its gradient goes, one total with its keys checked, the return normaliser stored only when a step
is taken, and the loop reading ``UpdateResult.skipped``."""

import math

import pytest
import torch

from reverie.agents import objectives
from reverie.agents.base import UpdateResult
from reverie.agents.returns import ReturnNormalizer
from reverie.models.distributions import TwoHotSymlog


def test_weighted_sum_is_the_scaled_sum_of_means_and_checks_the_keys():
    losses = {"a": torch.tensor([[1.0, 3.0]]), "b": torch.tensor([[10.0], [20.0]])}  # means 2 and 15
    assert float(objectives.weighted_sum(losses, {"a": 0.5, "b": 0.1}, "X")) == pytest.approx(0.5 * 2 + 0.1 * 15)
    with pytest.raises(RuntimeError, match=r"X: the update's losses are \['a', 'b'\], its scales are for \['a'\]"):
        objectives.weighted_sum(losses, {"a": 1.0}, "X")


def test_reinforce_weighs_log_pi_by_the_advantage_and_sends_no_gradient_into_it():
    log_prob = torch.tensor([-0.5, -2.0], requires_grad=True)
    adv = torch.tensor([2.0, -1.0], requires_grad=True)
    entropy = torch.tensor([1.0, 0.5])
    weight = torch.tensor([1.0, 0.25])
    loss = objectives.reinforce_policy_loss(log_prob, adv, entropy, weight, 0.1)
    # -w (logpi adv + 0.1 H): -(1)(-1 + 0.1) = 0.9; -(0.25)(2 + 0.05) = -0.5125
    torch.testing.assert_close(loss, torch.tensor([0.9, -0.5125]))
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([-2.0, 0.25]))  # -w adv
    assert adv.grad is None  # the advantage is a constant to REINFORCE


def test_backprop_maximises_the_advantage_itself():
    adv = torch.tensor([2.0, -1.0], requires_grad=True)
    loss = objectives.backprop_policy_loss(adv, torch.tensor([1.0, 0.5]), torch.tensor([1.0, 0.25]), 0.1)
    torch.testing.assert_close(loss, torch.tensor([-(2.0 + 0.1), -0.25 * (-1.0 + 0.05)]))
    loss.sum().backward()
    torch.testing.assert_close(adv.grad, torch.tensor([-1.0, -0.25]))


def test_advantage_divides_by_the_return_scale():
    torch.testing.assert_close(objectives.advantage(torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor(4.0)),
                               torch.tensor([0.5]))


def test_critic_loss_is_the_two_hot_log_likelihood_of_the_return_and_the_slow_mean():
    """Three bins at symlog values -1, 0, 1: a return of symexp(0.5) sits halfway between bins 1 and 2, the slow
    critic's mean 0 on bin 1; so the loss is -w (0.5 log p1 + 0.5 log p2 + slow_reg log p1)."""
    logits = torch.tensor([[0.2, 1.0, -0.5]], requires_grad=True)
    bins = torch.tensor([-1.0, 0.0, 1.0])
    ret = torch.tensor([math.expm1(0.5)], requires_grad=True)  # symexp(0.5)
    loss = objectives.critic_loss(TwoHotSymlog(logits, bins=bins), ret, torch.tensor([0.0]), torch.tensor([2.0]),
                                  0.5)
    logp = torch.log_softmax(logits.detach(), -1)[0]
    want = -2.0 * (0.5 * logp[1] + 0.5 * logp[2] + 0.5 * logp[1])
    torch.testing.assert_close(loss, want.reshape(1))
    loss.sum().backward()
    assert ret.grad is None and logits.grad is not None  # the target is a constant; the critic learns


def test_estimators_are_chosen_once_and_own_the_rollout_grad_mode():
    assert objectives.ESTIMATORS["reinforce"].grad is False and objectives.ESTIMATORS["backprop"].grad is True


def test_the_return_normaliser_stores_its_next_percentiles_only_on_commit():
    norm = ReturnNormalizer()
    returns = torch.arange(101, dtype=torch.float32)  # 5th and 95th percentiles: 5 and 95
    stats = norm.next(returns)
    assert float(norm.low) == float(norm.high) == 0.0  # nothing stored yet
    torch.testing.assert_close(torch.stack(stats), torch.tensor([0.05, 0.95]))  # 0.01 x the percentiles
    assert float(norm.scale(stats)) == 1.0 and float(norm.scale()) == 1.0  # the floor
    norm.commit(stats)
    assert (float(norm.low), float(norm.high)) == (float(stats[0]), float(stats[1]))
    other = ReturnNormalizer()
    other.update(returns)  # next and commit at once: the same values, bit for bit
    assert torch.equal(other.low, norm.low) and torch.equal(other.high, norm.high)


def test_update_result_is_the_metrics_with_the_skip_count_and_writes():
    result = UpdateResult({"loss/x": 1.0}, skipped=2, replay_writes={"k": 1})
    assert dict(result) == {"loss/x": 1.0} and result.skipped == 2 and result.replay_writes == {"k": 1}
    assert UpdateResult.of(result) is result
    plain = UpdateResult.of({"loss/x": 1.0, "guard/nonfinite": 1.0})  # another agent's plain dict
    assert plain.skipped == 0 and plain.replay_writes is None
