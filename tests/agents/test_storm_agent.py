"""agent=storm (issue 44 item 1): the transformer world model with STORM's actor-critic, through the CLI; its
actor-critic's update is checked against STORM's own code in tests/goldens/test_storm_actor_critic.py."""

import json

import numpy as np
import pytest
import torch

from reverie.agents.build import build_agent
from reverie.agents.storm import Storm
from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.types import ActionSpec


def test_storm_trains_through_the_cli_with_its_own_losses(tmp_path):
    run_dir = tmp_path / "storm"
    assert main(["train", "exp=debug", "agent=storm", f"run_dir={run_dir}", "train.steps=96",
                 "train.eval_every=0", "train.log_every=32"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "loss/policy" in r]
    assert losses and all(np.isfinite(r[k]) for r in losses for k in ("loss/policy", "loss/value", "loss/slow_reg",
                                                                        "loss/model", "return/scale"))
    assert "loss/actor" not in losses[-1]  # DreamerV3's actor-critic is not there


def test_storm_settings_are_storms_and_continuous_actions_are_refused(tmp_path, capsys):
    agent = build_agent(load_config(["agent=storm", "exp=debug"]).agent, {"vector": (4,)}, ActionSpec(True, 3))
    assert isinstance(agent, Storm) and type(agent.wm.dynamics).__name__ == "TransformerDynamics"
    ac = agent.ac
    assert (ac.gamma, ac.lam, ac.entropy, ac.clip, ac.slow_decay) == (0.985, 0.95, 3e-4, 100.0, 0.98)
    assert ac.opt.defaults["lr"] == 3e-5 and ac.opt.defaults["eps"] == 1e-5
    assert load_config(["agent=storm"]).agent.module.horizon == 16
    D, F = agent.wm.dynamics.deter, agent.wm.dynamics.feat_dim  # STORM's heads: reward, cont from h; decoder from z
    assert [(head.start, head.stop) for head in (agent.wm.reward_head, agent.wm.cont_head, agent.wm.decoder)] == \
        [(0, D), (0, D), (D, F)]
    run_dir = tmp_path / "pendulum"
    assert main(["train", "exp=debug", "agent=storm", "env=pendulum", f"run_dir={run_dir}"]) == 2
    assert "agent=storm: STORM's policy is a categorical over discrete actions" in capsys.readouterr().err
    assert not run_dir.exists()


def test_eval_takes_the_most_probable_action_and_explore_samples():
    torch.manual_seed(0)
    agent = build_agent(load_config(["agent=storm", "exp=debug"]).agent, {"vector": (4,)}, ActionSpec(True, 3))
    with torch.no_grad():
        agent.ac.actor[-1].bias.copy_(torch.tensor([0.0, 3.0, 0.0]))  # action 1 the most probable (~0.9)
        agent.ac.actor[-1].weight.zero_()
    obs = {"vector": np.zeros((64, 4), np.float32), "is_first": np.ones(64, bool)}
    greedy, _ = agent.act(obs, mode="eval")
    sampled, _ = agent.act(obs, mode="explore")
    assert (greedy.argmax(-1) == 1).all() and set(np.unique(greedy)) == {0.0, 1.0}
    assert 0 < (sampled.argmax(-1) != 1).sum() < 32  # p(other) = 2 / (2 + e^3) = 0.09 each draw


def _storm(*overrides):
    return build_agent(load_config(["agent=storm", "exp=debug", *overrides]).agent, {"vector": (4,)},
                       ActionSpec(True, 3))


def _policy_inputs(agent, monkeypatch):
    seen = []
    policy = agent.ac.policy
    monkeypatch.setattr(agent.ac, "policy", lambda feat: seen.append(feat.clone()) or policy(feat))
    return seen


@pytest.mark.parametrize("act_on", ["prior", "posterior"])
def test_storm_acts_on_the_prior_before_the_observation_is_seen(act_on, monkeypatch):
    """STORM chooses a_t from cat(h_t, z_t ~ p(z_t | h_t)): h_t holds only the steps before o_t, so two different
    observations at the same step give the policy the same input under the same draws. The posterior rule (the
    counter-check) reads o_t and gives different inputs."""
    agent = _storm(f"agent.module.act_on={act_on}")
    seen = _policy_inputs(agent, monkeypatch)
    state = agent.initial_state(8)
    for scale in (1.0, -5.0):
        torch.manual_seed(0)
        obs = {"vector": np.full((8, 4), scale, np.float32), "is_first": np.ones(8, bool)}
        agent.act(obs, state)
    deter = agent.wm.dynamics.deter  # features: cat(h_t, z_t)
    assert torch.equal(seen[0][:, :deter], seen[1][:, :deter])  # h_t: the same history either way
    assert torch.equal(seen[0], seen[1]) == (act_on == "prior")


def test_act_on_prior_is_refused_for_a_dynamics_without_a_prior():
    with pytest.raises(ValueError, match="act_on=prior needs a dynamics with a prior"):
        Storm({"vector": (4,)}, ActionSpec(True, 3), dynamics=None, units=16, mlp_units=16, ac_units=16)  # an RSSM
    Storm({"vector": (4,)}, ActionSpec(True, 3), dynamics=None, units=16, mlp_units=16, ac_units=16,
          act_on="posterior")  # the counter-check: the RSSM can act on its posterior
    with pytest.raises(ValueError, match="act_on must be 'prior'"):
        _storm("agent.module.act_on=posteriour")


@pytest.mark.parametrize("layout", ["dreamer", "storm"])
def test_context_starts_are_the_prior_of_the_step_after_the_context(layout, monkeypatch):
    """The start after C observed context rows and the action taken after the last one equals the state the
    whole-window observe pass gives row C + 1 (same latents: draws replaced by the mode): deter and prior logits;
    computed there by batched attention over the window, here by C rows and one cached prior step. STORM's layout:
    the C tokens (z_t, a_t) of the context and no start token, the prior after the last one (the window pass over
    all C + 1 rows gives it at step C - 1)."""
    from reverie.models.dynamics import TransformerDynamics

    torch.manual_seed(0)
    agent = _storm("agent.module.imag_context=5", "agent.module.precision=float32",
                   f"agent.module.loss_layout={layout}").double()
    dyn = agent.wm.dynamics
    monkeypatch.setattr(dyn, "_draw", lambda logits, sample: TransformerDynamics._draw(dyn, logits, False))
    C, N = 5, 7
    ctx = {"vector": torch.randn(C + 1, N, 4, dtype=torch.float64),
           "prev_action": torch.eye(3, dtype=torch.float64)[torch.randint(0, 3, (C + 1, N))],
           "is_first": torch.zeros(C + 1, N, dtype=torch.bool)}
    ctx["is_first"][0] = True
    ctx["is_first"][3, 2] = True  # an episode starts inside one context
    start = agent.context_starts(ctx)
    with torch.no_grad():
        embed = agent.wm.encode({"vector": ctx["vector"]})
        if layout == "storm":  # steps t = 0..C: a_t is row t + 1's prev_action (the last one is never read)
            action = torch.cat([ctx["prev_action"][1:], torch.zeros_like(ctx["prev_action"][:1])])
            is_first = torch.cat([ctx["is_first"][1:], torch.zeros_like(ctx["is_first"][:1])])
            post, prior = dyn.observe_storm(embed, action, is_first)  # STORM's timing: step t holds h_t, p(z_t+1)
        else:
            post, prior = dyn.observe(embed, ctx["prev_action"], ctx["is_first"])
    row = C - 1 if layout == "storm" else C
    assert start["deter"].shape == (N, dyn.deter)
    torch.testing.assert_close(start["deter"], post["deter"][row], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(start["logits"], prior["logits"][row], rtol=1e-10, atol=1e-10)
    assert not torch.allclose(start["logits"], post["logits"][C])  # the prior's, not the posterior's of row C + 1


@pytest.mark.parametrize("contexts", [12, 0])
def test_the_loop_draws_the_imagination_contexts(contexts, tmp_path, monkeypatch):
    """Each update imagines from ``imag_contexts`` starts drawn by the loop (``batch["imagine"]``, C + 1 rows each);
    with 0, from the last ``imag_last`` rows of each training window (2 x B starts)."""
    from reverie.agents.storm import StormActorCritic

    sizes = []
    update = StormActorCritic.update
    monkeypatch.setattr(StormActorCritic, "update", lambda self, feat, *a: sizes.append(feat.shape[:2]) or
                        update(self, feat, *a))
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", "agent=storm", f"run_dir={run_dir}", "train.steps=80", "train.eval_every=0",
                 f"agent.module.imag_contexts={contexts}", "agent.module.imag_last=2"]) == 0
    cfg = load_config(["exp=debug", "agent=storm"]).agent
    assert sizes and set(sizes) == {(cfg.module.horizon + 1, contexts if contexts else 2 * cfg.batch_size)}


def test_storm_atari100k_is_storms_protocol():
    cfg = load_config(["exp=storm_atari100k", "env.task=ms_pacman"])
    env, agent, train = cfg.env, cfg.agent, cfg.train
    assert (env.suite, env.sticky, env.noops, env.life_loss, env.action_repeat, env.size, env.actions) == \
        ("atari", 0.25, 0, "terminal", 4, 64, "minimal")
    assert (agent.name, agent.batch_size, agent.batch_length, agent.train_ratio) == ("storm", 16, 65, 1040)
    module = agent.module
    assert (module.dynamics.context, module.dynamics.deter, module.dynamics.layers, module.dynamics.heads) == \
        (64, 512, 2, 8)
    assert (module.imag_contexts, module.imag_context, module.horizon, module.act_on) == (1024, 8, 16, "prior")
    assert (train.steps, train.prefill, train.eval_episodes, train.eval_mode) == (102000, 1024, 20, "sample")


def test_storm_at_the_cpu_atari_budget_matches_the_dreamerv3_presets_updates():
    """exp=atari_cpu agent=storm: the DreamerV3 preset's env, size and 6,187 updates per run (one per 16 env steps
    after the 1,000 prefill steps: 16 x 33 rows at train_ratio 33 against its 16 x 32 at 32; the runs' summary.json
    says 6,187), STORM's losses and imagination scheme kept."""
    storm, dreamer = (load_config(["exp=atari_cpu", f"agent={a}", "env.task=boxing"]) for a in ("storm", "dreamerv3"))
    assert storm.env == dreamer.env and storm.size == dreamer.size and storm.train == dreamer.train
    updates = [(c.train.steps - c.train.prefill) * c.agent.train_ratio // (c.agent.batch_size * c.agent.batch_length)
               for c in (storm, dreamer)]
    assert updates == [6187, 6187]
    module = storm.agent.module
    assert (module.loss_layout, module.imag_contexts, module.imag_context, module.act_on) == ("storm", 128, 8, "prior")
    assert (module.model_lr, module.ac_lr) == (3e-4, 1e-4)


def test_few_imagination_starts_and_long_contexts_do_not_break_a_run(tmp_path):
    """STORM's k-th percentile of fewer than 20 returns is the smallest (its kthvalue would get k = 0), and a
    context window longer than the replay holds waits for the rows, as the training batch does."""
    from reverie.agents.objectives import kth_percentile

    assert kth_percentile(torch.tensor([3.0, 1.0, 2.0]), 0.05) == 1.0  # int(0.15) = 0 -> the smallest
    assert kth_percentile(torch.arange(100.0), 0.05) == 4.0  # the 5th smallest, as STORM
    run_dir = tmp_path / "few"
    assert main(["train", "exp=debug", "agent=storm", f"run_dir={run_dir}", "train.steps=80", "train.eval_every=0",
                 "agent.module.imag_contexts=1"]) == 0
    run_dir = tmp_path / "long"
    assert main(["train", "exp=debug", "agent=storm", f"run_dir={run_dir}", "train.steps=80", "train.eval_every=0",
                 "agent.module.imag_context=100"]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["updates"] == 0  # 80 rows never hold 101


def test_a_fractional_number_of_contexts_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "frac"
    assert main(["train", "exp=debug", "agent=storm", f"run_dir={run_dir}", "agent.module.imag_contexts=1.5"]) == 2
    assert "agent.module.imag_contexts >= 0" in capsys.readouterr().err and not run_dir.exists()


def test_reverie_imagine_acts_with_storms_policy():
    """`reverie imagine` (``--actions policy``, its default) takes STORM's most probable action; before, it refused
    a STORM run ("no actor network")."""
    from reverie.viz.imagine import action_source

    agent = _storm()
    feat = torch.randn(1, agent.wm.dynamics.feat_dim)
    act = action_source(agent, ActionSpec(True, 3), "policy", 4, 0)(0, feat)
    assert torch.equal(act, torch.nn.functional.one_hot(agent.ac.policy(feat).probs.argmax(-1), 3).float())


def test_storm_nets_on_images_update_with_batch_statistics_and_act_with_running_ones():
    """agent=storm's default ``nets: storm`` (STORM's BatchNorm conv stacks and heads, checked against STORM's modules
    in tests/goldens/test_storm_nets.py) on 64 x 64 images: an update moves the BatchNorm running statistics (batch
    statistics, as STORM's world-model update), acting and imagination contexts read them without moving them (as
    STORM's ``eval()``), and ``nets=dreamer`` keeps DreamerV3's LayerNorm stacks."""
    from reverie.models.storm_nets import StormBatchNorm2d, StormEncoder

    torch.manual_seed(0)
    cfg = load_config(["agent=storm", "exp=debug", "agent.module.imag_contexts=4", "agent.module.imag_context=3",
                       "agent.module.precision=float32"]).agent
    agent = build_agent(cfg, {"image": (3, 64, 64)}, ActionSpec(True, 6))
    assert isinstance(agent.wm.image_encoder, StormEncoder)
    norms = [m for m in agent.wm.modules() if isinstance(m, StormBatchNorm2d)]
    assert norms and all(float(m.running_var.mean()) == 1.0 for m in norms)
    rng = np.random.default_rng(0)

    def window(T, B):
        is_first = np.zeros((T, B), bool)
        is_first[0] = True
        return {"image": rng.integers(0, 256, (T, B, 3, 64, 64), dtype=np.uint8),
                "prev_action": np.eye(6, dtype=np.float32)[rng.integers(0, 6, (T, B))],
                "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
                "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}

    obs = {"image": rng.integers(0, 256, (2, 3, 64, 64), dtype=np.uint8), "is_first": np.ones(2, bool)}
    state = [m.running_mean.clone() for m in norms]
    agent.act(obs, mode="explore")
    assert all(torch.equal(a, m.running_mean) for a, m in zip(state, norms))  # acting: read, not moved
    metrics = agent.update(window(8, 2) | {"imagine": window(4, 4)})
    assert np.isfinite(float(metrics["loss/model"]))
    assert all(not torch.equal(a, m.running_mean) for a, m in zip(state, norms))  # the update's batch statistics
    dreamer = build_agent(load_config(["agent=storm", "exp=debug", "agent.module.nets=dreamer"]).agent,
                          {"image": (3, 64, 64)}, ActionSpec(True, 6))
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in dreamer.wm.modules())
