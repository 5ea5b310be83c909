"""The data path against the official code (issue 40 item 5): one recorded stream of two envs (episodes ending in a
terminal and in a time limit, the policy's replay-context latents stored with every step) goes through reverie's
replay and the preprocessing of ``DreamerV3_2025.update``, and through the official replay and the official agent's
``_apply_replay_context`` (the golden, bench/goldens.py --case replay). For the same windows both give the update
the same starting state (the context row's stored latent), observations, rewards, previous actions (where the
dynamics read them) and ``is_first``/``is_last``/``is_terminal`` flags, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.official_goldens import group, load

from reverie.agents import DreamerV3_2025
from reverie.agents.dreamer2025 import replay_is_last
from reverie.replay import Replay
from reverie.types import ActionSpec

NAME = "official2025_replay"


class _Captured(Exception):
    pass


def reverie_update_inputs(arrays: dict, windows: np.ndarray, length: int) -> tuple[dict, dict]:
    """The stream through reverie's replay (``sample(at=windows)``) and ``update``'s preprocessing, stopped where the
    update starts: ``(data (T, B, ...), state (B, ...))``."""
    streams = [group(arrays, f"stream{env}") for env in range(2)]
    agent = DreamerV3_2025({"position": (3,), "velocity": (2,)}, ActionSpec(False, 1), units=8, precision="float32",
                           dynamics=dict(deter=16, hidden=8, stoch=4, classes=4, blocks=2), replay_context=1)
    spec = {"position": ((3,), np.float32), "velocity": ((2,), np.float32), "action": ((1,), np.float32),
            "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}
    latents = agent.replay_latent_spec()
    replay = Replay(1000, 2, spec | latents, optional=tuple(latents))
    for t in range(len(streams[0]["reward"])):
        row = {k: np.stack([s[k][t] for s in streams]) for k in spec}
        row["posterior_deter"] = np.stack([s["dyn/deter"][t] for s in streams])
        row["posterior_stoch"] = np.stack([s["dyn/stoch"][t] for s in streams])
        row["has_posterior"] = np.ones(2, bool)
        replay.add(row)
    batch = replay.sample(len(windows), length, at=(windows[:, 0], windows[:, 1]))
    captured = {}

    def capture(data, state=None):
        captured.update(data=data, state=state)
        raise _Captured

    agent._update = capture
    with pytest.raises(_Captured):
        agent.update(batch)
    return captured["data"], captured["state"]


def test_reverie_update_starts_from_what_the_official_update_starts_from():
    meta, arrays = load(NAME)
    windows, official = arrays["windows"], arrays
    length = official["window/is_first"].shape[1]  # batch_length + replay_context
    data, state = reverie_update_inputs(arrays, windows, length)
    T = length - 1
    swap = lambda x: np.swapaxes(np.asarray(x), 0, 1)  # noqa: E731  (T, B, ...) <-> (B, T, ...)
    for key in ("deter", "stoch"):
        np.testing.assert_array_equal(state[key].numpy(), official[f"carry/{key}"])
    for key in ("position", "velocity", "reward", "is_first", "is_terminal"):
        assert data[key].shape[0] == T
        np.testing.assert_array_equal(swap(data[key].numpy()), official[f"obs/{key}"], err_msg=key)
    np.testing.assert_array_equal(swap(replay_is_last(data["is_last"], data["is_first"]).numpy()),
                                  official["obs/is_last"])
    # the previous action of an is_first row: reverie's replay gives zeros, the official replay the previous
    # episode's last action, which its RSSM masks where reset (rssm.py _observe: nn.mask(action, ~reset)); reverie's
    # RSSM masks it too: equal where it enters the update
    first = official["obs/is_first"][..., None]
    assert (swap(data["prev_action"].numpy())[first[..., 0]] == 0).all()
    np.testing.assert_array_equal(swap(data["prev_action"].numpy()) * ~first, official["prevact/action"] * ~first)


def test_the_comparison_fails_for_a_window_off_by_one_row():
    meta, arrays = load(NAME)
    windows = arrays["windows"].copy()
    windows[3, 1] += 1
    data, state = reverie_update_inputs(arrays, windows, arrays["window/is_first"].shape[1])
    assert not np.array_equal(state["deter"].numpy(), arrays["carry/deter"])
    assert not np.array_equal(np.swapaxes(data["is_first"].numpy(), 0, 1), arrays["obs/is_first"])
