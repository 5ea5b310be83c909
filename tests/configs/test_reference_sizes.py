"""reverie's resolved network sizes against the 2023 DreamerV3 reference's, suite by suite and preset by preset.

The expected values are what the reference's own config code resolves (danijar/dreamerv3 at 8fa35f8:
``embodied/core/config.py`` ``Config.update`` applied to ``dreamerv3/configs.yaml``'s ``defaults`` and then the named
block, as ``dreamerv3/train.py`` does). Its size patterns are matched with ``re.match`` against the whole flat key:
``.*\\.units`` matches ``rssm.units``, ``actor.units``, ``reward_head.units`` ..., but never ``encoder.mlp_units``,
so the vector encoder and decoder stay 5 x 1024 at every size. Each row cites the lines of ``configs.yaml`` that set
its values. (Resolving ``atari100k`` needs its key ``actor_eval_sample`` left out: that commit's ``defaults`` has no
such key, so ``Config.update`` raises ``KeyError`` on it; reverie holds it as ``train.eval_mode: sample``.)
"""

from __future__ import annotations

import pytest

from reverie.agents.build import build_agent
from reverie.configs.compose import load_config
from reverie.models.networks import MLP, NormLinear
from reverie.types import ActionSpec

# reference key -> reverie config key
KEYS = {
    "rssm.deter": "agent.module.dynamics.deter", "rssm.units": "agent.module.dynamics.units",
    "rssm.stoch": "agent.module.dynamics.stoch", "rssm.classes": "agent.module.dynamics.classes",
    "encoder.mlp_layers": "agent.module.mlp_layers", "encoder.mlp_units": "agent.module.mlp_units",
    "decoder.mlp_layers": "agent.module.mlp_layers", "decoder.mlp_units": "agent.module.mlp_units",
    "encoder.cnn_depth": "agent.module.cnn_depth", "decoder.cnn_depth": "agent.module.cnn_depth",
    "encoder.minres": "agent.module.cnn.min_res", "decoder.minres": "agent.module.cnn.min_res",
    "reward_head.layers": "agent.module.layers", "reward_head.units": "agent.module.units",
    "cont_head.layers": "agent.module.layers", "cont_head.units": "agent.module.units",
    "actor.layers": "agent.module.layers", "actor.units": "agent.module.units",
    "critic.layers": "agent.module.layers", "critic.units": "agent.module.units",
    "batch_size": "agent.batch_size", "batch_length": "agent.batch_length", "run.train_ratio": "agent.train_ratio",
    "imag_horizon": "agent.module.horizon",
}


def row(deter, units, layers, cnn_depth, train_ratio):
    """The reference's resolved values of one block: what the block sets, the rest from ``defaults``
    (configs.yaml:61-62 batch 16 x 64, :67 rssm stoch/classes 32 x 32, :68-69 encoder/decoder mlp 5 x 1024 and
    minres 4, :87 imag_horizon 15)."""
    return {"rssm.deter": deter, "rssm.units": units, "rssm.stoch": 32, "rssm.classes": 32,
            "encoder.mlp_layers": 5, "encoder.mlp_units": 1024, "decoder.mlp_layers": 5, "decoder.mlp_units": 1024,
            "encoder.cnn_depth": cnn_depth, "decoder.cnn_depth": cnn_depth, "encoder.minres": 4, "decoder.minres": 4,
            "reward_head.layers": layers, "reward_head.units": units, "cont_head.layers": layers,
            "cont_head.units": units, "actor.layers": layers, "actor.units": units, "critic.layers": layers,
            "critic.units": units, "batch_size": 16, "batch_length": 64, "run.train_ratio": train_ratio,
            "imag_horizon": 15}


# (reverie overrides, reference block and the configs.yaml lines that set it, resolved reference values)
TABLE = [
    (["exp=reference", "env=dmc_proprio"], "dmc_proprio, configs.yaml:178-187", row(512, 512, 2, 32, 512)),
    (["exp=reference", "env=dmc_vision"], "dmc_vision, configs.yaml:167-176", row(512, 512, 2, 32, 512)),
    (["exp=reference", "env=atari100k"], "atari100k, configs.yaml:135-154", row(512, 512, 2, 32, 1024)),
    # size presets on top of a suite (the reference's `--configs dmc_proprio medium`): the block sets sizes only
    (["exp=reference", "env=dmc_proprio", "size=s"], "small, configs.yaml:211-215", row(512, 512, 2, 32, 512)),
    (["exp=reference", "env=dmc_proprio", "size=m"], "medium, configs.yaml:217-221", row(1024, 640, 3, 48, 512)),
    (["exp=reference", "env=dmc_proprio", "size=l"], "large, configs.yaml:223-227", row(2048, 768, 4, 64, 512)),
    (["exp=reference", "env=dmc_proprio", "size=xl"], "xlarge, configs.yaml:229-233", row(4096, 1024, 5, 96, 512)),
]


def resolved(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("overrides,block,expected", TABLE, ids=[t[1].split(",")[0] for t in TABLE])
def test_resolved_sizes_equal_the_reference(overrides, block, expected):
    cfg = load_config(overrides)
    got = {ref_key: resolved(cfg, KEYS[ref_key]) for ref_key in expected}
    assert got == expected, f"{overrides} vs the reference's {block}"


def widths(mlp: MLP) -> list[int]:
    """Output widths of an MLP's hidden layers, read off the built modules."""
    return [layer[0].weight.shape[0] for layer in mlp.hidden if isinstance(layer, NormLinear)]


def test_built_dmc_proprio_agent_has_the_reference_networks():
    """Not only the config: the modules ``exp=reference env=dmc_proprio`` builds (cartpole_swingup's 5 features,
    one action) have the reference's widths: vector encoder and decoder 5 x 1024, heads, actor and critic 2 x 512,
    RSSM deter 512 with 32 x 32 latents."""
    cfg = load_config(["exp=reference", "env=dmc_proprio", "agent.module.precision=float32",
                       "agent.module.kernels=off"])
    agent = build_agent(cfg.agent, {"vector": (5,)}, ActionSpec(False, 1))
    wm = agent.wm
    assert widths(wm.encoder) == [1024] * 5 and widths(wm.decoder) == [1024] * 5
    assert wm.decoder.out.weight.shape == (5, 1024)
    for mlp in (wm.reward_head, wm.cont_head, agent.actor.net, agent.critic):
        assert widths(mlp) == [512, 512]
    assert (wm.dynamics.deter, wm.dynamics.stoch, wm.dynamics.classes) == (512, 32, 32)


def test_built_image_encoder_follows_cnn_depth():
    """``exp=reference env=dmc_vision``: the conv encoder's channels are cnn_depth 32 x [1, 2, 4, 8] down to 4 x 4
    (reference ``encoder.cnn_depth: 32`` under dmc_vision, ``minres: 4``, ``resize: stride``)."""
    cfg = load_config(["exp=reference", "env=dmc_vision", "agent.module.precision=float32",
                       "agent.module.kernels=off"])
    agent = build_agent(cfg.agent, {"image": (3, 64, 64)}, ActionSpec(False, 1))
    plan = agent.wm.image_encoder.plan
    assert [p["cout"] for p in plan] == [32, 64, 128, 256] and plan[-1]["size_out"] == 4
    assert agent.wm.encoder is None  # no vector keys: no MLP encoder (the reference's mlp_keys: '$^')


@pytest.mark.parametrize("exp", ["classic", "debug", "dmc_cpu"])
def test_cpu_presets_size_the_vector_mlps_with_the_size_preset(exp):
    """The CPU presets change the vector encoder/decoder (and say so in agent_exp/dreamerv3_<exp>.yaml): they
    follow the size preset's units x layers."""
    cfg = load_config([f"exp={exp}"])
    m = cfg.agent.module
    assert (m.mlp_units, m.mlp_layers) == (cfg.size.units, cfg.size.layers)
    assert (m.mlp_units, m.mlp_layers) != (1024, 5)


@pytest.mark.parametrize("agent, env, precision", [("dreamerv3", "atari100k", "float32"),
                                                   ("dreamerv3_2025", "atari100k", "auto"),
                                                   ("dreamerv3", "dmc_proprio", "auto")])
def test_reference_atari100k_computes_in_float32_for_the_2023_agent(agent, env, precision):
    """The 2023 reference's atari100k block sets `jax.precision: float32` (8fa35f8 configs.yaml), its other suites
    16 bits; the current official code's atari100k keeps its bfloat16 default."""
    assert load_config([f"agent={agent}", "exp=reference", f"env={env}"]).agent.module.precision == precision


def test_r2_dmc_vision_preset_has_r2dreamers_values():
    """r2dreamer at 546e4fa: configs.yaml:17-18, 23, 29-30; env/dmc_vision.yaml:2-6; model/size12M.yaml:4-8;
    model/_base_.yaml:9, 11-19, 21-31, 37, 55, 62, 159-161."""
    cfg = load_config(["exp=r2_dmc_vision"])
    m = cfg.agent.module
    assert (cfg.agent.name, m.representation, m.objectives.r2.lambd) == ("dreamerv3_2025", "r2", 5e-4)
    assert (cfg.agent.train_ratio, cfg.agent.batch_size, cfg.agent.batch_length) == (512, 16, 64)
    assert (m.dynamics.deter, m.dynamics.hidden, m.dynamics.stoch, m.dynamics.classes, m.dynamics.blocks,
            m.units, m.cnn_depth) == (2048, 256, 32, 16, 8, 256, 16)
    assert (m.lr, m.agc, m.eps, m.beta1, m.beta2, m.warmup, m.slow_critic_fraction, m.actor_entropy) == \
        (4e-5, 0.3, 1e-20, 0.9, 0.999, 1000, 0.02, 3e-4)
    scales = {"barlow": 0.05, "reward": 1.0, "cont": 1.0, "dyn": 1.0, "rep": 0.1, "policy": 1.0, "value": 1.0,
              "repval": 0.3}
    assert {k: m.loss_scales[k] for k in scales} == scales and m.actor_unimix == 0.01
    assert (cfg.env.suite, cfg.env.image, cfg.env.num_envs, cfg.env.action_repeat) == ("dmc", True, 16, 2)
    assert (cfg.train.steps * cfg.env.action_repeat, cfg.train.eval_every * cfg.env.action_repeat,
            cfg.train.eval_episodes, cfg.train.prefill, cfg.replay.capacity) == (1_010_000, 10_000, 10, 0, 500_000)


def test_r2_dmc_cpu_differs_from_r2_dmc_vision_only_in_the_cpu_levers_it_lists():
    """exp=r2_dmc_cpu's header lists what it changes from exp=r2_dmc_vision (exp=dmc_cpu's levers); every other
    resolved key, the R2 objective, its scales and the optimiser's form included, is the same."""
    from omegaconf import OmegaConf

    from reverie.state.resume import flatten

    cpu, full = (flatten(OmegaConf.to_container(load_config([f"exp={name}"]), resolve=True))
                 for name in ("r2_dmc_cpu", "r2_dmc_vision"))
    changed = {key: (full.get(key), cpu.get(key)) for key in set(cpu) | set(full) if cpu.get(key) != full.get(key)}
    size = {key for key in changed if key.startswith("size.") or key in (
        "agent.module.dynamics.deter", "agent.module.dynamics.hidden", "agent.module.dynamics.stoch",
        "agent.module.units")}
    assert cpu["size.deter"] == 128 and cpu["agent.module.units"] == 128  # size xxs
    assert {key: changed[key] for key in set(changed) - size} == {
        "exp_name": ("r2_dmc_vision", "r2_dmc_cpu"), "threads": (None, 1),
        "agent.train_ratio": (512, 128), "agent.batch_length": (64, 32), "agent.module.imag_last": (0, 8),
        "agent.module.lr": (4e-5, 1.2e-4), "env.num_envs": (16, 1), "replay.capacity": (500_000, 50_000),
        "train.steps": (505_000, 15_000), "train.eval_every": (5_000, 2_500), "train.checkpoint_every": (10_000, 2_500)}
    assert (cpu["agent.module.representation"], cpu["agent.module.laprop"], cpu["agent.module.actor_unimix"]) == \
        ("r2", "original", 0.01)
    for representation, decodes in (("r2", False), ("reconstruction", True)):  # the pair's two arms
        cfg = load_config(["exp=r2_dmc_cpu", f"agent.module.representation={representation}",
                           "agent.module.precision=float32"])
        agent = build_agent(cfg.agent, {"image": (3, 64, 64)}, ActionSpec(False, 1))
        assert agent.wm.decodes is decodes and agent.wm.dynamics.deter == 128


@pytest.mark.parametrize("overrides", [["exp=atari100k"], ["exp=reference", "env=atari100k"]])
def test_atari100k_evaluates_100_sampled_episodes_once_at_the_end(overrides):
    """The 2023 reference's atari100k block (8fa35f8 configs.yaml:140-145, 152): ``run.eval_every: 1e5`` agent steps
    with ``eval_initial: False`` and ``eval_eps: 100``, the actor sampled: one evaluation of 100 episodes when the
    100k steps end. reverie: ``train.eval_every: 0`` (only the final evaluation), 100 episodes, ``eval_mode: sample``;
    the default 2,500 would run 40 evaluations of 100 games."""
    cfg = load_config(overrides)
    assert (cfg.train.steps, cfg.train.eval_every, cfg.train.eval_episodes, cfg.train.eval_mode) == \
        (100_000, 0, 100, "sample")
