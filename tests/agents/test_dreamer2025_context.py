"""Replay context of the current official DreamerV3 (``replay_context: 1``, danijar/dreamerv3 e3f0224
``agent.py:312-340``): a window's start state is the stored latent of its first row, the trained rows' posteriors
are written back, ``is_first`` inside a window resets, row 0 is ``is_first`` only without context."""

import copy

import numpy as np
import pytest
import torch

from reverie.agents import DreamerV3_2025
from reverie.replay import Replay
from reverie.types import ActionSpec

TINY = dict(dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4), units=8, horizon=3, precision="float32",
            warmup=0)
T, B, A = 5, 3, 2
#: the block RSSM's replay context keys: posterior_<name> for its context_spec() (deter, stoch), and the flag; the
#: names checkpoints of before hold
LATENT_KEYS = ("posterior_deter", "posterior_stoch", "has_posterior")


def agent(context=1, seed=0):
    torch.manual_seed(seed)
    return DreamerV3_2025({"vector": (4,)}, ActionSpec(True, A), replay_context=context, **TINY)


def window(seed=0, first_at=None, has=True):
    """A batch of ``T + 1`` rows with stored latents: row 0 the context."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T + 1, B), bool)
    if first_at is not None:
        is_first[first_at, 1] = True
    actions = np.eye(A, dtype=np.float32)[rng.integers(A, size=(T + 1, B))]
    prev = np.concatenate([np.zeros((1, B, A), np.float32), actions[:-1]]) * ~is_first[..., None]
    stoch = np.eye(4, dtype=np.float32)[rng.integers(4, size=(T + 1, B, 3))]  # (T+1, B, S, K) one-hot
    return {"vector": rng.normal(size=(T + 1, B, 4)).astype(np.float32), "action": actions, "prev_action": prev,
            "reward": rng.normal(size=(T + 1, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.roll(is_first, -1, 0), "is_terminal": np.zeros((T + 1, B), bool),
            "posterior_deter": rng.normal(size=(T + 1, B, 16)).astype(np.float32), "posterior_stoch": stoch,
            "has_posterior": np.full((T + 1, B), has)}


def spy_observe(ag):
    """Record the arguments of every ``dynamics.observe`` call."""
    calls, observe = [], ag.wm.dynamics.observe

    def spy(embed, prev_action, is_first, state=None, sample=True):
        calls.append({"embed": embed, "prev_action": prev_action, "is_first": is_first.clone(), "state": state})
        return observe(embed, prev_action, is_first, state, sample)

    ag.wm.dynamics.observe = spy
    return calls


def test_window_starts_from_the_stored_latent_of_its_first_row():
    ag, data = agent(), window()
    calls = spy_observe(ag)
    ag.update(data)
    call = calls[0]
    assert call["embed"].shape[:2] == (T, B)  # rows 1..T trained
    np.testing.assert_array_equal(call["state"]["deter"].numpy(), data["posterior_deter"][0])
    np.testing.assert_array_equal(call["state"]["stoch"].numpy(), data["posterior_stoch"][0])
    np.testing.assert_array_equal(call["prev_action"].numpy(), data["prev_action"][1:])  # row 1: row 0's action
    assert not call["is_first"].any()  # row 1 continues from the context: not is_first


def test_row_0_is_first_only_without_context():
    """Official replay.py:286 marks row 0 of every sampled window is_first; with replay_context the context row (and
    its mark) is dropped, so the first trained row is is_first only where its data says so (agent.py:333-339), or
    here where the context row has no stored latent (it then starts from the initial state)."""
    plain, data = agent(context=0), window()
    calls = spy_observe(plain)
    plain.update({k: v[1:] for k, v in data.items()})
    assert calls[0]["is_first"][0].all() and not calls[0]["is_first"][1:].any()
    ctx = agent()
    calls = spy_observe(ctx)
    absent = window()
    absent["has_posterior"][0, 2] = False
    ctx.update(absent)
    assert calls[0]["is_first"][0].tolist() == [False, False, True] and not calls[0]["is_first"][1:].any()
    with pytest.raises(ValueError, match="stored latents"):
        ctx.update({k: v for k, v in data.items() if k not in LATENT_KEYS})
    with pytest.raises(ValueError, match="replay_context"):
        agent(context=2)


def test_an_absent_latent_starts_from_the_initial_state():
    """A context row without a latent (prefill, a dataset) gives row 1 the posterior of a window without context."""
    data = window(has=False)
    data["posterior_deter"][:] = 0
    data["posterior_stoch"][:] = 0
    with_ctx, without = agent(), agent(context=0)
    torch.manual_seed(3)
    with_ctx.update(data)
    torch.manual_seed(3)
    without.update({k: v[1:] for k, v in data.items()})
    for a, b in zip(with_ctx.parameters(), without.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_write_back_rows_hold_the_posterior_of_the_update():
    """After an update the rows 1..T of each window hold the posterior that update computed from the stored start
    (official train -> outs['replay'] -> replay.update); computed again here with the parameters before the step."""
    spec = {"vector": ((4,), np.float32), "action": ((A,), np.float32), "reward": ((), np.float32),
            "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}
    ag = agent()
    spec |= ag.replay_latent_spec()
    replay = Replay(40, 2, spec, optional=LATENT_KEYS, seed=1, online_window=T + 1)
    rng = np.random.default_rng(0)
    for t in range(13):
        replay.add({"vector": rng.normal(size=(2, 4)).astype(np.float32),
                    "action": np.eye(A, dtype=np.float32)[rng.integers(A, size=2)],
                    "reward": np.zeros(2, np.float32), "is_first": np.full(2, t == 0), "is_last": np.zeros(2, bool),
                    "is_terminal": np.zeros(2, bool), "posterior_deter": rng.normal(size=(2, 16)).astype(np.float32),
                    "posterior_stoch": np.eye(4, dtype=np.float32)[rng.integers(4, size=(2, 3))],
                    "has_posterior": np.ones(2, bool)})
    batch = replay.sample(B, T + 1, online=True, index=True)  # the queued windows: disjoint
    assert list(zip(batch["replay_column"], batch["replay_start"])) == [(0, 1), (1, 1), (0, 7)]
    before = copy.deepcopy(ag)
    torch.manual_seed(7)
    writes = ag.update(batch).replay_writes
    old = {k: replay.arrays[k].copy() for k in LATENT_KEYS}
    assert replay.write(batch["replay_column"], batch["replay_start"] + 1, writes) == T * B
    torch.manual_seed(7)  # the same draws: observe is the update's first random step
    data = before.wm.tensors({k: batch[k][1:] for k in ("vector", "prev_action", "is_first")})
    state = {"deter": torch.as_tensor(batch["posterior_deter"][0]),
             "stoch": torch.as_tensor(batch["posterior_stoch"][0])}
    with torch.no_grad():
        post, _ = before.wm.dynamics.observe(before.wm.encode(data), data["prev_action"], data["is_first"], state)
    for b, (col, start) in enumerate([(0, 1), (1, 1), (0, 7)]):
        rows = start + 1 + np.arange(T)
        np.testing.assert_array_equal(replay.arrays["posterior_deter"][rows, col], post["deter"][:, b].numpy())
        np.testing.assert_array_equal(replay.arrays["posterior_stoch"][rows, col], post["stoch"][:, b].numpy())
        assert replay.arrays["has_posterior"][rows, col].all()
        np.testing.assert_array_equal(replay.arrays["posterior_deter"][start, col], old["posterior_deter"][start, col])
    assert not np.array_equal(replay.arrays["posterior_deter"], old["posterior_deter"])


def test_is_first_inside_a_window_resets_the_state_there():
    """From an is_first row on, a window's posteriors do not depend on its stored start; before it they do."""
    k = 3  # trained rows 1..T; row k of the window is is_first in column 1
    data = window(first_at=k)
    other = {**data, "posterior_deter": data["posterior_deter"] + 1.0}
    a, b = agent(), agent()
    torch.manual_seed(5)
    pa = a.update(data).replay_writes["posterior_deter"]
    torch.manual_seed(5)
    pb = b.update(other).replay_writes["posterior_deter"]  # (T, B, D): rows 1..T
    np.testing.assert_array_equal(pa[k - 1:, 1], pb[k - 1:, 1])  # window row k = trained row k - 1: reset
    assert not np.allclose(pa[:k - 1, 1], pb[:k - 1, 1])
    assert not np.allclose(pa[:, 0], pb[:, 0])  # no is_first in column 0: the start state carries through


def test_a_non_finite_posterior_is_not_written_back():
    """A non-finite posterior must not spread through the replay: its rows come back without a latent (zeros,
    has_posterior false). (A non-finite *start* state stops the update earlier: the policy's distribution refuses
    NaN parameters.)"""
    ag, data = agent(), window()
    update = ag._update

    def poisoned(batch, state):
        metrics, post, skipped = update(batch, state)
        post = {**post, "deter": post["deter"].clone()}
        post["deter"][2:, 1] = float("nan")  # trained rows 2.. of column 1
        return metrics, post, skipped

    ag._update = poisoned
    writes = ag.update(data).replay_writes
    assert writes["has_posterior"][:2].all() and not writes["has_posterior"][2:, 1].any()
    assert writes["has_posterior"][:, [0, 2]].all()
    assert np.isfinite(writes["posterior_deter"]).all() and not writes["posterior_deter"][2:, 1].any()
    assert not writes["posterior_stoch"][2:, 1].any() and writes["posterior_stoch"][2:, 0].any()
