"""The window members of the Dynamics protocol on the three shipped dynamics (reverie/models/dynamics/base.py):
``starts`` (time-major rows), ``truncate`` (the last row), ``feature_keys`` (all imagination stacks), and the replay
context's ``context_spec`` / ``context_rows`` / ``context_state``; and the agents taking their imagination starts
from ``starts``. Expected values are the posterior's own rows, indexed here by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reverie.agents import DreamerV3, DreamerV3_2025
from reverie.models.dynamics import BlockRSSM, CategoricalRSSM, GaussianRSSM, check_dynamics
from reverie.types import ActionSpec

from helpers.agents import dreamer

T, B, A, E = 6, 3, 2, 5
F32 = np.dtype(np.float32)


def categorical():
    return CategoricalRSSM(A, E, deter=8, stoch=3, classes=4, units=8, kernels="off")


def gaussian():
    return GaussianRSSM(A, E, deter=8, stoch=3, units=8)


def block():
    return BlockRSSM(A, E, deter=8, hidden=4, stoch=3, classes=4, blocks=2)


#: each dynamics with the replay context its docs promise: {name: (shape, dtype)}
CASES = {"categorical": (categorical, {"deter": ((8,), F32), "stoch": ((3, 4), F32)}),
         "gaussian": (gaussian, {"deter": ((8,), F32), "stoch": ((3,), F32)}),
         "block": (block, {"deter": ((8,), F32), "stoch": ((3, 4), F32)})}


def observed(name, seed=0):
    torch.manual_seed(seed)
    dyn = CASES[name][0]()
    g = torch.Generator().manual_seed(seed + 1)
    is_first = torch.zeros(T, B, dtype=torch.bool)
    is_first[0] = True
    is_first[3, 2] = True
    with torch.no_grad():
        post, _ = dyn.observe(torch.randn(T, B, E, generator=g), torch.randn(T, B, A, generator=g), is_first)
    return dyn, post


@pytest.mark.parametrize("name", CASES)
def test_starts_are_the_rows_time_major(name):
    dyn, post = observed(name)
    check_dynamics(dyn)
    every, last3 = dyn.starts(post), dyn.starts(post, 3)
    assert set(every) == set(last3) == set(post)
    for key, value in post.items():
        assert every[key].shape == (T * B, *value.shape[2:]) and last3[key].shape == (3 * B, *value.shape[2:])
        for t in range(T):
            for b in range(B):
                assert torch.equal(every[key][t * B + b], value[t, b])  # start t*B + b: row t, column b
        for i in range(3):
            for b in range(B):
                assert torch.equal(last3[key][i * B + b], value[T - 3 + i, b])  # rows T-3 .. T-1
    assert all(torch.equal(dyn.starts(post, T)[k], every[k]) for k in post)  # last = T: every row
    for bad in (-1, T + 1):
        with pytest.raises(ValueError, match=r"last must be in \[0, T\] = \[0, 6\]"):
            dyn.starts(post, bad)


@pytest.mark.parametrize("name", CASES)
def test_truncate_is_the_last_row(name):
    dyn, post = observed(name)
    carry = dyn.truncate(post)
    assert set(carry) == set(post)
    for key, value in post.items():
        assert torch.equal(carry[key], value[T - 1])


@pytest.mark.parametrize("name", CASES)
def test_features_read_the_feature_keys_and_imagination_stacks_only_them(name):
    dyn, post = observed(name)
    assert dyn.feature_keys == ("deter", "stoch")
    assert torch.equal(dyn.features({k: post[k] for k in dyn.feature_keys}), dyn.features(post))
    with torch.no_grad():
        states, actions = dyn.imagine(lambda s: torch.zeros(s["deter"].shape[0], A), dyn.starts(post, 2), horizon=3)
    assert set(states) == set(dyn.feature_keys) and states["deter"].shape == (4, 2 * B, 8)
    assert torch.equal(states["stoch"][0], dyn.starts(post, 2)["stoch"]) and actions.shape == (4, 2 * B, A)


@pytest.mark.parametrize("name", CASES)
def test_replay_context_spec_rows_and_round_trip(name):
    dyn, post = observed(name)
    spec = CASES[name][1]
    rng = torch.get_rng_state()
    assert dyn.context_spec() == spec
    assert torch.equal(torch.get_rng_state(), rng)  # the spec draws nothing
    rows = dyn.context_rows(post)
    assert set(rows) == set(spec)
    for key, (shape, _) in spec.items():
        assert rows[key].shape == (T, B, *shape) and rows[key].dtype == torch.float32
        assert torch.equal(rows[key], post[key])
    for t in (2, 4):
        state = dyn.context_state({k: v[t] for k, v in rows.items()})  # a stored row (B, ...)
        assert set(state) == set(spec) and all(torch.equal(state[k], post[k][t]) for k in spec)
        g = torch.Generator().manual_seed(9)
        embed, action = torch.randn(2, B, E, generator=g), torch.randn(2, B, A, generator=g)
        none = torch.zeros(2, B, dtype=torch.bool)
        with torch.no_grad():
            stored, _ = dyn.observe(embed, action, none, state, sample=False)
            carried, _ = dyn.observe(embed, action, none, dyn.truncate({k: v[:t + 1] for k, v in post.items()}),
                                     sample=False)
        assert all(torch.equal(stored[k], carried[k]) for k in stored)  # continues as the window's carry does


def agent_batch(seed=0, T_=6, B_=3, context=False):
    rng = np.random.default_rng(seed)
    rows = T_ + int(context)
    out = {"vector": rng.normal(size=(rows, B_, 4)).astype(np.float32),
           "prev_action": np.eye(2, dtype=np.float32)[rng.integers(2, size=(rows, B_))],
           "reward": rng.normal(size=(rows, B_)).astype(np.float32), "is_first": np.zeros((rows, B_), bool),
           "is_last": np.zeros((rows, B_), bool), "is_terminal": np.zeros((rows, B_), bool)}
    out["is_first"][0] = True
    return out


def spy_starts(agent):
    """Record ``(post, last, result)`` of the dynamics' ``starts`` calls."""
    calls, starts = [], agent.wm.dynamics.starts

    def spy(post, last=0):
        calls.append((post, last, starts(post, last)))
        return calls[-1][2]

    agent.wm.dynamics.starts = spy
    return calls


@pytest.mark.parametrize("imag_last,expected", [(0, 0), (2, 2), (10, 6)])
def test_the_agents_imagine_from_the_dynamics_starts(imag_last, expected):
    """Both DreamerV3 agents hand ``starts(post, K)`` (K = imag_last, at most T; 0: every row), detached, to their
    imagination, never building starts from named entries."""
    torch.manual_seed(0)
    old = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), imag_last=imag_last,
                    **dreamer(deter=16, units=16, horizon=2, kernels="off"))
    calls, seen = spy_starts(old), {}
    behavior = old._behavior
    old._behavior = lambda start, cont: seen.update(start=start) or behavior(start, cont)
    old.update(agent_batch())
    (post, last, result), = calls
    assert last == expected and set(seen["start"]) == set(result)
    assert all(torch.equal(seen["start"][k], result[k]) and not seen["start"][k].requires_grad for k in result)
    assert seen["start"]["deter"].shape[0] == (expected or 6) * 3
    torch.manual_seed(0)
    new = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), imag_last=imag_last, units=8, horizon=2,
                         precision="float32", warmup=0,
                         dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4))
    calls, seen = spy_starts(new), {}
    imagine = new._imagine
    new._imagine = lambda start: seen.update(start=start) or imagine(start)
    new.update(agent_batch())
    (post, last, result), = calls
    assert last == (expected or 6) and all(torch.equal(seen["start"][k], result[k]) for k in result)
    assert not any(v.requires_grad for v in seen["start"].values())
