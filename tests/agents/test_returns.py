import pytest
import torch

from reverie.agents.returns import ReturnNormalizer, imagination_weights, lambda_return

REWARD = torch.tensor([0.0, 1.0, 2.0])  # reward[t] arrives with state t (reward[0] belongs to the start)
VALUE = torch.tensor([10.0, 20.0, 30.0])


def test_lambda_return_no_flags():
    ret = lambda_return(REWARD, VALUE, torch.ones(3), gamma=0.9, lam=0.95)
    # R_1 = 2 + 0.9 * 30 = 29;  R_0 = 1 + 0.9 * (0.05 * 20 + 0.95 * 29) = 26.695
    assert ret.tolist() == pytest.approx([26.695, 29.0], abs=1e-5)


def test_lambda_return_time_limit_at_step_1_bootstraps_from_its_value():
    is_last = torch.tensor([False, True, False])
    ret = lambda_return(REWARD, VALUE, torch.ones(3), gamma=0.9, lam=0.95, is_last=is_last)
    assert ret[0].item() == pytest.approx(19.0, abs=1e-5)  # 1 + 0.9 * 20, nothing from step 2
    assert ret[1].item() == pytest.approx(20.0, abs=1e-5)  # the last step itself: its own value, no leak


def test_lambda_return_terminal_at_step_1():
    is_terminal = torch.tensor([False, True, False])
    cont = 1.0 - is_terminal.float()
    ret = lambda_return(REWARD, VALUE, cont, gamma=0.9, lam=0.95, is_last=is_terminal)
    assert ret[0].item() == pytest.approx(1.0, abs=1e-6)
    assert ret[1].item() == 0.0
    # without is_last the continue flag alone already cuts the return at a terminal
    assert lambda_return(REWARD, VALUE, cont, 0.9, 0.95)[0].item() == pytest.approx(1.0, abs=1e-6)


def test_lambda_return_batch_dims_and_errors():
    r = REWARD[:, None].expand(3, 4)
    v = VALUE[:, None].expand(3, 4)
    ret = lambda_return(r, v, torch.ones(3, 4), 0.9, 0.95)
    assert ret.shape == (2, 4) and torch.allclose(ret[0], torch.full((4,), 26.695))
    with pytest.raises(ValueError, match="equal shapes"):
        lambda_return(REWARD, VALUE[:2], torch.ones(3), 0.9, 0.95)


def test_lambda_one_is_monte_carlo_and_zero_is_td():
    ret1 = lambda_return(REWARD, VALUE, torch.ones(3), gamma=0.5, lam=1.0)
    assert ret1[0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 30)
    ret0 = lambda_return(REWARD, VALUE, torch.ones(3), gamma=0.5, lam=0.0)
    assert ret0[0].item() == pytest.approx(1 + 0.5 * 20)


def test_imagination_weights_exact():
    cont = torch.tensor([[1.0], [1.0], [0.0], [1.0]])
    w = imagination_weights(cont, gamma=0.5)
    assert w[:, 0].tolist() == [1.0, 0.5, 0.0, 0.0]


def test_return_normalizer_exact_updates():
    norm = ReturnNormalizer(decay=0.99, limit=1.0)
    returns = torch.arange(101.0)  # 5th percentile 5, 95th percentile 95
    norm.update(returns)
    assert norm.low.item() == pytest.approx(0.05) and norm.high.item() == pytest.approx(0.95)
    assert norm.scale().item() == 1.0  # floored at 1
    for _ in range(999):
        norm.update(returns)
    expected = (1 - 0.99**1000) * 90
    assert norm.scale().item() == pytest.approx(expected, rel=1e-4)
    state = norm.state_dict()
    other = ReturnNormalizer()
    other.load_state_dict(state)
    assert other.scale().item() == norm.scale().item()
