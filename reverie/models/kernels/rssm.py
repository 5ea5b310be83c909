"""The categorical RSSM's fast paths (``kernels="auto"``), called from the methods of
:class:`reverie.models.dynamics.CategoricalRSSM` marked "kernels"; each computes what the readable method does
(docs/changelog.md rounds 1-3). :func:`check_fused_scan` refuses, at construction, an RSSM whose modules were edited.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from reverie.models.distributions import unimix_sample_index
from reverie.models.kernels.observe_scan import observe_scan
from reverie.models.kernels.onehot_linear import FeatLinear, SplitFeat, one_hot_argmax, take_split_features
from reverie.models.kernels.scan_linear import ScanLinears

State = dict[str, torch.Tensor]

# from this many rows on (imagination's T*B) the input layer gathers the latent's rows; below (the observe scan's B
# rows per step) the dense product is cheaper
GATHER_MIN_ROWS = 256
LINEARS = (nn.Linear, FeatLinear)  # what the fused scan reads the weights of


class RSSMKernels:
    """The fast paths of one :class:`reverie.models.dynamics.CategoricalRSSM`; ValueError as
    :func:`check_fused_scan`."""

    def __init__(self, rssm: nn.Module):
        check_fused_scan(rssm)
        take_split_features(rssm.in_z)  # the input layer reads the latent by gathers (cell_input)
        self.rssm = rssm

    def features(self, state: State) -> SplitFeat:
        """``cat(deter, flat stoch)`` as a :class:`SplitFeat` (``stoch`` may be absent where ``index`` is given)."""
        index = state.get("index")
        if index is None:
            return SplitFeat.from_state(state["deter"], state["stoch"])
        return SplitFeat(state["deter"], state.get("stoch"), index, self.rssm.classes)

    def cell_input(self, state: State) -> torch.Tensor | SplitFeat:
        """``in_z``'s input: a :class:`SplitFeat` from :data:`GATHER_MIN_ROWS` rows on, else one-hot ``(B, S*K)``."""
        stoch, index = state.get("stoch"), state.get("index")
        if stoch is None or stoch.shape[:-2].numel() >= GATHER_MIN_ROWS:
            return SplitFeat(None, stoch, one_hot_argmax(stoch) if index is None else index, self.rssm.classes)
        return stoch.flatten(-2)  # (B, S, K) -> (B, S*K)

    def observe(self, action_proj: torch.Tensor, embed_proj: torch.Tensor, first: torch.Tensor,
                is_first: torch.Tensor, state: State, init: State, sample: bool) -> State | None:
        """The posterior states ``(T, B, ...)`` from the fused scan; None (the loop runs) unless sampled, with
        autograd, on CPU and in the compute dtype."""
        rssm = self.rssm
        dtype = compute_dtype(rssm)
        if not (sample and torch.is_grad_enabled() and action_proj.device.type == "cpu"
                and action_proj.dtype == embed_proj.dtype == dtype):
            return None
        deter, logits, stoch = observe_scan(rssm, action_proj, embed_proj, first, reset_steps(is_first),
                                            state["deter"], state["stoch"], init, dtype)
        return {"deter": deter, "stoch": stoch, "logits": logits.unflatten(-1, (rssm.stoch, rssm.classes))}

    @contextlib.contextmanager
    def deferred_weights(self) -> Iterator[None]:
        """Within the block, while autograd records, the scan's linear layers defer their weight gradients to one
        product each (:class:`ScanLinears`)."""
        rssm = self.rssm
        layers = {"in_z": rssm.in_z, "gru": rssm.gru.linear, "post_h": rssm.post_h, "post_out": rssm.post_out}
        linears = ScanLinears(layers, compute_dtype(rssm))
        if not linears.record:
            yield
            return
        for name, layer in layers.items():
            plain = type(layer).forward.__get__(layer)
            layer.forward = _deferred(linears, name, plain)  # on the instance, for this block only
        try:
            yield
        finally:
            for layer in layers.values():
                del layer.forward

    def imagine(self, policy: Any, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """:meth:`CategoricalRSSM.imagine` ``(H+1, N, ...)`` with ``deter`` and ``index`` (``stoch`` too under
        autograd); without autograd the steps draw the class index alone (the same draws)."""
        rssm, grad = self.rssm, torch.is_grad_enabled()
        keys = ("deter", "stoch", "index") if grad else ("deter", "index")
        steps = {k: _Steps(horizon + 1) for k in keys}
        action_steps = _Steps(horizon + 1)
        state = _with_index(start)
        for t in range(horizon + 1):
            if t > 0:
                previous = action_steps.last
                state = _with_index(rssm.img_step(state, previous)) if grad else self._img_step_index(state, previous)
            action_steps.put(t, policy(state))
            for k, buf in steps.items():
                buf.put(t, state[k])
        return {k: buf.result() for k, buf in steps.items()}, action_steps.result()

    def _img_step_index(self, state: State, action: torch.Tensor) -> State:
        """``img_step`` (sampled, no autograd) returning ``deter``, ``index (N, S)`` and ``logits``."""
        rssm = self.rssm
        deter = rssm._cell(state, rssm._action_input(action))
        logits = rssm._prior_logits(deter)
        return {"deter": deter, "index": unimix_sample_index(logits, rssm.unimix, fast=True), "logits": logits}


def _deferred(linears: ScanLinears, name: str, plain: Any) -> Any:
    def forward(x: torch.Tensor | SplitFeat) -> torch.Tensor:
        return plain(x) if isinstance(x, SplitFeat) else linears(name, x)
    return forward


def _with_index(state: State) -> State:
    """``state`` plus ``index (..., S)``, the argmax of its exact one-hot ``stoch``."""
    return state if "index" in state else {**state, "index": one_hot_argmax(state["stoch"])}


def compute_dtype(rssm: nn.Module) -> torch.dtype:
    """The dtype the RSSM's linear layers compute in: autocast's where it is on, else the weights'."""
    device = rssm.in_a.weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rssm.in_a.weight.dtype


def reset_steps(is_first: torch.Tensor) -> list[bool]:
    """Which steps of ``is_first (T, B)`` reset any row; all of them off CPU (reading the flags would sync)."""
    if is_first.device.type != "cpu":
        return [True] * is_first.shape[0]
    return is_first.any(1).tolist()


class _Steps:
    """Per-step tensors ``(N, ...)`` gathered into ``(steps, N, ...)``: a preallocated buffer without autograd, else
    a list stacked once."""

    def __init__(self, steps: int):
        self.steps, self.buffer, self.items = steps, None, []
        self.last: torch.Tensor | None = None  # the tensor put last

    def put(self, t: int, x: torch.Tensor) -> None:
        self.last = x
        if self.buffer is None and not self.items and not torch.is_grad_enabled():
            self.buffer = x.new_empty((self.steps, *x.shape))
        if self.buffer is not None:
            self.buffer[t].copy_(x)
        else:
            self.items.append(x)

    def result(self) -> torch.Tensor:
        if self.buffer is not None:
            return self.buffer
        return torch.stack(self.items)  # steps x (N, ...) -> (steps, N, ...)


def check_fused_scan(rssm: nn.Module) -> None:
    """ValueError unless the modules are the classes the fused scan reads and two observe steps of scan and loop
    agree within ``1e-4`` relative (an edit of a module's forward code fails here)."""
    from reverie.models.dynamics.categorical import GRUCell  # here: that module builds this one

    def is_norm_silu(m: nn.Module) -> bool:
        return isinstance(m, nn.Sequential) and len(m) == 2 and type(m[0]) is nn.LayerNorm and type(m[1]) is nn.SiLU

    problems = []
    if type(rssm.gru) is not GRUCell:
        problems.append(f"the cell is a {type(rssm.gru).__name__}, not reverie's GRUCell")
    elif type(rssm.gru.linear) not in LINEARS or rssm.gru.linear.bias is not None or type(rssm.gru.norm) is not \
            nn.LayerNorm:
        problems.append("the GRUCell's layers are not a bias-free nn.Linear and an nn.LayerNorm")
    if not (is_norm_silu(rssm.in_norm) and is_norm_silu(rssm.post_norm)):
        problems.append("in_norm/post_norm are not LayerNorm -> SiLU")
    if type(rssm.in_z) not in LINEARS or type(rssm.post_h) not in LINEARS or type(rssm.post_out) not in \
            LINEARS or rssm.in_z.bias is not None or rssm.post_h.bias is not None or rssm.post_out.bias is None:
        problems.append("in_z/post_h/post_out are not the bias-free input and hidden layers and the biased output")
    if not problems:
        problems += _probe(rssm)
    if problems:
        raise ValueError("kernels=auto: the fused observe scan (reverie/models/kernels/observe_scan.py) does not "
                         "reproduce this RSSM: " + "; ".join(problems) + ". Set agent.module.kernels=off to train "
                         "the modules as written (the readable path), or update the fused scan to the new step.")


def _probe(rssm: nn.Module) -> list[str]:
    """Two observe steps (``B = 2``, a reset in each) of the fused scan against the readable loop; the problems."""
    weight = rssm.in_a.weight
    g = torch.Generator(device="cpu").manual_seed(0)
    units, batch = rssm.in_a.out_features, 2

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=weight.dtype).to(weight.device)

    action_proj, embed_proj = randn(2, batch, units), randn(2, batch, units)
    is_first = torch.tensor([[True, False], [False, True]], device=weight.device)
    first = is_first.to(weight.dtype).unsqueeze(-1)  # (T, B) -> (T, B, 1)
    index = torch.randint(rssm.classes, (batch, rssm.stoch), generator=g).to(weight.device)
    stoch = torch.zeros(batch, rssm.stoch, rssm.classes, dtype=weight.dtype, device=weight.device)
    state = {"deter": randn(batch, rssm.deter), "stoch": stoch.scatter_(-1, index.unsqueeze(-1), 1.0)}
    # never torch.manual_seed (it would seed every CUDA device): read the stream's state and put it back
    cuda = weight.device.type == "cuda"
    with torch.no_grad(), torch.random.fork_rng(devices=[weight.device] if cuda else []), \
            torch.autocast(weight.device.type, enabled=False):
        init = rssm.initial(batch)
        start = torch.cuda.get_rng_state(weight.device) if cuda else torch.get_rng_state()
        deter, logits, drawn = observe_scan(rssm, action_proj, embed_proj, first, [True, True], state["deter"],
                                            state["stoch"], init, weight.dtype)
        torch.cuda.set_rng_state(start, weight.device) if cuda else torch.set_rng_state(start)
        plain = rssm._observe_steps(action_proj, embed_proj, first, state, init, sample=True)
    fused = {"deter": deter, "logits": logits.unflatten(-1, (rssm.stoch, rssm.classes)), "stoch": drawn}
    return [f"two steps give a different {key} (largest difference {(fused[key] - plain[key]).abs().max():.3g})"
            for key in ("deter", "logits", "stoch")
            if not torch.allclose(fused[key].to(plain[key].dtype), plain[key], rtol=1e-4, atol=1e-5)]
