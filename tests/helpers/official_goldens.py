"""Reading the official DreamerV3 goldens (bench/goldens.py) into reverie: the agent, the batch and the draws.

The goldens hold the official code's parameters, batch, random draws, gradients, metrics and parameters after
updates 1 and 2. :func:`build_agent` makes the matching reverie agent and loads the official initial parameters
through the library's map (:mod:`reverie.agents.official`); :func:`reverie_batch` turns the official ``(B, T)``
chunk into reverie's ``(T, B)`` batch; :class:`RecordedDraws` answers reverie's draws (:mod:`reverie.models.draws`)
with the official ones; :func:`run_update` runs one reverie update and returns its metrics and gradients.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from reverie.agents import DreamerV3_2025
from functools import partial

from reverie.agents import DreamerV3
from reverie.agents.official import load_official, to_reverie
from reverie.models.dynamics import CategoricalRSSM
from reverie.models import draws
from reverie.types import ActionSpec

DATA = Path(__file__).parent.parent / "goldens" / "data"


def load(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``(meta, arrays)`` of ``data/<name>.npz``."""
    with np.load(DATA / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(str(arrays.pop("meta"))), arrays


def group(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays under ``<prefix>/``, keyed by the rest of their name."""
    return {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def flag(meta: dict, name: str, cast=float):
    """The value of ``--<name>`` in the golden's official flags."""
    words = meta["flags"].split()
    return cast(words[words.index(f"--{name}") + 1])


def build_agent(meta: dict, arrays: dict[str, np.ndarray], kernels: str = "off", **overrides):
    """The reverie agent of the golden's official version and configuration (sizes, horizon, learning rates, free
    nats from its flags; everything else the official defaults, which are reverie's) with the official initial
    parameters: :class:`DreamerV3_2025` for the 2025 goldens, :class:`DreamerV3` for the 2023 ones."""
    kind, dim = meta["action"]
    obs = {k: (v[2], v[0], v[1]) if len(v) == 3 else tuple(v) for k, v in meta["obs"].items()}  # HWC -> CHW
    dynamics = overrides.pop("dynamics", {})
    torch.manual_seed(0)
    if meta["version"] == "2025":
        kwargs = dict(dynamics=dict(deter=flag(meta, "agent.dyn.rssm.deter", int),
                                    hidden=flag(meta, "agent.dyn.rssm.hidden", int),
                                    stoch=flag(meta, "agent.dyn.rssm.stoch", int),
                                    classes=flag(meta, "agent.dyn.rssm.classes", int),
                                    blocks=flag(meta, "agent.dyn.rssm.blocks", int),
                                    free_nats=flag(meta, "agent.dyn.rssm.free_nats"), kernels=kernels) | dynamics,
                      units=flag(meta, "agent.enc.simple.units", int), horizon=flag(meta, "agent.imag_length", int),
                      cnn_depth=flag(meta, "agent.enc.simple.depth", int),
                      lr=flag(meta, "agent.opt.lr"), warmup=flag(meta, "agent.opt.warmup", int),
                      replay_context=flag(meta, "replay_context", int), kernels=kernels, precision="float32")
        agent = DreamerV3_2025(obs, ActionSpec(kind == "discrete", dim), **(kwargs | overrides))
    else:
        rssm = dict(deter=flag(meta, "rssm.deter", int), stoch=flag(meta, "rssm.stoch", int),
                    classes=flag(meta, "rssm.classes", int), units=flag(meta, "rssm.units", int),
                    free_nats=flag(meta, "dyn_loss.free"), kernels=kernels) | dynamics
        kwargs = dict(dynamics=partial(CategoricalRSSM, **rssm), units=flag(meta, "actor.units", int),
                      layers=flag(meta, "actor.layers", int), mlp_units=flag(meta, "encoder.mlp_units", int),
                      mlp_layers=flag(meta, "encoder.mlp_layers", int), cnn_depth=flag(meta, "encoder.cnn_depth", int),
                      horizon=flag(meta, "imag_horizon", int), model_lr=flag(meta, "model_opt.lr"),
                      actor_lr=flag(meta, "actor_opt.lr"), critic_lr=flag(meta, "critic_opt.lr"), kernels=kernels,
                      precision="float32")
        agent = DreamerV3(obs, ActionSpec(kind == "discrete", dim), **(kwargs | overrides))
    load_official(agent, group(arrays, "init"))
    return agent


def reverie_batch(meta: dict, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The official chunk ``(B, T, ...)`` as reverie's batch ``(T, B, ...)``: ``prev_action`` at row ``t`` is the
    official ``action`` of row ``t - 1`` (zeros at row 0: the official carry's initial action), one-hot for discrete
    actions."""
    batch = group(arrays, "batch")
    kind, dim = meta["action"]
    out = {k: np.swapaxes(batch[k], 0, 1) for k in (*meta["obs"], "reward", "is_first", "is_last", "is_terminal")}
    for key, shape in meta["obs"].items():
        if len(shape) == 3:  # images (T, B, H, W, C) -> (T, B, C, H, W)
            out[key] = np.ascontiguousarray(np.moveaxis(out[key], -1, 2))
    action = batch["action"]
    if kind == "discrete":
        action = np.eye(dim, dtype=np.float32)[action]
    action = np.swapaxes(action, 0, 1).astype(np.float32)  # (T, B, A)
    out["prev_action"] = np.concatenate([np.zeros_like(action[:1]), action[:-1]], 0)
    return out


class RecordedDraws:
    """A draw source (:mod:`reverie.models.draws`) that answers each of reverie's draws with the official draws made
    from the same distributions. The official code records its draws in no fixed order and lays out its batches
    differently (its imagination starts are batch-major, reverie's time-major), so each row of a draw (one latent's
    ``(S, K)`` classes, one action) is answered by the recorded row whose probabilities (or mean and std) are
    nearest to reverie's, within ``tol``.

    ``extra``: shapes of categorical draws reverie makes and the official code does not (the block RSSM's observe
    draws a prior sample of every row, which no loss reads); they get the mode and are listed in ``extra``.

    Raises:
        AssertionError: a row with no recorded row within ``tol`` of reverie's distribution.
    """

    def __init__(self, recorded: dict[str, np.ndarray], tol: float = 1e-4, extra: tuple[tuple[int, ...], ...] = ()):
        self.tol, self.extra_shapes, self.extra = tol, set(extra), []
        rows: dict[tuple, list] = {}
        for i in sorted({k.split("/")[0] for k in recorded}):
            if str(recorded[f"{i}/kind"]) == "categorical":
                logits = torch.as_tensor(recorded[f"{i}/logits"], dtype=torch.float64)
                probs, index = torch.softmax(logits, -1), torch.as_tensor(recorded[f"{i}/index"]).long()
                # rows: the leading (batch) dim; a row's event is the rest ((S, K) latents, (K,) actions)
                key = ("categorical", tuple(probs.shape[1:]))
                rows.setdefault(key, []).extend(zip(probs.flatten(1), index.flatten(1) if index.dim() > 1
                                                    else index[:, None]))
            else:
                mean, std, eps = (torch.as_tensor(recorded[f"{i}/{k}"], dtype=torch.float64)
                                  for k in ("mean", "std", "eps"))
                key = ("normal", tuple(mean.shape[1:]))
                rows.setdefault(key, []).extend(zip(torch.cat([mean, std], -1).flatten(1), eps))
        self.rows = {k: (torch.stack([a for a, _ in v]), torch.stack([b for _, b in v])) for k, v in rows.items()}
        self.used = {"categorical": 0, "normal": 0}
        self.errors: list[float] = []

    def _match(self, kind: str, event: tuple[int, ...], query: torch.Tensor) -> torch.Tensor:
        """Indices into the recorded rows of ``(kind, event)`` nearest to ``query (N, F)``."""
        assert (kind, event) in self.rows, f"no official {kind} draws of event shape {event}"
        table = self.rows[(kind, event)][0]  # (M, F)
        distance = (query[:, None, :] - table[None]).abs().amax(-1)  # (N, M)
        best, where = distance.min(-1)
        worst = float(best.max())
        assert worst <= self.tol, f"no official {kind} draw within {self.tol} of reverie's (nearest {worst:.3g})"
        self.used[kind] += 1
        self.errors.append(worst)
        return where

    def categorical(self, probs: torch.Tensor, unimix: float) -> torch.Tensor:
        k = probs.shape[-1]
        mixed = (1.0 - unimix) * probs.double() + unimix / k
        key = ("categorical", tuple(probs.shape[1:]))
        if key not in self.rows and tuple(probs.shape) in self.extra_shapes:  # a draw the official code does not make
            self.extra.append(tuple(probs.shape))
            return probs.argmax(-1)
        # reverie's draws may have more leading dims than the official rows ((T, B, S, K) against (B, S, K))
        event = key[1] if key in self.rows else tuple(probs.shape[2:])
        rows = mixed.reshape(-1, int(np.prod(event)))
        where = self._match("categorical", event, rows)
        index = self.rows[("categorical", event)][1][where]  # (N, S) or (N, 1)
        shape = probs.shape[:-1]
        return index.reshape(shape).to(probs.device)

    def normal(self, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        event = tuple(mean.shape[1:])
        query = torch.cat([mean.double(), std.double()], -1).flatten(1)
        where = self._match("normal", event, query)
        return self.rows[("normal", event)][1][where].reshape(mean.shape).to(mean.dtype)


def run_update(agent, batch: dict[str, np.ndarray], recorded: dict[str, np.ndarray],
               extra: tuple[tuple[int, ...], ...] = ()
               ) -> tuple[dict[str, float], dict[str, torch.Tensor], RecordedDraws]:
    """One ``agent.update(batch)`` with the official draws; returns ``(metrics, gradients by reverie key, the
    draw source)``. The gradients are taken before any clipping, as the official ones (recorded before the
    official optimiser chain, whose first transform clips)."""
    names = {id(p): k for k, p in agent.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, *args, **kwargs):  # every optimiser step clips first (WorldModelAgent._step)
        params = list(params)
        for p in params:
            if p.grad is not None:
                grads[names[id(p)]] = p.grad.detach().clone()
        return clip(params, *args, **kwargs)

    source = RecordedDraws(recorded, extra=extra)
    torch.nn.utils.clip_grad_norm_ = recording_clip
    try:
        with draws.drawing_from(source):
            metrics = agent.update(batch)
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    return metrics, grads, source


def official_in_reverie(agent, official: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Official arrays by official name -> reverie layout by reverie key (the map's transforms)."""
    return {k: torch.as_tensor(v.copy()) for k, v in to_reverie(agent, official).items()}
