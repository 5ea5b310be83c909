"""The STORM-style transformer dynamics (reverie/models/dynamics/transformer.py): the attention mask written out by
hand, the parallel observe against a plain per-query transformer written here, the key-value cache against the
full sequence, imagination starts and carries, shapes, dropout, the kernels switch, and the config preset."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reverie.agents.dreamer import DreamerV3
from reverie.configs.compose import load_config
from reverie.envs.testing import random_batch
from reverie.models.dynamics import TransformerDynamics, kl_losses
from reverie.models.dynamics.transformer import attention_mask
from reverie.models.kernels import install
from reverie.types import ActionSpec
from helpers.threads import single_thread

A, E = 2, 6


one_thread = pytest.fixture(autouse=True)(single_thread)  # tiny tensors: one intra-op thread


def make(context=3, layers=2, heads=2, deter=8, dropout=0.0, seed=0, **kwargs):
    torch.manual_seed(seed)
    dyn = TransformerDynamics(A, E, deter=deter, stoch=3, classes=4, layers=layers, heads=heads, context=context,
                              dropout=dropout, **kwargs).double()
    with torch.no_grad():  # a non-zero offset bias, so that a wrong offset shows
        dyn.position_bias.normal_()
    return dyn


def window(T, B, seed=1, firsts=()):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(T, B, E, generator=g, dtype=torch.float64)
    action = torch.randn(T, B, A, generator=g, dtype=torch.float64).clamp(-1, 1)
    is_first = torch.zeros(T, B, dtype=torch.bool)
    is_first[0] = True
    for t, b in firsts:
        is_first[t, b] = True
    return embed, action * ~is_first[..., None], is_first


# ---------------------------------------------------------------------------------------------- a plain reference
def plain_transformer(dyn, tokens, is_first):
    """The transformer on one sequence ``tokens (S, D)`` without cache or mask tensors: for each layer, each query
    ``t`` attends to the tokens ``p`` with ``t - L < p <= t`` and no ``is_first`` in ``(p, t]``, with the score
    bias ``position_bias[layer, h, t - p]``. Returns ``(deter (S, D), keys, values)``, the last two per layer
    ``(S, D)``."""
    S, D = tokens.shape
    H, L = dyn.heads, dyn.context
    d = D // H
    x, keys, values = tokens, [], []
    for layer, block in enumerate(dyn.blocks):
        q, k, v = block.query(x), block.key(x), block.value(x)
        keys.append(k)
        values.append(v)
        rows = []
        for t in range(S):
            seen = [p for p in range(S) if t - L < p <= t and not is_first[p + 1:t + 1].any()]
            heads = []
            for h in range(H):
                sl = slice(h * d, (h + 1) * d)
                scores = torch.stack([q[t, sl] @ k[p, sl] / math.sqrt(d) + dyn.position_bias[layer, h, t - p]
                                      for p in seen])
                heads.append(sum(w * v[p, sl] for w, p in zip(torch.softmax(scores, 0), seen)))
            rows.append(torch.cat(heads))
        attended = torch.stack(rows)
        x = block.attn_norm(x + block.out(attended))
        x = block.ffn_norm(x + block.ffn_out(F.relu(block.ffn_in(x))))
    return x, keys, values


def plain_tokens(dyn, prev_stoch, prev_action, is_first):
    """``stem(cat(z_{t-1}, a_{t-1}))`` with both zero where ``is_first``: ``(S, S_, K)``, ``(S, A)`` -> ``(S, D)``."""
    keep = (~is_first).to(prev_action.dtype)[:, None]
    return dyn.stem(torch.cat([prev_stoch.flatten(-2) * keep, prev_action * keep], -1))


def mode_latents(dyn, embed):
    """The posterior's mode ``(T, B, S, K)`` (what observe(sample=False) takes), from the posterior net alone."""
    logits = dyn.post_net(embed).unflatten(-1, (dyn.stoch, dyn.classes))
    return F.one_hot(logits.argmax(-1), dyn.classes).to(embed.dtype)


# ------------------------------------------------------------------------------------------------------- the mask
def test_attention_mask_written_out_by_hand():
    """T=5, L=3; column 0: episodes start at rows 0 and 3; column 1: no start, a cache before the window with its
    oldest slot invalid. Keys 0-2 are the cached tokens (positions -3, -2, -1), keys 3-7 the window's (0..4)."""
    is_first = torch.tensor([[1, 0], [0, 0], [0, 0], [1, 0], [0, 0]], dtype=torch.bool)
    carry_valid = torch.tensor([[1, 1, 1], [0, 1, 1]], dtype=torch.bool)  # column 0's is blocked by its is_first
    allowed, offsets = attention_mask(is_first, carry_valid, 3)
    expected = torch.tensor([
        # column 0: row 0 sees itself only; rows 1-2 the episode so far; row 3 starts over; row 4: rows 3-4
        [[0, 0, 0, 1, 0, 0, 0, 0],
         [0, 0, 0, 1, 1, 0, 0, 0],
         [0, 0, 0, 1, 1, 1, 0, 0],
         [0, 0, 0, 0, 0, 0, 1, 0],
         [0, 0, 0, 0, 0, 0, 1, 1]],
        # column 1: the last 3 tokens; row 0 reaches the cache's valid slots at -2 and -1, row 1 the one at -1
        [[0, 1, 1, 1, 0, 0, 0, 0],
         [0, 0, 1, 1, 1, 0, 0, 0],
         [0, 0, 0, 1, 1, 1, 0, 0],
         [0, 0, 0, 0, 1, 1, 1, 0],
         [0, 0, 0, 0, 0, 1, 1, 1]]], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    # offset t - p, p = j - 3, clamped into [0, 2]
    assert torch.equal(offsets, torch.tensor([[2, 2, 1, 0, 0, 0, 0, 0],
                                              [2, 2, 2, 1, 0, 0, 0, 0],
                                              [2, 2, 2, 2, 1, 0, 0, 0],
                                              [2, 2, 2, 2, 2, 1, 0, 0],
                                              [2, 2, 2, 2, 2, 2, 1, 0]]))


def test_each_rows_valid_is_what_the_next_token_may_attend():
    """Row t's ``valid`` (L=3 slots: tokens t-2, t-1, t) for the case above without the carry."""
    dyn = make()
    embed, action, is_first = window(5, 2, firsts=[(3, 0)])
    post, _ = dyn.observe(embed, action, is_first, sample=False)
    expected = torch.tensor([[[0, 0, 1], [0, 0, 1]],    # row 0: itself (the window starts at row 0 in both)
                             [[0, 1, 1], [0, 1, 1]],
                             [[1, 1, 1], [1, 1, 1]],
                             [[0, 0, 1], [1, 1, 1]],    # column 0 starts over at row 3
                             [[0, 1, 1], [1, 1, 1]]], dtype=torch.bool)
    assert torch.equal(post["valid"], expected)


# ------------------------------------------------------------------------------------------------------- observe
@pytest.mark.parametrize("context", [1, 3, 8])
def test_observe_equals_the_plain_transformer_per_sequence(context):
    """deter, the prior and every row's cache against :func:`plain_transformer` run per column (episode starts
    mid-window; L = 1: each token alone; L = 3 < T; L = 8 > T)."""
    dyn = make(context=context)
    T, B, L = 6, 3, context
    embed, action, is_first = window(T, B, firsts=[(3, 0), (2, 2), (5, 2)])
    post, prior = dyn.observe(embed, action, is_first, sample=False)
    z = mode_latents(dyn, embed)
    assert torch.equal(post["stoch"], z)
    for b in range(B):
        prev = torch.cat([torch.zeros_like(z[:1, b]), z[:-1, b]])
        deter, keys, values = plain_transformer(dyn, plain_tokens(dyn, prev, action[:, b], is_first[:, b]),
                                                is_first[:, b])
        torch.testing.assert_close(post["deter"][:, b], deter, rtol=0, atol=1e-12)
        prior_logits = dyn.prior_net(deter).unflatten(-1, (dyn.stoch, dyn.classes))
        torch.testing.assert_close(prior["logits"][:, b], prior_logits, rtol=0, atol=1e-12)
        for t in range(T):  # the cache after row t: slot j holds token t - L + 1 + j where it exists
            for j in range(L):
                p = t - L + 1 + j
                for layer in range(dyn.layers):
                    want_k = keys[layer][p] if p >= 0 else torch.zeros(dyn.deter, dtype=torch.float64)
                    want_v = values[layer][p] if p >= 0 else torch.zeros(dyn.deter, dtype=torch.float64)
                    torch.testing.assert_close(post["keys"][t, b, layer, j], want_k, rtol=0, atol=1e-12)
                    torch.testing.assert_close(post["values"][t, b, layer, j], want_v, rtol=0, atol=1e-12)
                same_episode = p >= 0 and not is_first[p + 1:t + 1, b].any()
                assert bool(post["valid"][t, b, j]) == same_episode, (t, b, j)


def test_is_first_blocks_attention_to_the_history_before_it():
    """Two columns with different histories before an is_first at row 3 and the same data from there: the same
    states from row 3 on (masked scores are exp(-inf) = 0 exactly, so the history adds nothing). Equal to 1e-12 in
    float64 rather than bit for bit: the batched products may sum the two columns in different orders (MKL's path
    depends on the CPU and on each batch element's memory alignment; one ulp, 2.2e-16, on an AMD EPYC), while any
    attention to the history moves the states by O(1), as row 2 shows."""
    dyn = make(context=4)
    embed, action, is_first = window(7, 2, firsts=[(3, 0), (3, 1)])
    embed[3:, 1], action[3:, 1] = embed[3:, 0], action[3:, 0]
    action[1:3, 1] = -action[1:3, 0]
    post, prior = dyn.observe(embed, action, is_first, sample=False)
    assert (post["deter"][2, 0] - post["deter"][2, 1]).abs().max() > 0.1  # the histories differ by O(1)
    for key in ("deter", "stoch", "logits"):
        torch.testing.assert_close(post[key][3:, 0], post[key][3:, 1], rtol=0, atol=1e-12, msg=key)
        torch.testing.assert_close(prior[key][3:, 0], prior[key][3:, 1], rtol=0, atol=1e-12, msg=key)


def test_observing_in_chunks_with_the_carry_equals_observing_at_once():
    """observe(rows 0-3) -> truncate -> observe(rows 4-8, state=carry) is observe(rows 0-8) (acting feeds one row
    at a time the same way)."""
    dyn = make(context=3)
    embed, action, is_first = window(9, 2, firsts=[(6, 1)])
    whole, _ = dyn.observe(embed, action, is_first, sample=False)
    head, _ = dyn.observe(embed[:4], action[:4], is_first[:4], sample=False)
    state, rows = dyn.truncate(head), []
    for t in range(4, 9):  # one row at a time, as the acting loop does
        post, _ = dyn.observe(embed[t:t + 1], action[t:t + 1], is_first[t:t + 1], state, sample=False)
        state = dyn.truncate(post)
        rows.append(state)
    for key in ("deter", "stoch", "logits", "keys", "values"):
        torch.testing.assert_close(torch.stack([r[key] for r in rows]), whole[key][4:], rtol=0, atol=1e-12)
    assert torch.equal(torch.stack([r["valid"] for r in rows]), whole["valid"][4:])
    tail, _ = dyn.observe(embed[4:], action[4:], is_first[4:], dyn.truncate(head), sample=False)  # 5 rows at once
    torch.testing.assert_close(tail["deter"], whole["deter"][4:], rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------------- imagine
def test_kv_cache_imagination_equals_the_full_sequence_without_cache():
    """From every row of a window (the episode restarting at row 2 in column 1), H = 5 > L = 3 imagined steps: each
    imagined deter equals :func:`plain_transformer` on the window's tokens up to that row followed by the imagined
    tokens (latents and actions as imagined); imagine equals img_step applied H times, draw for draw."""
    dyn = make(context=3)
    T, B, H = 4, 2, 5
    embed, action, is_first = window(T, B, firsts=[(2, 1)])
    post, _ = dyn.observe(embed, action, is_first, sample=False)
    start = dyn.starts(post)

    def policy(state):
        return torch.tanh(state["deter"][:, :A] * 3.0)

    torch.manual_seed(5)
    states, actions = dyn.imagine(policy, start, H)
    assert set(states) == {"deter", "stoch"} and states["deter"].shape == (H + 1, T * B, dyn.deter)
    torch.manual_seed(5)
    state, chained = start, [start["deter"]]
    for i in range(H):
        state = dyn.img_step(state, actions[i])
        chained.append(state["deter"])
        torch.testing.assert_close(state["stoch"], states["stoch"][i + 1], rtol=0, atol=0)
    torch.testing.assert_close(torch.stack(chained), states["deter"], rtol=0, atol=1e-12)
    z = post["stoch"]
    for t in range(T):
        for b in range(B):
            n = t * B + b  # start t*B + b comes from row t, column b
            latents = torch.cat([torch.zeros_like(z[:1, b]), z[:t + 1, b], states["stoch"][1:H, n]])  # z_{s-1}
            acts = torch.cat([action[:t + 1, b], actions[:H, n]])  # a_{s-1}
            firsts = torch.cat([is_first[:t + 1, b], torch.zeros(H, dtype=torch.bool)])
            deter, _, _ = plain_transformer(dyn, plain_tokens(dyn, latents, acts, firsts), firsts)
            torch.testing.assert_close(deter[t:], states["deter"][:, n], rtol=0, atol=1e-12)


def test_starts_carry_the_window_tokens_before_each_row():
    """starts(post, last) takes rows T-last..T-1 in time-major order, each with the cache of the tokens before it
    (the rows' own cache entries); last=0 takes every row; a last outside [0, T] is refused."""
    dyn = make(context=3)
    T, B = 5, 2
    post, _ = dyn.observe(*window(T, B), sample=False)
    start = dyn.starts(post, last=2)
    assert start["keys"].shape == (2 * B, dyn.layers, 3, dyn.deter) and start["keys"].is_contiguous()
    for k, v in post.items():
        for i, (t, b) in enumerate([(3, 0), (3, 1), (4, 0), (4, 1)]):
            assert torch.equal(start[k][i], v[t, b]), (k, t, b)
    # row 4's cache holds the keys of the tokens at rows 2, 3, 4 (an independent look: a shorter window ending there)
    short, _ = dyn.observe(*[x[2:] for x in window(T, B)], dyn.truncate(dyn.observe(*[x[:2] for x in window(T, B)],
                                                                               sample=False)[0]), sample=False)
    torch.testing.assert_close(start["keys"][2:], short["keys"][-1], rtol=0, atol=1e-12)
    assert all(v.shape[0] == T * B for v in dyn.starts(post).values())
    for last in (-1, T + 1):
        with pytest.raises(ValueError, match=r"last must be in \[0, T\] = \[0, 5\]"):
            dyn.starts(post, last)


@pytest.mark.parametrize("T,B", [(1, 1), (4, 3), (9, 2)])
def test_shapes(T, B):
    dyn = make(context=4)
    post, prior = dyn.observe(*window(T, B))
    L, D, layers = 4, dyn.deter, dyn.layers
    shapes = {"deter": (D,), "stoch": (3, 4), "logits": (3, 4), "keys": (layers, L, D), "values": (layers, L, D),
              "valid": (L,)}
    for state in (post, prior):
        assert {k: tuple(v.shape) for k, v in state.items()} == {k: (T, B, *s) for k, s in shapes.items()}
    assert dyn.features(post).shape == (T, B, D + 12) and dyn.feat_dim == D + 12
    for state, n in ((dyn.initial(B), B), (dyn.truncate(post), B), (dyn.starts(post), T * B),
                     (dyn.img_step(dyn.starts(post, 1), torch.zeros(B, A, dtype=torch.float64)), B)):
        assert {k: tuple(v.shape) for k, v in state.items()} == {k: (n, *s) for k, s in shapes.items()}
    states, actions = dyn.imagine(lambda s: torch.zeros(s["deter"].shape[0], A, dtype=torch.float64),
                                  dyn.starts(post), 3)
    assert states["deter"].shape == (4, T * B, D) and states["stoch"].shape == (4, T * B, 3, 4)
    assert actions.shape == (4, T * B, A)
    assert dyn.feature_keys == ("deter", "stoch") and dyn.loss_keys == ("dyn", "rep")


def test_loss_is_dreamers_kl_with_free_bits():
    dyn = make()
    embed, action, is_first = window(5, 2)
    post, prior = dyn.observe(embed, action, is_first)
    losses, info = dyn.loss(post, prior, action, is_first)
    want = kl_losses(post["logits"], prior["logits"], 1.0, 0.01)
    assert set(losses) == {"dyn", "rep"}
    for key in ("dyn", "rep"):
        torch.testing.assert_close(losses[key], want[key], rtol=0, atol=0)
    assert torch.all(losses["dyn"] >= 1.0) and set(info) == {"kl", "prior_entropy", "post_entropy"}
    losses["dyn"].sum().backward()  # dyn trains the prior (and, through the tokens, the posterior's samples)
    assert dyn.prior_net.weight.grad.abs().sum() > 0


def test_dropout_only_in_the_world_model_update():
    """In training mode with autograd: each observe draws its dropout; under no_grad (acting, reports) or in eval
    mode, and in img_step always, none (the same states twice)."""
    dyn = make(dropout=0.5)
    embed, action, is_first = window(5, 2)
    a, _ = dyn.observe(embed, action, is_first, sample=False)
    b, _ = dyn.observe(embed, action, is_first, sample=False)
    assert not torch.equal(a["deter"], b["deter"])
    with torch.no_grad():
        c, _ = dyn.observe(embed, action, is_first, sample=False)
        d, _ = dyn.observe(embed, action, is_first, sample=False)
    assert torch.equal(c["deter"], d["deter"])
    start = dyn.starts(c)
    x = dyn.img_step(start, torch.zeros(10, A, dtype=torch.float64), sample=False)
    y = dyn.img_step(start, torch.zeros(10, A, dtype=torch.float64), sample=False)
    assert torch.equal(x["deter"], y["deter"])
    dyn.eval()
    e, _ = dyn.observe(embed, action, is_first, sample=False)
    torch.testing.assert_close(e["deter"], c["deter"], rtol=0, atol=0)


def test_no_replay_context_and_bad_arguments_are_refused():
    dyn = make()
    assert dyn.context_spec() == {}
    with pytest.raises(NotImplementedError, match="agent.module.replay_context=0"):
        dyn.context_rows({})
    with pytest.raises(NotImplementedError, match="agent.module.replay_context=0"):
        dyn.context_state({})
    with pytest.raises(ValueError, match="heads=3 must divide the width deter=8"):
        make(heads=3)
    with pytest.raises(ValueError, match="context must be >= 1|and context must be >= 1"):
        make(context=0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        make(dropout=1.0)
    with pytest.raises(ValueError, match="kernels must be 'auto'"):
        make(kernels="fast")


# ------------------------------------------------------------------------------------------------------- kernels
def test_install_replaces_nothing_in_it():
    """There is no fast path for this dynamics: install swaps no module (the one-hot layers go only where a
    categorical RSSM's features are read) and observe gives the same states."""
    dyn = make()
    data = window(6, 2, firsts=[(3, 1)])
    plain, _ = dyn.observe(*data, sample=False)
    types = [type(m) for m in dyn.modules()]
    assert install(dyn, "auto") and [type(m) for m in dyn.modules()] == types
    fast, _ = dyn.observe(*data, sample=False)
    for key, value in plain.items():
        assert torch.equal(value, fast[key]), key


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_agent_kernels_auto_equals_off(discrete):
    """Whole DreamerV3 updates in float64 with this dynamics: kernels=auto (nothing to swap in: the same modules)
    and off give the same metrics and parameters after three updates."""
    spec = ActionSpec(discrete, 2)

    def run(kernels):
        torch.manual_seed(0)
        dynamics = partial(TransformerDynamics, deter=16, stoch=4, classes=4, layers=2, heads=2, context=4,
                           dropout=0.1, kernels=kernels)
        agent = DreamerV3({"vector": (4,)}, spec, dynamics=dynamics, units=16, layers=1, mlp_units=16, mlp_layers=1,
                          horizon=4, imag_last=3, precision="float64", kernels=kernels)
        metrics = []
        for i in range(3):
            batch = random_batch(8, 4, seed=i, p_first=0.1)
            if not discrete:
                batch["prev_action"] = np.random.default_rng(i).uniform(-1, 1, (8, 4, 2)).astype(np.float32) * \
                    ~batch["is_first"][..., None]
            torch.manual_seed(100 + i)
            metrics.append(agent.update(batch))
        return agent, metrics

    (fast, fast_metrics), (plain, plain_metrics) = run("auto"), run("off")
    assert [type(m) for m in fast.modules()] == [type(m) for m in plain.modules()]
    for a, b in zip(fast_metrics, plain_metrics):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
    for (name, p), q in zip(fast.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=name)


# -------------------------------------------------------------------------------------------------------- config
def test_dynamics_storm_selects_it_over_any_preset():
    cfg = load_config(["dynamics=storm"])
    dyn = cfg.agent.module.dynamics
    assert dyn._target_ == "reverie.models.dynamics.TransformerDynamics"
    assert (dyn.deter, dyn.units, dyn.layers, dyn.heads, dyn.context, dyn.dropout) == (256, None, 2, 8, 16, 0.1)
    assert cfg.agent.module.imag_last == 8 and cfg.agent.train_ratio == 128  # exp=classic's ratio stays
    dmc = load_config(["exp=dmc_cpu", "dynamics=storm"])
    assert dmc.agent.module.dynamics.deter == 128 and dmc.agent.batch_length == 32  # size xxs, the preset's batch
    paper = load_config(["dynamics=storm", "size=s"]).agent.module.dynamics  # STORM's widths
    assert (paper.deter, paper.stoch, paper.classes) == (512, 32, 32)


def test_naming_the_target_alone_builds_it_with_the_blocks_shared_keys():
    """``agent.module.dynamics._target_=...TransformerDynamics``: the categorical block's keys keep their meaning
    (width, latents, feed-forward width from ``units``), the rest are the class defaults (STORM's)."""
    from reverie.agents.build import build_agent

    cfg = load_config(["exp=debug", "agent.module.dynamics._target_=reverie.models.dynamics.TransformerDynamics"])
    dyn = build_agent(cfg.agent, {"vector": (4,)}, ActionSpec(True, 2)).wm.dynamics
    assert isinstance(dyn, TransformerDynamics)
    assert (dyn.deter, dyn.stoch, dyn.classes, dyn.units) == (32, 4, 4, 32)  # size=debug
    assert (dyn.layers, dyn.heads, dyn.context, dyn.dropout) == (2, 8, 64, 0.1)


def test_the_keys_of_another_dynamics_block_are_refused_with_the_fix():
    """``agent=dreamerv3_2025 dynamics=storm``: Hydra merges the transformer's keys into the block-GRU RSSM's block,
    so the 2025 block's own keys arrive too; they are refused by name, with the command that replaces the block."""
    cfg = load_config(["agent=dreamerv3_2025", "dynamics=storm", "exp=debug"])
    block = {k: v for k, v in cfg.agent.module.dynamics.items() if k not in ("_target_", "_partial_")}
    with pytest.raises(ValueError, match=r"\['blocks', 'dynlayers', 'hidden', 'imglayers', 'obslayers', 'outscale'\]"
                                         r".*'~agent.module.dynamics'.*replay_context=0"):
        TransformerDynamics(action_dim=2, embed_dim=8, **block)
    TransformerDynamics(action_dim=2, embed_dim=8, deter=16, stoch=4, classes=4, heads=2, context=4)  # its own keys


# ------------------------------------------------------------------------------- STORM's positions and its context
def make_absolute(context=4, episode_mask=True):
    torch.manual_seed(0)
    return TransformerDynamics(A, E, deter=8, stoch=3, classes=4, layers=2, heads=2, context=context, dropout=0.0,
                               positions="absolute", episode_mask=episode_mask).double()


def test_absolute_positions_continue_one_row_at_a_time_and_rerun_a_full_cache():
    """positions=absolute (STORM's learned embedding + LayerNorm): acting one row at a time equals the window
    observed at once while it fits in L (each token at its index in the episode); once the cache is full, a step
    is the last L tokens run again at positions 0..L-1 (STORM's acting re-runs its context); imagination past L
    equals img_step applied H times; a window longer than L is refused."""
    L = 4
    dyn = make_absolute(context=L)
    embed, action, is_first = window(8, 2, firsts=[(2, 1)])
    whole, _ = dyn.observe(embed[:L], action[:L], is_first[:L], sample=False)
    state, rows = dyn.initial(2), []
    for t in range(8):
        post, _ = dyn.observe(embed[t:t + 1], action[t:t + 1], is_first[t:t + 1], state, sample=False)
        state = dyn.truncate(post)
        rows.append(state)
        if t >= L:  # column 0: the cache was full; its step is the last L tokens from nothing
            tokens = state["tokens"].transpose(0, 1)  # (B, L, D) -> (L, B, D)
            again, _ = dyn._transform(tokens, torch.zeros(L, 2, dtype=torch.bool), dyn.initial(2))
            torch.testing.assert_close(state["deter"][0], again[-1, 0], rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.stack([r["deter"] for r in rows[:L]]), whole["deter"], rtol=0, atol=1e-12)
    assert int(rows[2]["valid"][1].sum()) == 1  # column 1's episode restarts at row 2: position 0 again
    start = dyn.starts(whole)

    def policy(s):
        return torch.tanh(s["deter"][:, :A] * 3.0)

    torch.manual_seed(5)
    states, actions = dyn.imagine(policy, start, 3)  # past L for the later rows: img_step's re-runs
    torch.manual_seed(5)
    s, chained = start, [start["deter"]]
    for i in range(3):
        s = dyn.img_step(s, actions[i])
        chained.append(s["deter"])
    torch.testing.assert_close(torch.stack(chained), states["deter"], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="needs context >= 5"):
        dyn.observe(*window(5, 2), sample=False)
    with pytest.raises(ValueError, match="positions must be one of"):
        TransformerDynamics(A, E, deter=8, heads=2, positions="rotary")


def test_without_the_episode_mask_attention_crosses_is_first():
    """episode_mask=false (STORM's context): a query after an is_first attends to the tokens before it, which the
    default mask blocks; the rest of the mask is the same."""
    is_first = torch.zeros(4, 1, dtype=torch.bool)
    is_first[0] = is_first[2] = True
    masked, _ = attention_mask(is_first, torch.zeros(1, 3, dtype=torch.bool), 3)
    crossing, _ = attention_mask(is_first, torch.zeros(1, 3, dtype=torch.bool), 3, episodes=False)
    assert not masked[0, 2, 3 + 1] and crossing[0, 2, 3 + 1]  # row 2 attends to row 1 only without the mask
    assert torch.equal(masked | crossing, crossing) and int((crossing & ~masked).sum()) == 3
