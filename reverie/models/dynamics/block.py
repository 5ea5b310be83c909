"""The RSSM of the current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``dreamerv3/rssm.py`` ``RSSM``).

State: ``deter`` ``h_t (..., D)``, ``stoch`` ``z_t (..., S, K)`` one-hot (1% unimix), ``logits (..., S, K)``.
``_core`` (``rssm.py:135-159``): ``h``, ``z``, ``a`` through ``dynin0..2``; each of ``G`` blocks sees its slice of
``h`` plus all three; ``dynhid{i}`` block layers; ``dyngru`` gates, ``update = sigmoid(u - 1)``. Prior
``_prior``/``prior{i}`` on ``h_t``, posterior ``_observe``/``obs{i}`` on ``[h_t, e_t]``. ``is_first`` zeroes state and
action (``nn.mask(..., ~reset)``; zero ``initial``); actions scaled as :func:`scale_action`; losses ``dyn``/``rep``
(``rssm.py:120-133``). ``deter`` stays float32 under bf16 autocast (the official rounds it; docs/speed.md round 3).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.block_linear import BlockLinear
from reverie.models.distributions import UnimixCategorical, one_hot_index, unimix_sample
from reverie.models.dynamics.base import RowState, State, rollout
from reverie.models.dynamics.categorical import kl_losses, scale_action
from reverie.models.rms_mlp import NormDense, RMSMLP
from reverie.models.rmsnorm import RMSNorm
from reverie.models.switch import resolve


class BlockGRU(nn.Module):
    """The recurrent core (``rssm.py:135-159``): ``deter (N, D)``, ``stoch (N, S*K)``, scaled and masked ``action
    (N, A)`` -> ``deter (N, D)``; ``G = blocks`` (official 8). ValueError: ``deter`` not divisible by ``blocks``."""

    def __init__(self, deter: int, stoch: int, action_dim: int, hidden: int, blocks: int = 8, dynlayers: int = 1):
        super().__init__()
        if blocks < 1 or deter % blocks:
            raise ValueError(f"BlockGRU: deter {deter} must be a multiple of blocks {blocks} (official: "
                             f"deter 8192, blocks 8); pick agent.module.dynamics.deter/blocks to match")
        self.deter, self.blocks, self.hidden_dim = deter, blocks, hidden
        self.in_deter, self.in_stoch, self.in_action = (NormDense(deter, hidden), NormDense(stoch, hidden),
                                                        NormDense(action_dim, hidden))  # dynin0, dynin1, dynin2
        dim, layers = deter + blocks * 3 * hidden, []  # G * (D/G + 3*hidden)
        for _ in range(dynlayers):  # dynhid{i}: block linear, then RMSNorm over all D features and SiLU
            layers += [BlockLinear(dim, deter, blocks), RMSNorm(deter), nn.SiLU()]
            dim = deter
        self.hidden = nn.Sequential(*layers)
        self.gates = BlockLinear(dim, 3 * deter, blocks)  # dyngru

    def forward(self, deter: torch.Tensor, stoch: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.step(deter, stoch, self.in_action(action), self.shared_weight())

    def shared_weight(self) -> torch.Tensor:
        """The first block layer's weights on the shared inputs, dense ``(3*hidden, G*O)`` (once per scan)."""
        layer = (list(self.hidden) or [self.gates])[0]
        w = layer.weight[:, self.deter // self.blocks:]  # (G, 3*hidden, O)
        return w.permute(1, 0, 2).reshape(w.shape[1], -1)  # (G, 3h, O) -> (3h, G, O) -> (3h, G*O)

    def step(self, deter: torch.Tensor, stoch: torch.Tensor, action_x: torch.Tensor,
             shared_weight: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with ``in_action(action)`` ``(N, hidden)`` and :meth:`shared_weight` given."""
        x = torch.cat([self.in_deter(deter), self.in_stoch(stoch), action_x], -1)  # (N, 3*hidden)
        n, g = x.shape[0], self.blocks
        layers = list(self.hidden) or [self.gates]
        # (N, D) or, without dynlayers, (N, 3D)
        x = self._first_block_layer(layers[0], deter.to(x.dtype), x, shared_weight)
        for layer in layers[1:]:
            x = layer(x)
        if self.hidden:
            x = self.gates(x)
        gates = x.view(n, g, 3, self.deter // g)  # (N, 3D) -> (N, G, 3, D/G)
        reset, cand, update = (gates[:, :, i].reshape(n, self.deter) for i in range(3))  # 3 x (N, G, D/G) -> (N, D)
        cand = torch.tanh(torch.sigmoid(reset) * cand)
        update = torch.sigmoid(update - 1.0)
        dtype = torch.promote_types(deter.dtype, update.dtype)  # the state keeps its (float32) dtype under autocast
        return torch.lerp(deter.to(dtype), cand.to(dtype), update.to(dtype))  # update * cand + (1 - update) * deter

    def _first_block_layer(self, layer: BlockLinear, deter: torch.Tensor, x: torch.Tensor,
                           shared_weight: torch.Tensor) -> torch.Tensor:
        """``layer`` on block inputs ``[deter block g, x]`` without building them: ``(N, D)``, ``(N, 3*hidden) ->
        (N, G*O)`` by one batched and one dense (``shared_weight``) product."""
        n, g, per = x.shape[0], self.blocks, self.deter // self.blocks
        own = torch.bmm(deter.view(n, g, per).transpose(0, 1), layer.weight[:, :per])  # (G, N, D/G) @ (G, D/G, O)
        shared = x @ shared_weight  # (N, 3h) @ (3h, G*O) -> (N, G*O)
        return (own.transpose(0, 1).reshape(n, -1) + shared) + layer.bias.to(shared.dtype)  # (G, N, O) -> (N, G*O)


class BlockRSSM(RowState, nn.Module):
    """The official RSSM as a :class:`reverie.models.dynamics.Dynamics`; :class:`RowState` gives the official
    ``starts``, ``truncate``, ``entry_space`` (``rssm.py:40-60``). Defaults: ``configs.yaml`` ``dyn.rssm`` (deter 8192,
    hidden 1024, stoch 32, classes 64, blocks 8). ``kernels="auto"`` lets :func:`reverie.models.kernels.install`
    swap in the subclass whose observe scan is one autograd node (:mod:`reverie.models.kernels.block_scan`).
    """

    loss_keys = ("dyn", "rep")
    state_keys = ("deter", "stoch", "logits")
    feature_keys = ("deter", "stoch")  # what features() reads (official feat2tensor)
    carry_keys = ("deter", "stoch")  # what observe(state=) and img_step read (official carry, entry_space)

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 8192, hidden: int = 1024, stoch: int = 32,
                 classes: int = 64, blocks: int = 8, dynlayers: int = 1, imglayers: int = 2, obslayers: int = 1,
                 unimix: float = 0.01, free_nats: float = 1.0, outscale: float = 1.0, action_clip: float = 1.0,
                 kernels: str = "auto"):
        super().__init__()
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may swap in its subclass
        self.deter, self.stoch, self.classes, self.unimix, self.free_nats = deter, stoch, classes, unimix, free_nats
        self.action_dim, self.embed_dim, self.action_clip = action_dim, embed_dim, float(action_clip)
        self.feat_dim = deter + stoch * classes
        self.core = BlockGRU(deter, stoch * classes, action_dim, hidden, blocks, dynlayers)
        self.prior_net = RMSMLP(deter, stoch * classes, hidden, imglayers, outscale)  # prior{i}, priorlogit
        self.post_net = RMSMLP(deter + embed_dim, stoch * classes, hidden, obslayers, outscale)  # obs{i}, obslogit

    def initial(self, batch: int) -> State:
        """Zeros ``(batch, ...)`` (official ``initial``): what ``is_first`` resets to."""
        zeros = self.core.gates.weight.new_zeros
        return {"deter": zeros(batch, self.deter), "stoch": zeros(batch, self.stoch, self.classes),
                "logits": zeros(batch, self.stoch, self.classes)}

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, flat stoch)`` ``(..., D + S*K)`` (official ``feat2tensor``)."""
        return torch.cat([state["deter"], state["stoch"].flatten(-2).to(state["deter"].dtype)], -1)

    def dist(self, state: State | torch.Tensor) -> torch.distributions.Independent:
        """The latent distribution of a state or logits ``(..., S, K)``, event shape ``(S, K)``."""
        logits = state["logits"] if isinstance(state, dict) else state
        return torch.distributions.Independent(UnimixCategorical(logits, self.unimix), 1)

    def _logits(self, net: RMSMLP, x: torch.Tensor) -> torch.Tensor:
        return net(x).unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _draw(self, logits: torch.Tensor, sample: bool) -> torch.Tensor:
        """Straight-through one-hot sample of the unimix latents ``(..., S, K)`` float32, or the mode."""
        if sample:
            return unimix_sample(logits, self.unimix)
        return one_hot_index(logits.argmax(-1), self.classes, torch.promote_types(logits.dtype, torch.float32))

    def _step(self, deter: torch.Tensor, stoch: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.core(deter, stoch.flatten(-2), scale_action(action, self.action_clip))  # (N, S, K) -> (N, S*K)

    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """:meth:`Dynamics.observe` (official ``observe``/``_observe``): ``(posterior, prior)``, ``deter (T, B, D)``,
        ``stoch``/``logits (T, B, S, K)``."""
        T, B = is_first.shape
        state = self.initial(B) if state is None else state
        deter, stoch = state["deter"], state["stoch"]
        keep = (~is_first).unsqueeze(-1)  # (T, B) -> (T, B, 1); where is_first: zero state and zero action
        # state-independent parts for all rows at once: the action projection, the posterior's embed columns
        action = scale_action(prev_action, self.action_clip) * keep.to(prev_action.dtype)  # (T, B, A)
        action_x = self.core.in_action(action)  # (T, B, hidden)
        first, _ = self._posterior_layers()
        embed_x = F.linear(embed, first.weight[:, self.deter:], first.bias)  # (T, B, hidden)
        resets = is_first.any(1).tolist() if is_first.device.type == "cpu" else [True] * T  # no host sync off CPU
        post = self._posterior_steps(action_x, embed_x, keep, resets, deter, stoch, sample)
        prior_logits = self._logits(self.prior_net, post["deter"])  # all rows at once: (T, B, D) -> (T, B, S, K)
        return post, {"deter": post["deter"], "stoch": self._draw(prior_logits, sample), "logits": prior_logits}

    def _posterior_steps(self, action_x: torch.Tensor, embed_x: torch.Tensor, keep: torch.Tensor, resets: list[bool],
                         deter: torch.Tensor, stoch: torch.Tensor, sample: bool) -> State:
        """The observe scan, step by step: projections ``(T, B, hidden)``, ``keep (T, B, 1)`` bool (False where
        ``is_first``), ``resets`` (``T`` bools: a step with a reset), the state before -> posterior ``(T, B, ...)``."""
        shared_weight = self.core.shared_weight()
        first, rest = self._posterior_layers()
        deter_weight = first.weight[:, :self.deter]
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.state_keys}
        for t in range(len(resets)):
            if resets[t]:
                k = keep[t].to(deter.dtype)
                deter, stoch = deter * k, stoch * k.unsqueeze(-1)
            deter = self.core.step(deter, stoch.flatten(-2), action_x[t], shared_weight)  # (B, S, K) -> (B, S*K)
            logits = rest(F.linear(deter.to(embed_x.dtype), deter_weight) + embed_x[t])  # (B, S*K)
            logits = logits.unflatten(-1, (self.stoch, self.classes))  # (B, S*K) -> (B, S, K)
            stoch = self._draw(logits, sample)
            for key, value in (("deter", deter), ("stoch", stoch), ("logits", logits)):
                out[key].append(value)
        return {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)

    def _posterior_layers(self) -> tuple[nn.Linear, Callable[[torch.Tensor], torch.Tensor]]:
        """``(first, rest)`` with ``post_net(x) == rest(first(x))``."""
        net = self.post_net
        if not len(net.hidden):
            return net.out, lambda x: x
        tail = nn.Sequential(*list(net.hidden[0])[1:], *list(net.hidden)[1:], net.out)  # norm, act, ..., logits
        return net.hidden[0][0], tail

    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step (official ``imagine`` with ``single=True``): state ``(N, ...)``, action ``(N, A)``."""
        deter = self._step(state["deter"], state["stoch"], action)
        logits = self._logits(self.prior_net, deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits}

    def imagine(self, policy: Callable[[State], torch.Tensor], start: State,
                horizon: int) -> tuple[State, torch.Tensor]:
        """:meth:`Dynamics.imagine`; the last action is never executed (the official ``lastact``)."""
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    def loss(self, post: State, prior: State, prev_action: torch.Tensor | None = None,
             is_first: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``dyn`` and ``rep`` ``(T, B)`` with free bits; info: the unclipped ``kl`` and the latent entropies."""
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {k: kl[k].mean() for k in ("kl", "prior_entropy", "post_entropy")}
