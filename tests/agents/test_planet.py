"""PlaNet agent: updates, acting in bounds, checkpoints, config errors, and `reverie train exp=debug agent=planet`."""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from reverie import PlaNet, load_run
from reverie.cli import main
from reverie.models.conv import ConvEncoder
from reverie.models.networks import MLP
from reverie.types import ActionSpec
from helpers.agents import planet

TINY = planet(layers=1, horizon=3, candidates=20, top_k=4, iterations=2, cnn_depth=4)
# exp=debug shrinks PlaNet through configs/agent_exp/planet_debug.yaml (3 updates per cycle, tiny model and CEM)
DEBUG_PLANET = ["agent=planet"]


def batch(T=6, B=3, F=4, A=2, discrete=False, seed=0):
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    action = np.eye(A, dtype=np.float32)[rng.integers(A, size=(T, B))] if discrete else rng.uniform(-1, 1, (T, B, A))
    return {"vector": rng.normal(size=(T, B, F)).astype(np.float32),
            "prev_action": (action * ~is_first[..., None]).astype(np.float32),
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}


@pytest.mark.parametrize("discrete", [True, False])
def test_update_and_act(discrete):
    torch.manual_seed(0)
    agent = PlaNet({"vector": (4,)}, ActionSpec(discrete, 2), **{**TINY, **planet(overshooting=2)})
    before = [p.detach().clone() for p in agent.wm.parameters()]
    metrics = agent.update(batch(discrete=discrete))
    for key in ("loss/vector", "loss/reward", "loss/cont", "loss/kl", "loss/global_kl", "loss/overshooting",
                "loss/model", "grad_norm/model", "kl"):
        assert np.isfinite(metrics[key]), key
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.wm.parameters()))
    obs = {"vector": np.zeros((5, 4), np.float32), "is_first": np.ones(5, bool)}
    for mode in ("explore", "eval", "sample"):
        action, state = agent.act(obs, None, mode)
        assert action.shape == (5, 2) and action.dtype == np.float32
        if discrete:
            assert np.all(action.sum(-1) == 1.0) and set(np.unique(action)) <= {0.0, 1.0}
        else:
            assert np.all(np.abs(action) <= 1.0)
        obs["is_first"] = np.zeros(5, bool)
        action, state = agent.act(obs, state, mode)
        assert action.shape == (5, 2)
    with pytest.raises(ValueError, match="mode"):
        agent.act(obs, None, "greedy")


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    a.update(batch())
    b = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    b.load_state_dict(a.state_dict())
    torch.manual_seed(1)
    ma = a.update(batch(seed=1))
    torch.manual_seed(1)
    mb = b.update(batch(seed=1))
    assert ma == mb


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("env", [
    ["env=cartpole"],  # Discrete, vector
    ["env=pendulum"],  # Box, vector
    ["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv", "+env.kwargs.size=64", "+env.kwargs.length=10",
     "+env.kwargs.discrete=false", "env.num_envs=2"],  # Box, 64x64 images: conv_ha
    ["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv", "+env.kwargs.size=16", "+env.kwargs.length=10",
     "env.num_envs=2", "agent.module.planet_dreamer_nets=true"],  # Discrete, 16x16 images: the DreamerV3 stack
], ids=["discrete-vector", "continuous-vector", "continuous-image", "discrete-image-dreamer-nets"])
def test_smoke_debug_planet(tmp_path, env):
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", *DEBUG_PLANET, *env, "train.steps=120",
                 "env.time_limit=20"]) == 0
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[-1]["updates"] > 0 and metrics[-1]["updates"] % 3 == 0  # whole cycles of train_steps
    assert any("loss/kl" in m and np.isfinite(m["loss/model"]) for m in metrics)
    scores = read_jsonl(run_dir / "scores.jsonl")
    assert {s["mode"] for s in scores} == {"train", "eval"}
    run = load_run(run_dir)
    assert isinstance(run.agent, PlaNet)


def test_presets_resolve_per_agent_and_agent_planet_builds_under_the_default_preset():
    from reverie.configs.compose import check_setup, load_config

    repeats = {task: load_config(["exp=planet_dmc", f"env.task={task}"]).env.action_repeat
               for task in ("cartpole_swingup", "cheetah_run", "walker_walk", "hopper_hop")}
    assert repeats == {"cartpole_swingup": 8, "cheetah_run": 4, "walker_walk": 2, "hopper_hop": 2}
    cfg = load_config(["agent=planet", "env=pendulum"])  # exp=classic -> agent_exp/planet_classic.yaml
    assert cfg.agent.name == "planet" and cfg.env.id == "Pendulum-v1" and cfg.agent.schedule == "episodes"
    assert (cfg.agent.module.dynamics.deter, cfg.agent.module.candidates, cfg.env.action_repeat) == (100, 150, 4)
    # the CPU preset's documented departures: 2 x 100 heads, reward scale 1 (agent_exp/planet_classic.yaml)
    assert (cfg.agent.module.head_units, cfg.agent.module.head_layers, cfg.agent.module.reward_scale) == (100, 2, 1.0)
    assert (cfg.agent.module.act, cfg.agent.module.planet_dreamer_nets) == ("relu", False)
    assert "actor_lr" not in cfg.agent.module  # DreamerV3's classic learning rates stay with DreamerV3
    dreamer = load_config([])  # exp=classic -> agent_exp/dreamerv3_classic.yaml
    assert (dreamer.agent.train_ratio, dreamer.agent.module.critic_lr) == (128, 1.0e-3)
    assert load_config(["agent=planet", "exp=debug"]).agent.module.dynamics.deter == 16
    check_setup(load_config(["agent=planet", "env=pendulum"]))  # builds env and agent without error


def reference_agent(overrides=(), obs_shapes=None):
    """The agent that `agent=planet exp=reference` builds (the reference's values, no CPU preset)."""
    from reverie.configs.compose import load_config
    from reverie.agents.build import build_agent

    cfg = load_config(["agent=planet", "exp=reference", "device=cpu", *overrides])
    return cfg, build_agent(cfg.agent, obs_shapes or {"image": (3, 64, 64)}, ActionSpec(False, 6))


def test_agent_planet_builds_the_reference_networks_and_loss_scales():
    """google-research/planet scripts/configs.py: activation relu for the RSSM and the heads (109, 136), reward head
    3 x 300 (110-116), reward loss scale 10 (186), conv_ha (108), the RSSM's GRUBlockCell (rssm.py:55)."""
    from reverie.models.planet_nets import BlockGRUCell, ConvHaDecoder, ConvHaEncoder, FeedForward

    torch.manual_seed(0)
    cfg, agent = reference_agent()
    assert cfg.agent.module.reward_scale == 10.0 and agent.loss_scales["reward"] == 10.0
    assert agent.loss_scales["image"] == agent.loss_scales["kl"] == 1.0 and agent.loss_scales["global_kl"] == 0.0
    wm = agent.wm
    assert isinstance(wm.dynamics.act, nn.ReLU) and isinstance(wm.dynamics.prior_net[1], nn.ReLU)
    assert isinstance(wm.dynamics.gru, BlockGRUCell) and wm.dynamics.gru.hidden_size == 200
    assert (wm.dynamics.deter, wm.dynamics.stoch, wm.dynamics.in_z.out_features,
            wm.dynamics.min_std) == (200, 30, 200, 0.1)
    assert isinstance(wm.image_encoder, ConvHaEncoder) and wm.image_encoder.out_dim == 1024
    assert isinstance(wm.image_decoder, ConvHaDecoder) and wm.dynamics.post_e.in_features == 1024
    for head in (wm.reward_head, wm.cont_head):
        assert isinstance(head, FeedForward)
        assert [m.out_features for m in head.modules() if isinstance(m, nn.Linear)] == [300, 300, 300, 1]
        assert sum(isinstance(m, nn.ReLU) for m in head.modules()) == 3
    assert not any(isinstance(m, (nn.LayerNorm, nn.SiLU, nn.ELU)) for m in wm.modules())
    x = torch.linspace(-2, 2, 9)
    torch.testing.assert_close(wm.dynamics.act(x), x.clamp(min=0))
    assert (agent.planner.horizon, agent.planner.candidates, agent.planner.top_k,
            agent.planner.iterations) == (12, 1000, 100, 10)
    _, old = reference_agent(["agent.module.planet_dreamer_nets=true", "agent.module.act=elu"])
    assert isinstance(old.wm.image_encoder, ConvEncoder) and isinstance(old.wm.reward_head, MLP)
    assert isinstance(old.wm.dynamics.act, nn.ELU) and any(isinstance(m, nn.LayerNorm) for m in old.wm.modules())


def test_tf_adam_epsilon_makes_the_step_tensorflows():
    """TensorFlow's Adam: lr * sqrt(1 - b2^t) / (1 - b1^t) * m_t / (sqrt(v_t) + eps) (configs.py:195, eps 1e-4)."""
    from reverie.agents.base import adam
    from reverie.agents.planet import tf_adam_epsilon

    p = nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
    opt = adam([p], lr=1e-3, eps=1e-4)
    grads = [torch.tensor([1e-3, -2e-4, 5e-5], dtype=torch.float64),
             torch.tensor([-3e-4, 1e-4, 2e-5], dtype=torch.float64)]
    theta, m, v = p.detach().clone(), torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for t, g in enumerate(grads, 1):
        p.grad = g.clone()
        tf_adam_epsilon(opt, 1e-4)
        assert opt.param_groups[0]["eps"] == pytest.approx(1e-4 / math.sqrt(1 - 0.999**t))
        opt.step()
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        theta = theta - 1e-3 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m / (v.sqrt() + 1e-4)
        torch.testing.assert_close(p.detach(), theta, rtol=1e-12, atol=1e-15)
    agent = PlaNet({"vector": (4,)}, ActionSpec(False, 2), **TINY)
    agent.update(batch())
    assert agent.model_opt.param_groups[0]["eps"] == pytest.approx(1e-4 / math.sqrt(1 - 0.999))  # set for step 1


@pytest.mark.parametrize("free_nats", [0.0, 3.0])
@pytest.mark.parametrize("s", [0.5, 0.3])
def test_decoder_std_s_times_s2_has_the_gradients_of_divergence_scale_s2(s, free_nats):
    """The PlaNet author's equivalence: s^2 x (loss with decoder_std s, divergence_scale 1) has the gradients of the
    loss with decoder_std 1 and divergence_scale s^2 (every Gaussian likelihood, images, vectors and the reward, is
    (x - mean)^2 / (2 s^2) + a constant; the KL terms are scaled outside the free-nats hinge, so it holds with free
    nats too). The continue head's Bernoulli is not a Gaussian: it is off here, as the reference has none. float64."""
    obs_shapes = {"image": (3, 64, 64), "vector": (4,)}
    kw = dict(TINY, **planet(free_nats=free_nats, overshooting=3), cnn_depth=4, cont_scale=0.0,
              overshooting_scale=0.5, global_divergence_scale=0.25)
    torch.manual_seed(0)
    a = PlaNet(obs_shapes, ActionSpec(False, 2), decoder_std=s, **kw).double()
    b = PlaNet(obs_shapes, ActionSpec(False, 2), decoder_std=1.0, **{**kw, "divergence_scale": s**2,
               "overshooting_scale": 0.5 * s**2, "global_divergence_scale": 0.25 * s**2}).double()
    b.load_state_dict(a.state_dict())
    rng = np.random.default_rng(0)
    data = {k: torch.as_tensor(v, dtype=torch.bool if v.dtype == bool else torch.float64)
            for k, v in batch(T=5, B=2, F=4).items()}
    data["image"] = torch.as_tensor(rng.integers(0, 256, (5, 2, 3, 64, 64)), dtype=torch.float64)  # pixel values
    data["reward"] = data["reward"] * 3.0
    grads = []
    for agent, factor in ((a, s**2), (b, 1.0)):
        torch.manual_seed(1)  # the same dequantisation noise and latent draws
        loss, losses, _ = agent.model_loss(data)
        assert losses["kl"].dtype == losses["image"].dtype == torch.float64
        params = list(agent.wm.parameters())
        grads.append(torch.autograd.grad(factor * loss, params, allow_unused=True))
    checked = 0
    for ga, gb in zip(*grads):
        if ga is None:
            assert gb is None
            continue
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-13)
        checked += int(ga.abs().sum() > 0)
    assert checked > 20
    # and the plain losses do differ: the equivalence is of gradients up to the factor s^2, not of the loss values
    torch.manual_seed(1)
    assert not torch.isclose(a.model_loss(data)[0] * s**2, b.model_loss(data)[0])


@pytest.mark.parametrize("representation, key, scale", [("r2", "barlow", 0.05), ("infonce", "infonce", 1.0)])
def test_a_decoder_free_planet_trains_its_objective_instead_of_decoders(representation, key, scale):
    """``agent.module.representation`` (the Atari study's decoder-free point): no decoders, the objective's loss
    scaled as R2-Dreamer scales it, and one update moves the projector and the encoder through it."""
    torch.manual_seed(0)
    agent = PlaNet({"vector": (4,)}, ActionSpec(True, 2), **{**TINY, **planet(representation=representation)})
    assert not agent.wm.decodes and agent.wm.decoder is None and agent.loss_scales[key] == scale
    assert "vector" not in agent.loss_scales and "rec" not in agent.loss_scales
    projector = agent.wm.representation.projector.weight.detach().clone()
    metrics = agent.update(batch(T=8, B=4, discrete=True))
    assert math.isfinite(float(metrics[f"loss/{key}"])) and "loss/vector" not in metrics
    assert not torch.equal(projector, agent.wm.representation.projector.weight)
    halved = PlaNet({"vector": (4,)}, ActionSpec(True, 2),
                    **{**TINY, **planet(representation=representation, representation_scale=scale / 2)})
    assert halved.loss_scales[key] == scale / 2
