"""The categorical RSSM's fast subclass (``kernels="auto"``): :class:`FusedRSSM` is
:class:`reverie.models.dynamics.CategoricalRSSM` with its observe scan as one autograd node
(:mod:`reverie.models.kernels.observe_scan`) and its features and input layer read by class index
(:mod:`reverie.models.kernels.onehot_linear`); the same values and draws, gradients up to float rounding.
:func:`check_fused_scan` refuses, at construction, an RSSM whose modules were edited.
"""

from __future__ import annotations

import torch
from torch import nn

from reverie.models.dynamics.base import Policy
from reverie.models.dynamics.categorical import CategoricalRSSM, GRUCell
from reverie.models.kernels.observe_scan import observe_scan
from reverie.models.kernels.onehot_linear import (GATHER_MIN_ROWS, OneHotFeatures, OneHotLinear, gathers_pay,
                                                  one_hot_argmax)

State = dict[str, torch.Tensor]
LINEARS = (nn.Linear, OneHotLinear)  # what the fused scan reads the weights of


class FusedRSSM(CategoricalRSSM):
    """:class:`CategoricalRSSM` with the fast paths; made from one by :meth:`adopt` (ValueError as
    :func:`check_fused_scan`)."""

    @classmethod
    def adopt(cls, rssm: CategoricalRSSM) -> "FusedRSSM":
        """Make ``rssm`` (a plain :class:`CategoricalRSSM`) this class in place, its input layer a
        :class:`OneHotLinear`; parameters and ``state_dict`` keys unchanged."""
        check_fused_scan(rssm)
        rssm.__class__ = cls
        rssm.in_z.__class__ = OneHotLinear
        return rssm

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, flat stoch)`` ``(..., D + S*K)`` as :class:`OneHotFeatures` (marked: its tail is one-hot, so
        ``stoch`` must be exactly one-hot, as every state of this RSSM is); for :meth:`imagine`'s states a view of its
        buffer, not a copy (a write into those states shows in the features)."""
        deter, stoch = state["deter"], state["stoch"]
        feat = joined(deter, stoch)
        if feat is None:
            feat = super().features(state)
        index = one_hot_argmax(stoch) if gathers_pay(stoch) else None  # where a layer will gather
        return OneHotFeatures.of(feat, self.deter, self.stoch, index)

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """:meth:`CategoricalRSSM.imagine`; without autograd each step is written into one ``(H+1, N, D + S*K)``
        buffer (``deter`` and ``stoch`` are its views: not contiguous), so the features the policy and the heads
        read are views of it, not concatenated copies. The buffer is in the compute dtype (bf16 under bf16
        autocast: the dtype every layer reads the features in, so no layer casts them again), while the recurrence
        carries ``deter`` in its own dtype (float32) and reads ``stoch`` back from the buffer (one-hot: exact in
        bf16). The same draws and values; the returned states are in the compute dtype."""
        deter0, stoch0 = start["deter"], start["stoch"]
        if torch.is_grad_enabled() or deter0.dtype != stoch0.dtype:
            return super().imagine(policy, start, horizon)
        buffer = deter0.new_empty(horizon + 1, deter0.shape[0], self.feat_dim, dtype=compute_dtype(self))
        states = {"deter": buffer[..., :self.deter],
                  "stoch": buffer[..., self.deter:].unflatten(-1, (self.stoch, self.classes))}
        state, actions = start, []
        for t in range(horizon + 1):
            if t > 0:
                state = self.img_step(state, actions[-1])
            states["deter"][t].copy_(state["deter"])
            states["stoch"][t].copy_(state["stoch"])
            row = {key: value[t] for key, value in states.items()}  # step t's views, in the compute dtype
            state = {"deter": state["deter"], "stoch": row["stoch"]}  # the recurrence keeps deter's own dtype
            actions.append(policy(row))
        return states, torch.stack(actions)  # (H+1) x (N, A) -> (H+1, N, A)

    def _cell(self, state: State, action_proj: torch.Tensor) -> torch.Tensor:
        stoch = state["stoch"]
        if stoch.shape[:-2].numel() < GATHER_MIN_ROWS or not gathers_pay(stoch):
            return super()._cell(state, action_proj)
        z = OneHotFeatures.of(stoch.flatten(-2), 0, self.stoch, one_hot_argmax(stoch))  # (N, S*K), by gathers
        return self.gru(self.in_norm(self.in_z(z) + action_proj), state["deter"])

    def _observe_steps(self, action_proj: torch.Tensor, embed_proj: torch.Tensor, first: torch.Tensor,
                       state: State, init: State, sample: bool) -> State:
        """The fused scan where it applies (sampled, with autograd, on CPU, in the compute dtype), else the loop."""
        dtype = compute_dtype(self)
        if not (sample and torch.is_grad_enabled() and action_proj.device.type == "cpu"
                and action_proj.dtype == embed_proj.dtype == dtype):
            return super()._observe_steps(action_proj, embed_proj, first, state, init, sample)
        resets = (first != 0).any(1).flatten().tolist()  # (T, B, 1) -> T bools: steps that reset some row
        deter, logits, stoch = observe_scan(self, action_proj, embed_proj, first, resets, state["deter"],
                                            state["stoch"], init, dtype)
        return {"deter": deter, "stoch": stoch, "logits": logits.unflatten(-1, (self.stoch, self.classes))}


def compute_dtype(rssm: nn.Module) -> torch.dtype:
    """The dtype the RSSM's linear layers compute in: autocast's where it is on, else the weights'."""
    device = rssm.in_a.weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rssm.in_a.weight.dtype


def joined(deter: torch.Tensor, stoch: torch.Tensor) -> torch.Tensor | None:
    """``cat(deter (..., D), flat stoch (..., S, K))`` as a view where the two are adjacent columns of one tensor
    without autograd (:meth:`FusedRSSM.imagine`'s buffer), else None."""
    d, width = deter.shape[-1], deter.shape[-1] + stoch.shape[-2] * stoch.shape[-1]
    if deter.requires_grad or stoch.requires_grad or deter.dtype != stoch.dtype or deter.shape[:-1] != \
            stoch.shape[:-2] or deter.stride()[:-1] != stoch.stride()[:-2] or deter.stride(-1) != 1 or \
            stoch.stride()[-2:] != (stoch.shape[-1], 1) or any(s < width for s in deter.stride()[:-1]) or \
            stoch.data_ptr() != deter.data_ptr() + d * deter.element_size() or \
            deter.untyped_storage().data_ptr() != stoch.untyped_storage().data_ptr():
        return None
    return deter.as_strided((*deter.shape[:-1], width), deter.stride())


def check_fused_scan(rssm: nn.Module) -> None:
    """ValueError unless the modules are the classes the fused scan reads and two observe steps of scan and loop
    agree within ``1e-4`` relative (an edit of a module's forward code fails here)."""
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
        plain = CategoricalRSSM._observe_steps(rssm, action_proj, embed_proj, first, state, init, sample=True)
    fused = {"deter": deter, "logits": logits.unflatten(-1, (rssm.stoch, rssm.classes)), "stoch": drawn}
    return [f"two steps give a different {key} (largest difference {(fused[key] - plain[key]).abs().max():.3g})"
            for key in ("deter", "logits", "stoch")
            if not torch.allclose(fused[key].to(plain[key].dtype), plain[key], rtol=1e-4, atol=1e-5)]
