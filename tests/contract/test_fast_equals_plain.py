"""The contract of the kernels switch: ``agent.module.kernels=auto`` computes what ``off`` (plain autograd over the
readable modules) computes. Whole DreamerV3 updates (world model, imagination, actor, critic) in float64, discrete
and continuous actions, vector and image observations, ``is_first`` mid-sequence, 256 imagination starts (the
input layer's row-gather path): every metric and, after several updates, every parameter equal up to the order of
float64 additions; and each kernel ran on the ``auto`` path and none on the ``off`` path. The same whole updates in
the default precision (``auto``) agree within the tolerance stated there."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import reverie.models.kernels.block_scan as block_scan
import reverie.models.kernels.onehot_linear as onehot_linear
import reverie.models.kernels.rssm as kernels_rssm
from reverie.agents.dreamer import DreamerV3
from reverie.envs.testing import random_batch
from reverie.types import ActionSpec

from helpers.agents import dreamer

T, B = 8, 32  # 256 imagination starts: the input layer reads the latent by row gathers from 256 rows on


def make_batch(seed: int, image: bool) -> dict[str, np.ndarray]:
    batch = random_batch(T, B, seed=seed, p_first=0.05)
    batch["is_first"][3, 1] = batch["is_first"][5, :4] = True  # episodes that start mid-sequence
    batch["prev_action"][batch["is_first"]] = 0.0
    if image:
        batch["image"] = np.random.default_rng(seed).integers(0, 256, (T, B, 3, 16, 16), dtype=np.uint8)
    return batch


def count_kernels(monkeypatch) -> collections.Counter:
    """Count the calls into every kernel the update can take on CPU."""
    calls: collections.Counter = collections.Counter()

    def counted(owner, name, key, static=False):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls[key] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, staticmethod(wrapper) if static else wrapper)

    counted(kernels_rssm, "observe_scan", "fused observe scan")
    counted(onehot_linear._OneHotLinear, "forward", "one-hot gathers", static=True)
    counted(block_scan._BlockObserveScan, "forward", "block observe scan", static=True)
    return calls


def run(kernels: str, spec: ActionSpec, image: bool, updates: int = 3, **kwargs):
    torch.manual_seed(0)
    shapes = {"vector": (4,)} | ({"image": (3, 16, 16)} if image else {})
    agent = DreamerV3(shapes, spec, **dreamer(kernels=kernels, precision="float64", cnn_depth=2), **kwargs)
    metrics = []
    for i in range(updates):
        torch.manual_seed(100 + i)  # the same latent and action draws on both paths
        metrics.append(agent.update(make_batch(i, image)))
    return agent, metrics


@pytest.mark.parametrize("discrete, image", [(True, False), (False, False), (True, True), (False, True)],
                         ids=["discrete-vector", "continuous-vector", "discrete-image", "continuous-image"])
def test_kernels_auto_equals_off_over_whole_updates_in_float64(discrete, image, monkeypatch):
    spec = ActionSpec(discrete, 2)
    calls = count_kernels(monkeypatch)
    fast, fast_metrics = run("auto", spec, image)
    used = dict(calls)
    calls.clear()
    plain, plain_metrics = run("off", spec, image)
    expected = {"fused observe scan", "one-hot gathers"}
    assert set(used) == expected and not calls, (used, dict(calls))
    assert next(fast.parameters()).dtype == torch.float64
    assert_same_updates(fast, fast_metrics, plain, plain_metrics, run("off", spec, image, updates=0)[0])


def test_kernels_auto_equals_off_with_the_discrete_actor_by_backprop(monkeypatch):
    """``actor_grad_disc=backprop``: the rollout runs under autograd with straight-through one-hot actions; every
    kernel is used."""
    spec = ActionSpec(True, 2)
    calls = count_kernels(monkeypatch)
    fast, fast_metrics = run("auto", spec, False, actor_grad_disc="backprop")
    used = dict(calls)
    calls.clear()
    plain, plain_metrics = run("off", spec, False, actor_grad_disc="backprop")
    expected = {"fused observe scan", "one-hot gathers"}
    assert set(used) == expected and not calls, (used, dict(calls))
    assert_same_updates(fast, fast_metrics, plain, plain_metrics,
                        run("off", spec, False, updates=0, actor_grad_disc="backprop")[0])


def assert_same_updates(fast, fast_metrics, plain, plain_metrics, initial, metric_abs: float = 1e-12,
                        param_abs: float = 1e-12) -> None:
    """Every metric and every parameter equal up to the order of float64 additions, and the updates changed the
    parameters (against ``initial``, the agent before any update). ``metric_abs``, ``param_abs``: the absolute
    tolerances of the metrics and the parameters."""
    for got, want in zip(fast_metrics, plain_metrics):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=metric_abs), key
    for (name, p), q in zip(fast.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=param_abs, msg=name)
    assert any(not torch.equal(p, q) for p, q in zip(fast.parameters(), initial.parameters()))


def run_2025(kernels: str, spec: ActionSpec, updates: int = 3, context: int = 0, **kwargs):
    from reverie.agents import DreamerV3_2025

    torch.manual_seed(0)
    agent = DreamerV3_2025({"vector": (4,)}, spec, dynamics=dict(deter=16, hidden=8, stoch=3, classes=4, blocks=4,
                                                                 kernels=kernels),
                           units=8, horizon=3, warmup=0, eps=1e-8, kernels=kernels, precision="float64",
                           replay_context=context, **kwargs)
    # eps 1e-8, not the official 1e-20: LaProp divides each gradient by its RMS, so with eps 1e-20 a gradient that is
    # 0 on one path and 1e-18 of rounding on the other becomes a full step on one path only
    metrics = []
    for i in range(updates):
        batch = make_batch(i, image=False)
        batch["is_last"] = np.roll(batch["is_first"], -1, 0)  # each episode's last row before the next first
        if context:  # row 0 is the context: stored latents, one column without
            rng = np.random.default_rng(50 + i)
            batch["posterior_deter"] = rng.normal(size=(T, B, 16)).astype(np.float32)
            batch["posterior_stoch"] = np.eye(4, dtype=np.float32)[rng.integers(4, size=(T, B, 3))]
            batch["has_posterior"] = np.ones((T, B), bool)
            batch["has_posterior"][0, 2] = False
        torch.manual_seed(100 + i)
        metrics.append(agent.update(batch))
        if context:
            assert metrics[-1].replay_writes["posterior_deter"].shape == (T - 1, B, 16)
    return agent, metrics


@pytest.mark.parametrize("context", [0, 1], ids=["no-context", "replay-context"])
@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_kernels_auto_equals_off_for_the_current_dreamerv3(discrete, context, monkeypatch):
    """agent=dreamerv3_2025 reads the switch too: the observe scan as one node with ``auto``, the same updates in
    float64; with the replay context (windows starting from stored latents) too."""
    spec = ActionSpec(discrete, 2)
    calls = count_kernels(monkeypatch)
    fast, fast_metrics = run_2025("auto", spec, context=context)
    used = dict(calls)
    calls.clear()
    plain, plain_metrics = run_2025("off", spec, context=context)
    assert set(used) == {"block observe scan"} and not calls, (used, dict(calls))
    # metric_abs 1e-8: the symexp two-hot mean (rewards, values, returns) sums probabilities times bins up to
    # symexp(20) = 4.85e8; near-uniform probabilities cancel to ~1e-7, so a feature that differs by one float64
    # rounding (1e-16) moves it by eps * sum(p |bins|) ~ 2.2e-16 * 2.6e7 ~ 6e-9 (seen: 1.1e-9 in return/mean).
    # param_abs 1e-9: with returns of ~3e-7 that rounding is a relative 1e-3 of the advantage, and LaProp's
    # normalised steps (lr 4e-5) carry it into the policy's output layer (seen: 3.4e-10 on the continuous mean
    # layer); a wrong kernel moves parameters by a step, 4e-5, four orders above
    assert_same_updates(fast, fast_metrics, plain, plain_metrics, run_2025("off", spec, updates=0, context=context)[0],
                        metric_abs=1e-8, param_abs=1e-9)


@pytest.mark.parametrize("representation", ["r2", "infonce"])
def test_kernels_auto_equals_off_with_each_decoder_free_objective(representation, monkeypatch):
    """The representation objectives without decoders (issue 29): the projector reads the RSSM's features
    through the one-hot gathers like every head, and the updates are the same as with plain autograd, for both
    DreamerV3 agents (2023: image and vector observations, discrete; 2025: continuous, replay context)."""
    spec = ActionSpec(True, 2)
    calls = count_kernels(monkeypatch)
    fast, fast_metrics = run("auto", spec, True, representation=representation)
    used = dict(calls)
    calls.clear()
    plain, plain_metrics = run("off", spec, True, representation=representation)
    assert {"fused observe scan", "one-hot gathers"} <= set(used) and not calls, (used, dict(calls))
    assert f"loss/{fast.wm.representation.loss_keys[0]}" in fast_metrics[0] and "loss/image" not in fast_metrics[0]
    assert_same_updates(fast, fast_metrics, plain, plain_metrics,
                        run("off", spec, True, updates=0, representation=representation)[0])
    spec = ActionSpec(False, 2)
    fast, fast_metrics = run_2025("auto", spec, context=1, representation=representation)
    calls.clear()
    plain, plain_metrics = run_2025("off", spec, context=1, representation=representation)
    assert not calls
    assert_same_updates(fast, fast_metrics, plain, plain_metrics,  # tolerances: see the test above
                        run_2025("off", spec, updates=0, context=1, representation=representation)[0],
                        metric_abs=1e-8, param_abs=1e-9)


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_kernels_auto_equals_off_in_the_default_precision(discrete, monkeypatch):
    """The same comparison in ``precision: auto``, what runs by default: bfloat16 autocast where the CPU has native
    bf16, else float32 (this AVX2-only machine). Two updates; the tolerance is stated per precision:

    - float32: metrics within 1e-4 relative (+1e-6), parameters within 1e-6 (measured: 8e-7 relative, 1.5e-8);
    - bfloat16: metrics within 3e-2 relative (+1e-2), the rounding of 8-bit mantissas in a different order
      (measured with precision=bfloat16 forced here: 0.6% on ``grad_norm/critic``); parameters within
      ``2 * updates * lr`` (+1e-6): an Adam step moves a parameter by at most about ``lr``, so two paths that differ
      in the sign of a rounding-sized gradient part by at most that (measured: 2.0e-4 after two updates, lr 1e-4).
    """
    from reverie.runtime.precision import resolve_precision

    spec, updates = ActionSpec(discrete, 2), 2
    dtype = resolve_precision("auto", torch.device("cpu"))
    runs, used = {}, {}
    calls = count_kernels(monkeypatch)
    for kernels in ("auto", "off"):
        torch.manual_seed(0)
        agent = DreamerV3({"vector": (4,)}, spec, **dreamer(kernels=kernels, precision="auto"))
        assert agent.compute_dtype == dtype
        metrics = []
        for i in range(updates):
            torch.manual_seed(100 + i)
            metrics.append(agent.update(make_batch(i, False)))
        runs[kernels], used[kernels] = (agent, metrics), dict(calls)
        calls.clear()
    assert used["auto"] and not used["off"], used
    (fast, fast_metrics), (plain, plain_metrics) = runs["auto"], runs["off"]
    if dtype == torch.float32:
        rel, abs_, param_atol = 1e-4, 1e-6, 1e-6
    else:
        lr = max(group["lr"] for opt in (plain.model_opt, plain.actor_opt, plain.critic_opt)
                 for group in opt.param_groups)
        rel, abs_, param_atol = 3e-2, 1e-2, 2 * updates * lr + 1e-6
    for got, want in zip(fast_metrics, plain_metrics, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=rel, abs=abs_), key
    for (name, p), q in zip(fast.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=param_atol, msg=name)
