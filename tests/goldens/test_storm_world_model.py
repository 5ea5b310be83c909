"""agent=storm's world-model update, tensor by tensor against STORM's own ``WorldModel.update`` (issue 44 item 3).

The golden (tests/goldens/data/storm1c50658_world_model.npz) was made by STORM's ``sub_models/world_models.py``
``WorldModel.update`` at weipu-zhang/STORM 1c50658 in float64 (bench/storm_wm_goldens.py; its ``meta`` holds the
command and sizes): two updates of STORM's modules at a small size, from parameters set by a fixed integer hash,
with the posterior samples and dropout masks recorded. Here :class:`reverie.agents.storm.Storm`'s world-model step
(``update_model``) with ``loss_layout: storm``, absolute positions and no episode mask gets the same parameters
(mapped by name), STORM's window of ``L`` steps as ``L + 1`` reverie rows (row ``t + 1`` holds ``a_t``, ``r_t`` and
the termination after it) and the same draws (:mod:`reverie.models.draws` and ``torch.nn.functional.dropout``), and
must give STORM's logged losses, gradient norm, every gradient of update 1, every parameter after update 2 and the
BatchNorm running statistics. Counter-checks: free bits per step instead of on the batch mean, DreamerV3's layout
(every row's losses, the start token, the first step's KL from it) and relative instead of absolute positions each
fail the same comparison.

Tolerances: both sides run in float64 but for the reward's 255 bins (reverie's are float32 values, STORM's here
float64), which move the reward loss by 1e-8 relative and the parameters after two Adam steps by up to 3.3e-6 of the
learning rate; the golden's gradients and steps are stored in float32. So: losses to a relative 1e-7 (measured:
9e-9 in the reward loss, 3e-15 in the others), each gradient to 1e-6 of the largest, each parameter's step to 2e-5
of the learning rate, the running statistics to 1e-6.
"""

from __future__ import annotations

import json
import re
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reverie.agents.storm import Storm
from reverie.models import draws
from reverie.models.dynamics import TransformerDynamics, transformer
from reverie.models.dynamics.base import free_bits
from reverie.types import ActionSpec
from helpers.threads import single_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import storm_wm_goldens as goldens  # noqa: E402  (its parameter and image recipe; STORM not imported)
from bench.storm_wm_goldens import initial_value  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "storm1c50658_world_model.npz"
# STORM's logged tag (bench/storm_wm_goldens.py's order) -> reverie's metric
LOGS = {"reconstruction_loss": "loss/image", "reward_loss": "loss/reward", "termination_loss": "loss/cont",
        "dynamics_loss": "loss/dyn", "dynamics_real_kl_div": "kl", "representation_loss": "loss/rep",
        "representation_real_kl_div": "kl", "total_loss": "loss/model"}
LOSS_RTOL, GRAD_RTOL, STEP_ATOL_LR, BUFFER_RTOL = 1e-7, 1e-6, 2e-5, 1e-6
BLOCK = {"slf_attn.w_qs": "query", "slf_attn.w_ks": "key", "slf_attn.w_vs": "value", "slf_attn.fc": "out",
         "slf_attn.layer_norm": "attn_norm", "pos_ffn.w_1": "ffn_in", "pos_ffn.w_2": "ffn_out",
         "pos_ffn.layer_norm": "ffn_norm"}


one_thread = pytest.fixture(autouse=True)(single_thread)  # tiny tensors: one intra-op thread


def golden() -> tuple[dict[str, np.ndarray], dict]:
    with np.load(GOLDEN) as f:
        data = {k: f[k] for k in f.files}
    return data, json.loads(str(data["meta"]))


def images(meta: dict, u: int) -> np.ndarray:
    """Batch ``u``'s observations ``(B, L, 3, side, side)`` uint8, as bench/storm_wm_goldens.py made them."""
    assert (meta["B"], meta["L"], meta["side"]) == (goldens.B, goldens.L, goldens.SIDE)
    return goldens.images(u)


# ---------------------------------------------------------------------------------------------- reverie's side
def reverie_name(storm: str) -> str:
    """STORM's parameter or buffer name -> the name inside reverie's ``Storm`` agent."""
    rules = [
        (r"encoder\.backbone\.(\d+)\.", lambda m: f"wm.image_encoder.layers.{m[1]}."),
        (r"image_decoder\.backbone\.0\.", lambda m: "wm.representation.image_decoder.net.linear."),
        (r"image_decoder\.backbone\.(\d+)\.", lambda m: f"wm.representation.image_decoder.net.layers.{int(m[1]) - 2}."),
        (r"dist_head\.post_head\.", lambda m: "wm.dynamics.post_net."),
        (r"dist_head\.prior_head\.", lambda m: "wm.dynamics.prior_net."),
        (r"storm_transformer\.stem\.", lambda m: "wm.dynamics.stem."),
        (r"storm_transformer\.position_encoding\.pos_emb\.", lambda m: "wm.dynamics.position."),
        (r"storm_transformer\.layer_norm\.", lambda m: "wm.dynamics.position_norm."),
        (r"storm_transformer\.layer_stack\.(\d+)\.(\w+\.\w+)\.", lambda m: f"wm.dynamics.blocks.{m[1]}.{BLOCK[m[2]]}."),
        (r"reward_decoder\.backbone\.", lambda m: "wm.reward_head.net.hidden."),
        (r"reward_decoder\.head\.", lambda m: "wm.reward_head.net.out."),
        (r"termination_decoder\.backbone\.", lambda m: "wm.cont_head.net.hidden."),
        (r"termination_decoder\.head\.0\.", lambda m: "wm.cont_head.net.out."),
    ]
    for pattern, target in rules:
        m = re.match(pattern, storm)
        if m:
            return target(m) + storm[m.end():]
    raise KeyError(storm)


def build(meta: dict, positions: str = "absolute", loss_layout: str = "storm") -> tuple[Storm, list[str]]:
    """reverie's Storm agent at the golden's sizes with the golden's initial parameters; returns the agent and the
    STORM names that have no parameter in it (relative positions: the embedding and its LayerNorm)."""
    S = meta["stoch"]
    dynamics = partial(TransformerDynamics, deter=meta["deter"], stoch=S, classes=meta["classes"],
                       layers=meta["layers"], heads=meta["heads"], context=meta["max_length"],
                       dropout=meta["dropout"], positions=positions, episode_mask=False, free_nats=meta["free_bits"])
    torch.manual_seed(0)
    agent = Storm({"image": (3, meta["side"], meta["side"])}, ActionSpec(True, meta["actions"]), dynamics=dynamics,
                  cnn_depth=meta["stem"], units=16, ac_units=16, nets="storm", loss_layout=loss_layout,
                  head_inputs={"decoder": "z", "reward": "h", "cont": "h"}, precision="float64",
                  model_lr=meta["lr"], model_eps=1e-8, model_clip=meta["clip"], imag_contexts=0)
    params = dict(agent.named_parameters())
    missing = []
    with torch.no_grad():
        for k, (name, shape) in enumerate(meta["params"]):
            target = params.get(reverie_name(name))
            if target is None:
                missing.append(name)
                continue
            target.copy_(torch.as_tensor(initial_value(name, tuple(shape), k)))
    covered = {reverie_name(n) for n, _ in meta["params"]}
    assert {n for n in params if n.startswith("wm.")} - covered <= {"wm.dynamics.position_bias"}
    return agent, missing


def batch(data: dict, meta: dict, u: int) -> dict[str, np.ndarray]:
    """STORM's window of L steps as L + 1 reverie rows ``(T, B, ...)``: row t's image is o_t (row L's is never
    read), row t + 1's prev_action, reward and is_terminal are a_t, r_t and the termination after a_t."""
    B, L, A = meta["B"], meta["L"], meta["actions"]
    image = np.zeros((L + 1, B, 3, meta["side"], meta["side"]))
    image[:L] = images(meta, u).transpose(1, 0, 2, 3, 4)  # float64 pixel values: the float64 model reads them
    prev_action = np.zeros((L + 1, B, A))
    prev_action[1:] = np.eye(A)[data[f"batch{u}/action"].T.astype(np.int64)]
    reward, terminal = np.zeros((L + 1, B)), np.zeros((L + 1, B), bool)
    reward[1:], terminal[1:] = data[f"batch{u}/reward"].T, data[f"batch{u}/termination"].T
    first = np.zeros((L + 1, B), bool)
    first[0] = True
    return {"image": image, "prev_action": prev_action, "reward": reward, "is_first": first, "is_terminal": terminal,
            "is_last": terminal.copy()}


def end_aligned(recorded: torch.Tensor, shape: tuple[int, ...], fill) -> torch.Tensor:
    """``recorded`` placed at the end of every dimension of a tensor of ``shape`` filled with ``fill`` (reverie's
    attention probabilities also cover the cache's slots before the window, masked to 0)."""
    out = torch.full(shape, fill, dtype=recorded.dtype)
    out[tuple(slice(max(n - r, 0), None) for n, r in zip(shape, recorded.shape))] = \
        recorded[tuple(slice(max(r - n, 0), None) for n, r in zip(shape, recorded.shape))]
    return out


class RecordedDraws:
    """STORM's posterior samples, time-first, for reverie's first categorical draw; the modes for later ones
    (the prior samples reverie's window pass draws and no loss reads)."""

    def __init__(self, index: np.ndarray):
        self.index = torch.as_tensor(index.astype(np.int64)).transpose(0, 1)  # (B, L, S) -> (L, B, S)
        self.calls = 0

    def categorical(self, probs: torch.Tensor, unimix: float) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1:
            return probs.argmax(-1)
        return end_aligned(self.index, tuple(probs.shape[:-1]), 0)

    def normal(self, mean, std):
        raise AssertionError("no normal draws in this update")


def run(data: dict, meta: dict, agent: Storm, monkeypatch) -> list[dict]:
    """Both updates with STORM's draws: per update the metrics, the gradients by STORM name, then the parameters."""
    offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in meta["drops"]])
    names = {p: n for n, p in agent.named_parameters()}
    storm_of = {reverie_name(n): n for n, _ in meta["params"]}
    grads: dict[str, torch.Tensor] = {}
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, max_norm, *a, **k):
        params = list(params)
        grads.update({storm_of[names[p]]: p.grad.detach().clone() for p in params
                      if p.grad is not None and names[p] in storm_of})
        return clip(params, max_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    out = []
    for u in (1, 2):
        bits = np.unpackbits(data[f"drop{u}"])
        masks = [torch.as_tensor(bits[a:b].reshape(shape).astype(bool))
                 for a, b, shape in zip(offsets[:-1], offsets[1:], meta["drops"])]

        def replayed_dropout(x, p=0.5, training=True, inplace=False):
            if not training or p == 0.0:
                return x
            keep = end_aligned(masks.pop(0), tuple(x.shape), True)
            return x * (keep.to(x.dtype) / (1.0 - p))

        monkeypatch.setattr(F, "dropout", replayed_dropout)
        grads.clear()
        with draws.drawing_from(RecordedDraws(data[f"draw{u}"])):
            result = agent.update_model(batch(data, meta, u))
        assert result.skipped == 0 and not masks, "every recorded dropout mask is used"
        out.append({"metrics": dict(result), "grads": dict(grads)})
    return out


def compare(data: dict, meta: dict, agent: Storm, results: list[dict]) -> list[str]:
    """Every difference from the golden beyond the tolerances (empty when all agree)."""
    problems = []
    for u, got in zip((1, 2), results):
        for (tag, key), want in zip(LOGS.items(), data[f"log{u}"]):
            value = got["metrics"][key]
            if not np.isclose(value, want, rtol=LOSS_RTOL, atol=0.0):
                problems.append(f"update {u} {tag}: reverie {value:.12g}, STORM {want:.12g}")
        if not np.isclose(got["metrics"]["grad_norm/model"], float(data[f"norm{u}"]), rtol=LOSS_RTOL):
            problems.append(f"update {u} gradient norm: reverie {got['metrics']['grad_norm/model']:.12g}, STORM "
                            f"{float(data[f'norm{u}']):.12g}")
    sizes = [int(np.prod(shape)) for _, shape in meta["params"]]
    want_grads = dict(zip([n for n, _ in meta["params"]], np.split(data["grad1"], np.cumsum(sizes)[:-1])))
    scale = float(np.abs(data["grad1"]).max())
    for name, want in want_grads.items():
        got = results[0]["grads"].get(name)
        if got is not None and float(np.abs(got.flatten().numpy() - want).max()) > GRAD_RTOL * scale:
            problems.append(f"update 1 grad {name}: off by {float(np.abs(got.flatten().numpy() - want).max()):.3g} "
                            f"(largest entry {scale:.3g})")
    params = dict(agent.named_parameters())
    steps = dict(zip([n for n, _ in meta["params"]], np.split(data["step"], np.cumsum(sizes)[:-1])))
    for k, (name, shape) in enumerate(meta["params"]):
        target = params.get(reverie_name(name))
        if target is None:
            continue
        step = target.detach().flatten().numpy() - initial_value(name, tuple(shape), k).flatten()
        if float(np.abs(step - steps[name]).max()) > STEP_ATOL_LR * meta["lr"]:
            problems.append(f"update 2 param {name}: step off by {float(np.abs(step - steps[name]).max()):.3g}")
    buffers = dict(agent.named_buffers())
    sizes = [int(np.prod(shape)) for _, shape in meta["buffers"]]
    for (name, _), want in zip(meta["buffers"], np.split(data["buffers"], np.cumsum(sizes)[:-1])):
        got = buffers[reverie_name(name)].flatten().numpy()
        if not np.allclose(got, want, rtol=BUFFER_RTOL, atol=1e-9):
            problems.append(f"buffer {name}: off by {float(np.abs(got - want).max()):.3g}")
    return problems


def test_two_world_model_updates_equal_storms_own(monkeypatch):
    data, meta = golden()
    agent, missing = build(meta)
    assert not missing
    results = run(data, meta, agent, monkeypatch)
    assert all(len(r["grads"]) == len(meta["params"]) for r in results)
    assert compare(data, meta, agent, results) == []


@pytest.mark.parametrize("change", ["free bits per step", "dreamer layout", "relative positions"])
def test_each_storm_detail_is_seen_by_the_check(change, monkeypatch):
    """One of STORM's details replaced by reverie's default: the comparison above must fail."""
    data, meta = golden()
    kl = data["log1"][list(LOGS).index("dynamics_real_kl_div")]
    if change == "free bits per step":  # the batch mean is above the free bits; some steps are below
        assert kl > meta["free_bits"]
        monkeypatch.setattr(transformer, "batch_free_bits", lambda kl, free: free_bits(kl, free).mean())
    agent, _ = build(meta, positions="relative" if change == "relative positions" else "absolute",
                     loss_layout="dreamer" if change == "dreamer layout" else "storm")
    assert compare(data, meta, agent, run(data, meta, agent, monkeypatch)), f"{change}: the comparison passed"
