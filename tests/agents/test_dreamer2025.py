"""The current official DreamerV3 (agent=dreamerv3_2025, danijar/dreamerv3 at e3f0224): symexp two-hot heads, the
replay value loss, REINFORCE for continuous actions, the continue target, gradient routing of the one loss, the
guard, and `reverie train` on vector and image, discrete and continuous envs."""

import json
import math

import numpy as np
import pytest
import torch

from reverie.agents import DreamerV3_2025
from reverie.agents.dreamer2025 import LOSS_SCALES, replay_is_last, replay_returns
from reverie.cli import main
from reverie import load_run, make_env
from reverie.models.distributions import TwoHotSymexp, TwoHotSymlog, symexp
from reverie.agents.optim import LaProp
from reverie.types import ActionSpec

TINY = dict(dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4), units=8, horizon=3, precision="float32")


def batch(T=6, B=3, A=2, discrete=True, seed=0):
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[3, 1] = True
    is_last = np.roll(is_first, -1, 0)
    actions = np.eye(A, dtype=np.float32)[rng.integers(A, size=(T, B))] if discrete else \
        rng.uniform(-1, 1, (T, B, A)).astype(np.float32)
    return {"vector": rng.normal(size=(T, B, 4)).astype(np.float32), "prev_action": actions * ~is_first[..., None],
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first, "is_last": is_last,
            "is_terminal": is_last.copy()}


# ------------------------------------------------------------------------------------------- symexp two-hot
def test_symexp_two_hot_encodes_values_in_their_own_space():
    logits = torch.linspace(-1.0, 1.0, 255)[None]  # (1, 255)
    dist = TwoHotSymexp(logits)
    bins = dist.bins
    assert torch.equal(bins, -bins.flip(0)) and bins[127] == 0 and torch.equal(bins, symexp(TwoHotSymlog(logits).bins))
    b1 = math.expm1(20 / 127)  # the first bin above 0: symexp(40 / 254)
    torch.testing.assert_close(bins[128], torch.tensor(b1), rtol=1e-6, atol=0)
    logp = torch.log_softmax(logits[0], -1)
    w = 0.1 / b1  # 0.1 lies between bins 127 (0) and 128 (b1): weight linear in the value itself
    torch.testing.assert_close(dist.log_prob(torch.tensor([0.1])), (1 - w) * logp[127:128] + w * logp[128:129],
                               rtol=1e-6, atol=0)
    # the 2023 head interpolates symlog(0.1) = 0.0953 between the symlog-space bins 0 and 20/127
    w23 = math.log1p(0.1) / (20 / 127)
    torch.testing.assert_close(TwoHotSymlog(logits).log_prob(torch.tensor([0.1])),
                               (1 - w23) * logp[127:128] + w23 * logp[128:129], rtol=1e-6, atol=0)
    # mean: sum(p * bins), no symexp afterwards; 0 for uniform logits
    torch.testing.assert_close(dist.mean, (torch.softmax(logits, -1) * bins).sum(-1), rtol=1e-5, atol=0)
    assert TwoHotSymexp(torch.zeros(2, 255)).mean.abs().max() == 0


# ------------------------------------------------------------------------------------------ replay value loss
def test_replay_returns_by_hand():
    reward = torch.tensor([[0.0], [1.0], [2.0], [3.0]])  # (K, B) = (4, 1)
    boot = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    zeros = torch.zeros(4, 1, dtype=torch.bool)
    ret = replay_returns(reward, boot, zeros, zeros, gamma=0.5, lam=0.5)
    # R3 = 40; R2 = 3 + 0.5 (0.5 * 40 + 0.5 * 40) = 23; R1 = 2 + 0.5 (0.5 * 30 + 0.5 * 23) = 15.25;
    # R0 = 1 + 0.5 (0.5 * 20 + 0.5 * 15.25) = 9.8125
    torch.testing.assert_close(ret[:, 0], torch.tensor([9.8125, 15.25, 23.0]), rtol=0, atol=0)
    term = zeros.clone()
    term[2] = True  # row 2 terminal: R1 = r2 only; R0 = 1 + 0.5 (0.5 * 20 + 0.5 * 2) = 6.5
    torch.testing.assert_close(replay_returns(reward, boot, term, zeros, 0.5, 0.5)[:2, 0], torch.tensor([6.5, 2.0]))
    last = zeros.clone()
    last[2] = True  # row 2 ends the episode (time limit): R1 = 2 + 0.5 * boot2 = 17; R0 = 1 + 0.5 (10 + 8.5) = 10.25
    torch.testing.assert_close(replay_returns(reward, boot, zeros, last, 0.5, 0.5)[:2, 0], torch.tensor([10.25, 17.0]))


def test_replay_is_last_marks_rows_before_is_first():
    is_first = torch.tensor([[True, False], [False, True], [False, False], [True, False]])
    is_last = torch.tensor([[False, False], [False, False], [True, False], [False, True]])
    want = torch.tensor([[False, True], [False, False], [True, False], [False, True]])
    assert torch.equal(replay_is_last(is_last, is_first), want)


def fixed_critic(agent, logits):
    """Critic and slow critic output ``logits`` (255,) for every input: zero output weights, bias = logits."""
    for net in (agent.critic, agent.slow_critic):
        with torch.no_grad():
            net.out.weight.zero_()
            net.out.bias.copy_(logits)


def two_hot_logp(logp, bins, x):
    """log-likelihood of x under log-probs ``logp`` over ``bins`` (numpy float64), written out."""
    i = int(np.searchsorted(bins, x, side="right")) - 1
    w = (x - bins[i]) / (bins[i + 1] - bins[i])
    return (1 - w) * logp[i] + w * logp[i + 1]


def test_replay_value_loss_on_a_tiny_example():
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), gamma=0.5, lam=0.5, slow_reg=0.5, **TINY)
    logits = torch.linspace(-3.0, 3.0, 255)
    fixed_critic(agent, logits)
    last = torch.tensor([[False], [False], [True], [False]])
    rows = {"feat": torch.randn(4, 1, agent.wm.dynamics.feat_dim, requires_grad=True),
            "reward": torch.tensor([[0.0], [1.0], [2.0], [3.0]]), "is_terminal": torch.zeros(4, 1, dtype=torch.bool),
            "is_last": last, "boot": torch.tensor([[10.0], [20.0], [30.0], [40.0]])}
    loss = agent._replay_value_loss(rows)  # (K-1, B)
    logp = torch.log_softmax(logits.double(), -1).numpy()
    bins = TwoHotSymexp(logits[None]).bins.double().numpy()
    slow = float((np.exp(logp) * bins).sum())  # the slow critic's prediction (same logits)
    # returns by hand (test_replay_returns_by_hand): R0 = 10.25, R1 = 17 (row 2 is last); row 2 has weight 0
    want = [-(two_hot_logp(logp, bins, r) + 0.5 * two_hot_logp(logp, bins, slow)) for r in (10.25, 17.0)]
    torch.testing.assert_close(loss[:, 0].double(), torch.tensor(want + [0.0], dtype=torch.float64), rtol=1e-5, atol=0)
    loss.sum().backward()
    assert rows["feat"].grad is not None  # repval_grad: True, the loss reaches the features (fixed critic: zero)


# --------------------------------------------------------------------------------- REINFORCE, continuous actions
def test_reinforce_continuous_actor_loss_against_a_written_out_reference():
    torch.manual_seed(0)
    A, H, N = 2, 3, 5
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(False, A), lam=0.8, **TINY)
    with torch.no_grad():
        agent.critic.out.weight.normal_(0.0, 0.3)  # a nonzero value
    F_ = agent.wm.dynamics.feat_dim
    imag = {"feat": torch.randn(H + 1, N, F_), "action": 1.5 * torch.randn(H + 1, N, A),
            "reward": 100.0 * torch.randn(H + 1, N), "cont": torch.rand(H + 1, N) * 0.5 + 0.5,
            "slow": torch.randn(H, N)}  # the value targets: rows t < H
    rollout = dict(imag)
    losses = agent._imagination_losses(rollout)
    # ---- reference, step by step ----
    feat, act, rew, cont = imag["feat"], imag["action"], imag["reward"], imag["cont"]
    with torch.no_grad():
        value = TwoHotSymexp(agent.critic(feat)).mean
    ret = [value[H]]
    for t in reversed(range(H)):  # contdisc: gamma 1 in the return, the continue probabilities discount
        ret.insert(0, rew[t + 1] + cont[t + 1] * (0.2 * value[t + 1] + 0.8 * ret[0]))
    ret = torch.stack(ret[:-1])  # (H, N)
    weight = torch.stack([torch.prod(cont[:t + 1], 0) for t in range(H)])  # cumprod, from the start's own cont
    q = np.percentile(ret.double().numpy(), [5, 95])  # the normaliser's EMAs start at 0: 0.01 x the percentiles
    scale = max(1.0, 0.01 * (q[1] - q[0]))
    assert scale > 1.0
    adv = (ret - value[:H]) / scale
    out = agent.actor.net(feat[:H])
    mean, std = torch.tanh(out[..., :A]), 0.9 * torch.sigmoid(out[..., A:] + 2.0) + 0.1
    logpi = (-0.5 * ((act[:H] - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    entropy = (0.5 * torch.log(2 * math.pi * math.e * std ** 2)).sum(-1)
    want = -weight * (logpi * adv + 3e-4 * entropy)
    torch.testing.assert_close(losses["policy"], want, rtol=1e-4, atol=1e-5)
    # the update's scale (stored by the optimiser step when it is taken: the normaliser has not moved yet)
    assert float(agent.retnorm.high) == float(agent.retnorm.low) == 0.0
    torch.testing.assert_close(agent.retnorm.scale(rollout["retnorm"]), torch.tensor(scale, dtype=torch.float32), rtol=1e-5, atol=0)
    # REINFORCE: the gradient reaches the actor through log pi only (the actions and the advantage are constants)
    grads = torch.autograd.grad(losses["policy"].mean(), list(agent.actor.parameters()))
    want_grads = torch.autograd.grad(want.mean(), list(agent.actor.parameters()))
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------------------------------- the world model
def test_continue_target_carries_the_discount():
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    with torch.no_grad():
        agent.wm.cont_head.out.weight.zero_()
        agent.wm.cont_head.out.bias.fill_(2.0)
    data = agent.wm.tensors(batch())
    losses, *_ = agent.wm.loss(data)
    t = 1 - 1 / 333  # contdisc: (1 - is_terminal) * (1 - 1/horizon)
    live = -(t * math.log(1 / (1 + math.exp(-2))) + (1 - t) * math.log(1 / (1 + math.exp(2))))
    dead = -math.log(1 / (1 + math.exp(2)))
    want = torch.where(data["is_terminal"], torch.tensor(dead), torch.tensor(live))
    torch.testing.assert_close(losses["cont"], want, rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------------------- the one update
def grads_after_update(scales, discrete=True):
    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(discrete, 2), loss_scales=scales, **TINY)
    with torch.no_grad():
        agent.critic.out.weight.normal_(0.0, 0.3)
    agent.update(batch(discrete=discrete))  # warmup: step 1 has learning rate 0, the gradients stay on .grad

    def norm(module):
        return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)
    return {"wm": norm(agent.wm), "encoder": norm(agent.wm.encoder), "actor": norm(agent.actor),
            "critic": norm(agent.critic)}


@pytest.mark.parametrize("discrete", [True, False])
def test_gradients_reach_what_the_official_losses_train(discrete):
    off = {k: 0.0 for k in LOSS_SCALES}
    policy = grads_after_update(off | {"policy": 1.0}, discrete)
    assert policy["actor"] > 0 and policy["wm"] == 0 and policy["critic"] == 0  # imagined features are constants
    value = grads_after_update(off | {"value": 1.0}, discrete)
    assert value["critic"] > 0 and value["wm"] == 0 and value["actor"] == 0
    repval = grads_after_update(off | {"repval": 1.0}, discrete)
    assert repval["critic"] > 0 and repval["encoder"] > 0 and repval["actor"] == 0  # repval_grad: True
    # the continue head (the reward head's zero output layer passes no gradient back at the first step)
    model = grads_after_update(off | {"cont": 1.0}, discrete)
    assert model["encoder"] > 0 and model["actor"] == 0 and model["critic"] == 0


def test_one_laprop_over_every_trained_parameter():
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    assert isinstance(agent.opt, LaProp) and agent.optimizers == ("opt",)
    opt_params = {id(p) for g in agent.opt.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in [*agent.wm.parameters(), *agent.actor.parameters(),
                                          *agent.critic.parameters()]}
    assert not opt_params & {id(p) for p in agent.slow_critic.parameters()}
    g = agent.opt.param_groups[0]
    assert (g["lr"], g["agc"], g["eps"], g["beta1"], g["beta2"], g["warmup"]) == (4e-5, 0.3, 1e-20, 0.9, 0.999, 1000)
    assert LOSS_SCALES == {"rec": 1.0, "reward": 1.0, "cont": 1.0, "dyn": 1.0, "rep": 0.1, "policy": 1.0,
                           "value": 1.0, "repval": 0.3, "barlow": 0.05, "infonce": 1.0}  # + R2-Dreamer's _base_.yaml
    assert agent.loss_scales == {"vector": 1.0, "reward": 1.0, "cont": 1.0, "dyn": 1.0, "rep": 0.1, "policy": 1.0,
                                 "value": 1.0, "repval": 0.3}  # rec spread over the decoded keys, the rest dropped


def test_output_scales_of_policy_and_value():
    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 3), units=64,
                           dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4))
    assert agent.critic.out.weight.abs().max() == 0 and agent.wm.reward_head.out.weight.abs().max() == 0
    w = agent.actor.net.out.weight  # trunc normal * 1.1368 / sqrt(64) * 0.01
    assert w.abs().max() <= 0.01 * 2 * 1.1368 / 8 and w.abs().max() > 0


def test_imag_last_starts_from_the_last_rows_and_the_slow_value_follows():
    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), imag_last=2, warmup=0, **TINY)
    seen = {}
    imagine = agent._imagine
    agent._imagine = lambda start: seen.setdefault("start", start) and imagine(start)
    replay = agent._replay_value_loss
    agent._replay_value_loss = lambda rows: seen.setdefault("rows", rows) is not None and replay(rows)
    slow_before = [p.clone() for p in agent.slow_critic.parameters()]
    metrics = agent.update(batch(T=6, B=3))
    assert seen["start"]["deter"].shape == (2 * 3, 16)  # K*B starts, row-major over (K, B)
    torch.testing.assert_close(seen["start"]["deter"].view(2, 3, 16), seen["rows"]["feat"][..., :16].detach())
    assert seen["rows"]["boot"].shape == (2, 3)
    fast = list(agent.critic.parameters())
    for before, slow, f in zip(slow_before, agent.slow_critic.parameters(), fast):
        torch.testing.assert_close(slow, before + 0.02 * (f - before), rtol=1e-6, atol=1e-7)
    assert metrics["guard/nonfinite"] == 0
    with pytest.raises(ValueError, match="imag_last"):
        DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), imag_last=1, **TINY)


def test_nonfinite_batch_changes_nothing():
    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), warmup=0, **TINY)
    agent.update(batch())
    before = {k: v.clone() if torch.is_tensor(v) else v for k, v in agent.state_dict()["modules"].items()}
    steps = agent.opt.state[next(iter(agent.wm.parameters()))]["step"]
    bad = batch()
    bad["reward"][2, 1] = np.nan
    metrics = agent.update(bad)
    assert metrics["guard/nonfinite"] == 1
    after = agent.state_dict()["modules"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # parameters, slow value, normaliser
    assert agent.opt.state[next(iter(agent.wm.parameters()))]["step"] == steps


# ----------------------------------------------------------------------------------------- reverie train
def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


IMAGE = ["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv", "+env.kwargs.size=16", "+env.kwargs.length=10"]


@pytest.mark.parametrize("env", [["env=cartpole"], ["env=pendulum"], IMAGE, [*IMAGE, "+env.kwargs.discrete=false"]],
                         ids=["vector-discrete", "vector-continuous", "image-discrete", "image-continuous"])
def test_reverie_train_runs_the_current_agent(tmp_path, env):
    run_dir = tmp_path / "run"
    assert main(["train", "agent=dreamerv3_2025", "exp=debug", f"run_dir={run_dir}", *env, "train.steps=96",
                 "train.eval_episodes=1"]) == 0
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[-1]["updates"] > 0
    losses = ("loss/policy", "loss/value", "loss/repval", "loss/dyn", "loss/rep", "loss/reward", "loss/cont")
    assert any(all(k in m and np.isfinite(m[k]) for k in losses) for m in metrics)
    run = load_run(run_dir)
    assert type(run.agent).__name__ == "DreamerV3_2025"
    envs = make_env(run.config["env"], seed=0)
    obs, _ = envs.reset()
    action, _ = run.act(obs)
    assert envs.action_space.contains(action)


def test_policy_mean_and_std_and_each_decoded_key_have_their_own_output_tensors():
    """AGC clips every tensor by its own norm (official opt.py clip_by_agc), so the tensors are the official ones:
    bounded_normal's `mean` and `stddev` layers (heads.py:146-148) and one `pred` layer per vector key in the
    decoder's DictHead (rssm.py:297-305); a discrete policy has one `logits` layer (heads.py:101-110)."""
    from reverie.agents.optim import agc_clip_
    from reverie.models.rms_mlp import Dense, SplitDense

    torch.manual_seed(0)
    agent = DreamerV3_2025({"a": (3,), "b": (2,)}, ActionSpec(False, 2), **TINY)
    actor_out, dec_out = agent.actor.net.out, agent.wm.decoder.out
    assert isinstance(actor_out, SplitDense) and actor_out.widths == (2, 2)  # mean, std
    assert isinstance(dec_out, SplitDense) and dec_out.widths == (3, 2)  # keys a, b (sorted)
    names = {n for n, _ in agent.named_parameters()}
    assert {"actor.net.out.parts.0.weight", "actor.net.out.parts.1.weight",  # the decoders: the objective's
            "wm.representation.decoder.out.parts.0.weight", "wm.representation.decoder.out.parts.1.weight"} <= names
    ids = {id(p) for g in agent.opt.param_groups for p in g["params"]}
    assert all(id(p) in ids for p in actor_out.parameters()) and all(id(p) in ids for p in dec_out.parameters())
    x = torch.randn(5, 8)
    torch.testing.assert_close(actor_out(x), torch.cat([actor_out.parts[0](x), actor_out.parts[1](x)], -1))
    discrete = DreamerV3_2025({"a": (3,)}, ActionSpec(True, 2), **TINY)
    assert isinstance(discrete.actor.net.out, Dense) and not isinstance(discrete.actor.net.out, SplitDense)
    # per tensor: a large gradient on the std layer is clipped, the mean layer's small one is not
    params = [p.detach().clone() for p in (actor_out.parts[0].weight, actor_out.parts[1].weight)]
    for p in params:
        p.fill_(1.0)  # ||p|| = 4 (2 x 8 ones)
    grads = [torch.full_like(params[0], 0.01), torch.full_like(params[1], 10.0)]
    agc_clip_(params, grads, 0.3)
    torch.testing.assert_close(grads[0], torch.full_like(params[0], 0.01))  # ||g|| 0.04 <= 0.3 * 4
    torch.testing.assert_close(grads[1].norm(), torch.tensor(0.3 * 4.0))  # ||g|| 40 -> 1.2


def test_official_dmc_proprio_preset_has_the_official_values():
    """exp=official_dmc_proprio: dreamerv3/configs.yaml:178-182 of e3f0224 (size1m, train_ratio 1024, 1.1e6 steps)
    with the defaults it keeps (16 envs, batch 16 x 64, replay 5e6, DMC action repeat 1, replay_context 1, online
    queue on)."""
    from reverie.configs.compose import load_config

    cfg = load_config(["agent=dreamerv3_2025", "exp=official_dmc_proprio", "env=dmc_proprio"])
    size = cfg.size
    assert (size.deter, size.hidden, size.classes, size.units, size.cnn_depth) == (512, 64, 4, 64, 4)
    assert (cfg.agent.train_ratio, cfg.agent.batch_size, cfg.agent.batch_length) == (1024, 16, 64)
    assert cfg.agent.module.replay_context == 1 and cfg.agent.replay_online is True
    assert (cfg.env.suite, cfg.env.task, cfg.env.action_repeat, cfg.env.num_envs, cfg.env.image) == \
        ("dmc", "walker_walk", 1, 16, False)
    assert (cfg.replay.capacity, cfg.train.steps, cfg.train.prefill) == (5_000_000, 1_100_000, 0)
    assert cfg.agent.module.dynamics.deter == 512 and cfg.agent.module.units == 64


def test_policy_lag_acts_with_the_parameters_from_before_the_first_update_after_the_last_refresh():
    """The official acting copy: act P1 (v0); updates T1, T2 (pending = v0, the parameters T1 starts from); act P2
    (acts with v0, then takes v0); updates T3, T4 (pending = v2); act P3 acts with v0, then takes v2; update T5
    (pending = v4); act P4 acts with v2. Each act equals a fresh agent loaded with those parameters."""
    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, ActionSpec(False, 2), **TINY, lr=1e-2, warmup=0, policy_lag=True)
    reference = DreamerV3_2025({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    obs = {"vector": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "is_first": np.ones(3, bool)}

    def params() -> dict:
        return {k: v.clone() for k, v in torch.nn.Module.state_dict(agent).items() if k.startswith(("wm.", "actor."))}

    def acts_as(snapshot: dict) -> bool:
        torch.nn.Module.load_state_dict(reference, snapshot, strict=False)
        torch.manual_seed(5)
        mine = agent.act(obs, None, "sample")[0]
        torch.manual_seed(5)
        return np.array_equal(mine, reference.act(obs, None, "sample")[0])

    v = [params()]
    assert acts_as(v[0])  # P1
    for _ in range(2):  # T1, T2
        agent.update(batch(discrete=False))
        v.append(params())
    assert acts_as(v[0])  # P2 acts with v0 (the copy), then takes v0
    for _ in range(2):  # T3, T4
        agent.update(batch(discrete=False))
        v.append(params())
    assert acts_as(v[0])  # P3 acts with v0, then takes v2
    agent.update(batch(discrete=False))  # T5 (pending = v4)
    v.append(params())
    assert acts_as(v[2])  # P4: the copy took v2 after P3
    assert not acts_as(v[0])  # P5 acts with v4, not v0: the acts above tell the parameters apart


def test_policy_lag_off_acts_with_the_trained_parameters_and_on_saves_its_copies():
    torch.manual_seed(0)
    plain = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), **TINY)
    assert plain.policy_lag is None and not any(k.startswith("policy_lag.") for k in plain.state_dict()["modules"])
    lagging = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), **TINY, policy_lag=True)
    keys = lagging.state_dict()["modules"]
    assert "policy_lag.pending" in keys and "policy_lag.actor.net.out.weight" in keys
    assert not any(p is q for p in lagging.trainable() for q in lagging.policy_lag.parameters())
