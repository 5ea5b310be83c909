"""Dynamics defined here and nowhere in reverie train through the normal CLI/config path: the
:class:`reverie.models.dynamics.Dynamics` protocol is all the world model, the agents, the loop and the viz use.

- :class:`MLPDynamics`: no recurrent state, the transition reads the previous latent alone; it takes the window
  members from :class:`reverie.models.dynamics.RowState`.
- :class:`HistoryDynamics`: not Markov in its latent: the transition reads the last ``k`` latents, which its state
  keeps as a context entry ``history (N, k, Z)`` next to the step's own entries. It writes every window member
  itself: its starts and carry hold the context and not the logits, imagination stacks only what the features read,
  and its replay context (``agent=dreamerv3_2025``) stores the history, ``posterior_history (k, Z)``, not a
  ``deter``/``stoch`` it does not have.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from helpers.state_compare import assert_same, final_state
from reverie.agents import DreamerV3_2025
from reverie.cli import main
from reverie.models.distributions import one_hot_index, unimix_sample
from reverie.models.dynamics import RowState, kl_losses, rollout
from reverie.models.dynamics.base import reset
from reverie.state.saved_run import load_run
from reverie.types import ActionSpec


class MLPDynamics(RowState, nn.Module):
    """No recurrent state: ``h_t = silu(W [z_{t-1}, a_t])`` from the previous latent alone, categorical latents
    ``z_t`` (``S x K``, unimix) from ``h_t`` (prior) or ``[h_t, e_t]`` (posterior); features ``cat(h, z)``; the
    DreamerV3 KL losses (``dyn``, ``rep``)."""

    loss_keys = ("dyn", "rep")
    feature_keys = ("hidden", "stoch")
    carry_keys = ("stoch",)  # the transition reads the previous latent alone

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
            state = reset({"stoch": state["stoch"]}, init, first[t])
            hidden = self.transition(torch.cat([state["stoch"].flatten(-2), prev_action[t] * (1 - first[t])], -1))
            priors.append(self._latent(hidden, self.prior(hidden), sample))
            state = self._latent(hidden, self.posterior(torch.cat([hidden, embed[t]], -1)), sample)
            posts.append(state)
        stack = lambda states: {k: torch.stack([s[k] for s in states]) for k in states[0]}  # noqa: E731
        return stack(posts), stack(priors)  # T x (B, ...) -> (T, B, ...)

    def imagine(self, policy, start, horizon):
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    def features(self, state):
        return torch.cat([state["hidden"], state["stoch"].flatten(-2)], -1)  # (..., U + S*K)

    def loss(self, post, prior, prev_action, is_first):
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {"kl": kl["kl"].mean()}


class HistoryDynamics(nn.Module):
    """The transition reads the last ``k`` latents: ``h_t = silu(W [z_{t-k}, .., z_{t-1}, a_t])`` (zeros for the
    steps before the episode's first), categorical latents ``z_t`` (``S x K``, unimix) from ``h_t`` (prior) or
    ``[h_t, e_t]`` (posterior), features ``cat(h_t, z_t)``, the DreamerV3 KL losses.

    State entries: ``history (N, k, S*K)`` the latents ``z_{t-k+1} .. z_t``, oldest first (the context), and the
    step's ``hidden (N, U)``, ``stoch (N, S, K)``, ``logits (N, S, K)``. At ``is_first`` the history is masked to
    zeros. The window members are its own (no :class:`RowState`).
    """

    loss_keys = ("dyn", "rep")
    feature_keys = ("hidden", "stoch")
    carry = ("history", "hidden", "stoch")  # what img_step (history) and the policy (features) read from a start

    def __init__(self, action_dim: int, embed_dim: int, stoch: int = 4, classes: int = 4, units: int = 16,
                 history: int = 3, free_nats: float = 1.0, unimix: float = 0.01):
        super().__init__()
        self.stoch, self.classes, self.units, self.free_nats, self.unimix = stoch, classes, units, free_nats, unimix
        self.k, self.z = history, stoch * classes
        self.feat_dim = units + self.z
        self.transition = nn.Sequential(nn.Linear(history * self.z + action_dim, units), nn.SiLU())
        self.prior = nn.Linear(units, self.z)
        self.posterior = nn.Linear(units + embed_dim, self.z)

    def initial(self, batch: int) -> dict[str, torch.Tensor]:
        zeros = self.prior.weight.new_zeros
        return {"history": zeros(batch, self.k, self.z), "hidden": zeros(batch, self.units),
                "stoch": zeros(batch, self.stoch, self.classes), "logits": zeros(batch, self.stoch, self.classes)}

    def _latent(self, hidden: torch.Tensor, logits: torch.Tensor, sample: bool) -> dict[str, torch.Tensor]:
        logits = logits.unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)
        stoch = unimix_sample(logits, self.unimix) if sample else one_hot_index(logits.argmax(-1), self.classes)
        return {"hidden": hidden, "stoch": stoch, "logits": logits}

    @staticmethod
    def _push(history: torch.Tensor, stoch: torch.Tensor) -> torch.Tensor:
        """``(N, k, Z)`` without its oldest latent, ``z (N, S, K)`` appended."""
        return torch.cat([history[:, 1:], stoch.flatten(-2)[:, None]], 1)  # (N, S, K) -> (N, 1, S*K)

    def img_step(self, state, action, sample=True):
        hidden = self.transition(torch.cat([state["history"].flatten(-2), action], -1))  # (N, k*Z + A)
        latent = self._latent(hidden, self.prior(hidden), sample)
        return latent | {"history": self._push(state["history"], latent["stoch"])}

    def observe(self, embed, prev_action, is_first, state=None, sample=True):
        T, B = is_first.shape
        history = (self.initial(B) if state is None else state)["history"]
        keep = (~is_first).to(embed.dtype)[..., None]  # (T, B) -> (T, B, 1)
        posts, priors = [], []
        for t in range(T):
            history = history * keep[t, :, :, None]  # the episode's first step sees no latent before it
            hidden = self.transition(torch.cat([history.flatten(-2), prev_action[t] * keep[t]], -1))
            prior = self._latent(hidden, self.prior(hidden), sample)
            post = self._latent(hidden, self.posterior(torch.cat([hidden, embed[t]], -1)), sample)
            priors.append(prior | {"history": self._push(history, prior["stoch"])})
            history = self._push(history, post["stoch"])
            posts.append(post | {"history": history})
        stack = lambda states: {k: torch.stack([s[k] for s in states]) for k in states[0]}  # noqa: E731
        return stack(posts), stack(priors)  # T x (B, ...) -> (T, B, ...)

    def imagine(self, policy, start, horizon):
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    def features(self, state):
        return torch.cat([state["hidden"], state["stoch"].flatten(-2)], -1)  # (..., U + S*K)

    def loss(self, post, prior, prev_action, is_first):
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {"kl": kl["kl"].mean()}

    def starts(self, post, last=0):
        T = post["history"].shape[0]
        if not 0 <= last <= T:
            raise ValueError(f"starts: last must be in [0, {T}], got {last}")
        return {k: post[k][T - last if last else 0:].flatten(0, 1) for k in self.carry}  # (K, B, ...) -> (K*B, ...)

    def truncate(self, post):
        return {k: post[k][-1] for k in self.carry}

    def context_spec(self):
        return {"history": ((self.k, self.z), np.dtype(np.float32))}

    def context_rows(self, post):
        return {"history": post["history"].float()}

    def context_state(self, rows):
        return {"history": rows["history"]}


def dynamics_override(cls: type, **settings) -> list[str]:
    """The CLI overrides that put ``cls`` (this module's, imported by pytest under its file name) in the config."""
    extra = "".join(f", {k}: {v}" for k, v in settings.items())
    return ["~agent.module.dynamics", f"+agent.module.dynamics={{_target_: {__name__}.{cls.__name__}, "
                                      f"_partial_: true{extra}}}"]


def metric_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_dynamics_defined_in_a_test_file_trains_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.report_every=10",
                 *dynamics_override(MLPDynamics, units=16)]) == 0
    rows = metric_rows(run_dir)
    assert rows[-1]["updates"] > 0 and any("eval/return_mean" in r for r in rows)
    losses = [r for r in rows if "loss/dyn" in r]
    assert losses and all(np.isfinite(r["loss/model"]) and r["loss/dyn"] >= 1.0 for r in losses)  # free bits
    assert list((run_dir / "plots").glob("openloop_reward_*.png"))  # the open-loop report ran on it too
    run = load_run(run_dir)
    assert type(run.agent.wm.dynamics).__name__ == "MLPDynamics" and run.agent.wm.dynamics.units == 16
    assert run.config["agent"]["module"]["dynamics"]["_target_"] == f"{__name__}.MLPDynamics"


def history_sequence(T=6, B=3, E=5, A=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    is_first = torch.zeros(T, B, dtype=torch.bool)
    is_first[0] = True
    is_first[3, 1] = True
    return torch.randn(T, B, E, generator=g), torch.randn(T, B, A, generator=g), is_first


def test_history_dynamics_keeps_the_last_k_latents_and_its_window_members():
    """The context is what it claims (the last k posterior latents, zeros across is_first), and each window member
    gives it back: starts and the carry hold the history, imagination does not stack it, the replay context
    round-trips to the carry the next window continues from."""
    torch.manual_seed(0)
    dyn = HistoryDynamics(2, 5, history=3)
    embed, action, is_first = history_sequence()
    post, _ = dyn.observe(embed, action, is_first)
    z = post["stoch"].flatten(-2)  # (T, B, Z)
    for t in range(6):
        for b in range(3):
            start = 3 if (b == 1 and t >= 3) else 0  # the episode's first row
            expected = [z[s, b] if s >= start else torch.zeros(16) for s in range(t - 2, t + 1)]
            torch.testing.assert_close(post["history"][t, b], torch.stack(expected), rtol=0, atol=0)
    starts = dyn.starts(post, 2)  # rows 4, 5: start i*B + b
    assert set(starts) == {"history", "hidden", "stoch"}
    torch.testing.assert_close(starts["history"][3 + 1], post["history"][5, 1], rtol=0, atol=0)
    states, _ = dyn.imagine(lambda s: torch.zeros(s["hidden"].shape[0], 2), starts, horizon=2)
    assert set(states) == {"hidden", "stoch"} and states["hidden"].shape == (3, 6, 16)
    carry = dyn.context_state({k: v[4] for k, v in dyn.context_rows(post).items()})  # the stored row 4
    g = torch.Generator().manual_seed(1)
    nxt_embed, nxt_action = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 2, generator=g)
    none = torch.zeros(2, 3, dtype=torch.bool)
    a, _ = dyn.observe(nxt_embed, nxt_action, none, carry, sample=False)
    b, _ = dyn.observe(nxt_embed, nxt_action, none, dyn.truncate({k: v[:5] for k, v in post.items()}), sample=False)
    assert_same(a, b)


def test_the_current_agent_stores_and_starts_from_the_history_context():
    """agent=dreamerv3_2025 with replay context: the replay keys come from the dynamics' context_spec
    (posterior_history, no posterior_deter), a window starts from its context row's stored history, the write-back
    holds the trained rows' histories, and acting stores the acting carry's."""
    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), dynamics=HistoryDynamics,
                           units=8, horizon=3, precision="float32", warmup=0, replay_context=1)
    assert agent.replay_latent_spec() == {"posterior_history": ((3, 16), np.dtype(np.float32)),
                                          "has_posterior": ((), np.dtype(bool))}
    rng = np.random.default_rng(0)
    T, B = 5, 3
    batch = {"vector": rng.normal(size=(T + 1, B, 4)).astype(np.float32),
             "prev_action": np.eye(2, dtype=np.float32)[rng.integers(2, size=(T + 1, B))],
             "reward": np.zeros((T + 1, B), np.float32), "is_first": np.zeros((T + 1, B), bool),
             "is_last": np.zeros((T + 1, B), bool), "is_terminal": np.zeros((T + 1, B), bool),
             "posterior_history": np.eye(16, dtype=np.float32)[rng.integers(16, size=(T + 1, B, 3))],
             "has_posterior": np.ones((T + 1, B), bool)}
    seen, observe = [], agent.wm.dynamics.observe
    agent.wm.dynamics.observe = lambda *a, **k: seen.append(a[3]) or observe(*a, **k)
    writes = agent.update(batch).replay_writes
    assert set(seen[0]) == {"history"}
    np.testing.assert_array_equal(seen[0]["history"].numpy(), batch["posterior_history"][0])
    assert set(writes) == {"posterior_history", "has_posterior"} and writes["has_posterior"].all()
    history = writes["posterior_history"]  # (T, B, k, Z): row t holds z_{t-2..t}
    np.testing.assert_array_equal(history[0, :, :2], batch["posterior_history"][0][:, 1:])  # continues the stored
    np.testing.assert_array_equal(history[1:, :, :2], history[:-1, :, 1:])  # each row shifts in one latent
    obs = {"vector": rng.normal(size=(B, 4)).astype(np.float32), "is_first": np.ones(B, bool)}
    _, state = agent.act(obs, None)
    latent = agent.replay_latent(state)
    np.testing.assert_array_equal(latent["posterior_history"], state[0]["history"].numpy())
    assert latent["posterior_history"][:, :2].sum() == 0 and latent["has_posterior"].all()  # an episode's first row
    with pytest.raises(ValueError, match="context_spec"):
        DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), dynamics=MLPNoContext,
                       units=8, replay_context=1)
    with pytest.raises(TypeError, match=r"lacks the Dynamics members \['starts', 'truncate'"):
        DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), dynamics=WithoutWindow, units=8)


class MLPNoContext(MLPDynamics):
    """:class:`MLPDynamics` that cannot start from a stored row."""

    def context_spec(self):
        return {}


class WithoutWindow(nn.Module):
    """A dynamics of the protocol before ``starts`` and ``truncate``: refused at construction."""

    loss_keys, feature_keys, feat_dim = ("dyn", "rep"), ("hidden", "stoch"), 32
    initial = observe = img_step = imagine = features = loss = context_spec = context_rows = context_state = None

    def __init__(self, action_dim, embed_dim):
        super().__init__()


def test_a_non_markov_dynamics_trains_acts_evaluates_reports_and_imagines_through_the_cli(tmp_path):
    """The 2023 agent (exp=debug): imagination from the history starts, acting on the carry, evaluation, the
    open-loop report and `reverie imagine`, with no change to reverie."""
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.report_every=10",
                 *dynamics_override(HistoryDynamics, history=3)]) == 0
    rows = metric_rows(run_dir)
    assert rows[-1]["updates"] > 0 and any("eval/return_mean" in r for r in rows)
    assert all(np.isfinite(r["loss/model"]) and np.isfinite(r["loss/actor"]) for r in rows if "loss/model" in r)
    assert list((run_dir / "plots").glob("openloop_reward_*.png"))
    saved = final_state(run_dir)[0]
    assert saved["act_state"][0]["history"].shape == (4, 3, 16)  # the acting carry of 4 envs holds the context
    out = tmp_path / "imagine"
    assert main(["imagine", str(run_dir), "--context", "4", "--horizon", "5", "--out", str(out)]) == 0
    assert len(json.loads((out / "imagine.json").read_text())["reward"]) == 9


def test_a_non_markov_dynamics_stores_its_context_and_resumes_exactly(tmp_path):
    """agent=dreamerv3_2025: the replay context stores the history (posterior_history), and a run stopped and resumed
    equals the straight one (agent, replay with the stored histories, acting carry, random streams)."""
    N = 48
    base = ["exp=debug", "agent=dreamerv3_2025", "agent.module.warmup=2", "agent.train_ratio=16", "train.prefill=16",
            "train.eval_every=0", "train.eval_episodes=1", "train.log_every=16", "seed=5",
            *dynamics_override(HistoryDynamics, history=3)]
    assert main(["train", *base, f"run_dir={tmp_path / 'straight'}", f"train.steps={2 * N}"]) == 0
    assert main(["train", *base, f"run_dir={tmp_path / 'resumed'}", f"train.steps={N}"]) == 0
    assert main(["train", *base, f"run_dir={tmp_path / 'resumed'}", f"train.steps={2 * N}"]) == 0
    pa, ra, ma, ca = final_state(tmp_path / "straight")
    pb, rb, mb, cb = final_state(tmp_path / "resumed")
    assert ca == cb and ca["env_steps"] == 2 * N and ca["updates"] > 0
    for key in ("agent", "ratio", "row", "act_state"):
        assert_same(pa[key], pb[key], key)
    assert_same(ra, rb, "replay")
    assert_same(pa["rng"]["torch"], pb["rng"]["torch"], "torch rng")
    assert {k: ma[k] for k in ("cursor", "fill", "added", "queue")} == {k: mb[k] for k in ("cursor", "fill", "added",
                                                                                         "queue")}
    assert not {"posterior_deter", "posterior_stoch"} & set(ra) and ra["posterior_history"].shape[2:] == (3, 16)
    has = ra["has_posterior"]
    assert has.any() and not has.all()  # acted and trained rows have one, prefill rows not
    stored = ra["posterior_history"][has].reshape(-1, 3, 4, 4).sum(-1)  # (rows, k, S): one-hot groups or zeros
    assert set(np.unique(stored)) <= {0.0, 1.0} and stored.any()
