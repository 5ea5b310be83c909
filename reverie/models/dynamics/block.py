"""The RSSM of the current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``dreamerv3/rssm.py`` ``RSSM``): a
block-diagonal GRU, RMSNorm everywhere, zero initial state.

State ``s_t = (h_t, z_t)``: ``deter`` ``h_t`` ``(..., D)``, ``stoch`` ``z_t`` ``(..., S, K)`` one-hot latents with 1%
unimix, and their ``logits`` ``(..., S, K)``. One step (``_core``, ``rssm.py:135-159``)::

    x0, x1, x2 = silu(rms(W h_{t-1})), silu(rms(W z_{t-1})), silu(rms(W a_{t-1}))     dynin0..2, width `hidden`
    x = concat over G blocks of [h_{t-1} block g, x0, x1, x2]   (G*(D/G + 3*hidden),)  each block sees all of x
    x = silu(rms(BlockLinear(x)))  x dynlayers                   (D,)  dynhid{i}
    r, c, u = BlockLinear(x) cut per block into 3 x (D/G)       dyngru
    h_t = sigmoid(u - 1) * tanh(sigmoid(r) * c) + (1 - sigmoid(u - 1)) * h_{t-1}
    prior     p(z_t | h_t):       logits = W silu(rms(W h_t)) x imglayers           (_prior, prior{i})
    posterior q(z_t | h_t, e_t):  logits = W silu(rms(W [h_t, e_t])) x obslayers    (_observe, obs{i})

Where ``is_first_t`` is set the previous state and action are zeroed (``nn.mask(..., ~reset)``): the initial state
is zeros, not learned (``initial``). Actions enter scaled into ``[-1, 1]`` (``action /= sg(max(1, |action|))``,
the same as the 2023 ``action_clip: 1``; :func:`reverie.models.dynamics.categorical.scale_action`). Losses (``loss``,
``rssm.py:120-133``): ``dyn = max(1, KL(sg(post) || prior))`` and ``rep = max(1, KL(post || sg(prior)))``, as in
2023 (:func:`reverie.models.dynamics.categorical.kl_losses`); the agent scales them 1.0 and 0.1.

The deterministic state is kept in float32 under bfloat16 autocast (the official code rounds it to its 16-bit
compute dtype; reverie's 2023 RSSM keeps float32, see docs/speed.md round 3); everything else follows autocast.
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
    """The recurrent core ``h_t = f(h_{t-1}, z_{t-1}, a_{t-1})`` of the official RSSM (``rssm.py:135-159``).

    Args:
        deter: ``D``. stoch: ``S*K`` (the flat one-hot latent). action_dim: ``A``.
        hidden: width of the three input projections (official ``hidden``).
        blocks: ``G``, the GRU's diagonal blocks (official ``blocks: 8``). dynlayers: hidden block layers (1).

    ``forward(deter (N, D), stoch (N, S*K), action (N, A)) -> deter (N, D)``; ``action`` as it enters the
    dynamics (already scaled and masked).

    Raises:
        ValueError: ``deter`` not divisible by ``blocks``.
    """

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
        """The first block layer's weights on the inputs every block shares, as one dense ``(3*hidden, G*O)``
        matrix (:meth:`step` takes it, so a scan computes it once)."""
        layer = (list(self.hidden) or [self.gates])[0]
        w = layer.weight[:, self.deter // self.blocks:]  # (G, 3*hidden, O)
        return w.permute(1, 0, 2).reshape(w.shape[1], -1)  # (G, 3h, O) -> (3h, G, O) -> (3h, G*O)

    def step(self, deter: torch.Tensor, stoch: torch.Tensor, action_x: torch.Tensor,
             shared_weight: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with the action already projected (``in_action(action)`` ``(N, hidden)``, e.g. for
        all rows of a sequence at once) and :meth:`shared_weight` given."""
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
        """``layer`` on the official input, block ``g`` = ``[deter block g, x]`` (``(N, G*(D/G + 3*hidden))``),
        without building it: ``deter block g @ W_g[:D/G]`` by one batched product plus ``x @ W_g[D/G:]`` for every
        block by one dense product (``shared_weight``), then the bias. ``(N, D)``, ``(N, 3*hidden) -> (N, G*O)``."""
        n, g, per = x.shape[0], self.blocks, self.deter // self.blocks
        own = torch.bmm(deter.view(n, g, per).transpose(0, 1), layer.weight[:, :per])  # (G, N, D/G) @ (G, D/G, O)
        shared = x @ shared_weight  # (N, 3h) @ (3h, G*O) -> (N, G*O)
        return (own.transpose(0, 1).reshape(n, -1) + shared) + layer.bias.to(shared.dtype)  # (G, N, O) -> (N, G*O)


class BlockRSSM(RowState, nn.Module):
    """The current official RSSM (module docstring), with the members of reverie's dynamics interface
    (:class:`reverie.models.dynamics.Dynamics`); starts, truncate and the replay context from
    :class:`reverie.models.dynamics.base.RowState`, as the official ``starts``, ``truncate`` and ``entry_space``
    (``rssm.py:40-60``: a row's ``deter`` and ``stoch``).

    Args:
        action_dim: ``A``. embed_dim: ``E``, the encoder's output width.
        deter, hidden, stoch, classes, blocks: sizes (official ``configs.yaml`` ``dyn.rssm``: 8192, 1024, 32, 64, 8;
            the size presets ``size1m``..``size400m`` change deter, hidden and classes).
        dynlayers, imglayers, obslayers: depths of the GRU input, prior and posterior stacks (1, 2, 1).
        unimix: uniform mix of the latents (0.01). free_nats: free bits of dyn and rep (1.0).
        outscale: init scale of the two logit layers (1.0). action_clip: actions scaled into
            ``[-action_clip, action_clip]`` before the dynamics (the official ``_core``'s ``max(1, |a|)``: 1.0).
        kernels: ``"auto"``: :func:`reverie.models.kernels.install` may set ``fast`` (the latent draw through
            :mod:`reverie.models.kernels.sampling` and :mod:`reverie.models.kernels.straight_through`, the same values
            and gradient; an agent with ``kernels="auto"`` does) and ``observe_kernel`` (the sampled observe loop under
            autograd as one node, :mod:`reverie.models.kernels.block_scan`); ``"off"``: plain autograd, whatever
            installs.

    State entries: ``deter (..., D)`` float32, ``stoch (..., S, K)``, ``logits (..., S, K)``; features and the
    carry read ``deter`` and ``stoch``.
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
        self.kernels_allowed = resolve(kernels)  # whether reverie.models.kernels.install may set fast
        self.fast = False  # install: the sampling kernels
        # install: the fused observe scan (reverie.models.kernels.block_scan.BlockScan), used where not None
        self.observe_kernel = None
        self.deter, self.stoch, self.classes, self.unimix, self.free_nats = deter, stoch, classes, unimix, free_nats
        self.action_dim, self.embed_dim, self.action_clip = action_dim, embed_dim, float(action_clip)
        self.feat_dim = deter + stoch * classes
        self.core = BlockGRU(deter, stoch * classes, action_dim, hidden, blocks, dynlayers)
        self.prior_net = RMSMLP(deter, stoch * classes, hidden, imglayers, outscale)  # prior{i}, priorlogit
        self.post_net = RMSMLP(deter + embed_dim, stoch * classes, hidden, obslayers, outscale)  # obs{i}, obslogit

    # ------------------------------------------------------------------------------------------------ states
    def initial(self, batch: int) -> State:
        """Zeros ``(batch, ...)`` (official ``initial``): what ``is_first`` resets to."""
        zeros = self.core.gates.weight.new_zeros
        return {"deter": zeros(batch, self.deter), "stoch": zeros(batch, self.stoch, self.classes),
                "logits": zeros(batch, self.stoch, self.classes)}

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, flat stoch)`` ``(..., D + S*K)`` (official ``feat2tensor``)."""
        return torch.cat([state["deter"], state["stoch"].flatten(-2).to(state["deter"].dtype)], -1)

    def dist(self, state: State | torch.Tensor) -> torch.distributions.Independent:
        """The latent distribution of a state (or of logits ``(..., S, K)``); event shape ``(S, K)``."""
        logits = state["logits"] if isinstance(state, dict) else state
        return torch.distributions.Independent(UnimixCategorical(logits, self.unimix), 1)

    def _logits(self, net: RMSMLP, x: torch.Tensor) -> torch.Tensor:
        return net(x).unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _draw(self, logits: torch.Tensor, sample: bool) -> torch.Tensor:
        """Straight-through one-hot sample of the unimix latents ``(..., S, K)`` float32, or the mode."""
        if sample:
            return unimix_sample(logits, self.unimix, fast=self.fast)
        return one_hot_index(logits.argmax(-1), self.classes, torch.promote_types(logits.dtype, torch.float32))

    def _step(self, deter: torch.Tensor, stoch: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.core(deter, stoch.flatten(-2), scale_action(action, self.action_clip))  # (N, S, K) -> (N, S*K)

    # ----------------------------------------------------------------------------------------------- observe
    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Posterior and prior states along observed sequences (official ``observe``/``_observe``).

        Args:
            embed: ``(T, B, E)``. prev_action: ``(T, B, A)``, the action that led to each row. is_first: ``(T, B)``.
            state: the state before the first row ``(B, ...)`` (the replay context's stored latent, or the last
                acting step's); None: :meth:`initial`.
            sample: draw the latents (training, acting) or take their mode.

        Returns:
            ``(posterior, prior)`` with ``deter (T, B, D)``, ``stoch``/``logits (T, B, S, K)``; the prior's
            ``stoch`` is drawn from the prior logits of the same ``deter``.
        """
        T, B = is_first.shape
        state = self.initial(B) if state is None else state
        deter, stoch = state["deter"], state["stoch"]
        keep = (~is_first).unsqueeze(-1)  # (T, B) -> (T, B, 1); where is_first: zero state and zero action
        # what does not depend on the state is computed for all rows at once: the action's input projection and
        # the embedding's part of the posterior's first layer (its weights split into deter and embed columns)
        action = scale_action(prev_action, self.action_clip) * keep.to(prev_action.dtype)  # (T, B, A)
        action_x = self.core.in_action(action)  # (T, B, hidden)
        shared_weight = self.core.shared_weight()
        first, rest = self._posterior_layers()
        embed_x = F.linear(embed, first.weight[:, self.deter:], first.bias)  # (T, B, hidden)
        deter_weight = first.weight[:, :self.deter]
        resets = is_first.any(1).tolist() if is_first.device.type == "cpu" else [True] * T  # no host sync off CPU
        scan = None
        if self.observe_kernel is not None and sample and torch.is_grad_enabled():  # kernels: one autograd node
            scan = self.observe_kernel(action_x, embed_x, keep.to(deter.dtype), resets, deter, stoch)
        if scan is not None:
            deter, logits, stoch = scan
            post = {"deter": deter, "stoch": stoch,
                    "logits": logits.unflatten(-1, (self.stoch, self.classes))}  # (T, B, S*K) -> (T, B, S, K)
        else:
            out: dict[str, list[torch.Tensor]] = {k: [] for k in self.state_keys}
            for t in range(T):
                if resets[t]:
                    k = keep[t].to(deter.dtype)
                    deter, stoch = deter * k, stoch * k.unsqueeze(-1)
                deter = self.core.step(deter, stoch.flatten(-2), action_x[t], shared_weight)  # (B, S, K) -> (B, S*K)
                logits = rest(F.linear(deter.to(embed_x.dtype), deter_weight) + embed_x[t])  # (B, S*K)
                logits = logits.unflatten(-1, (self.stoch, self.classes))  # (B, S*K) -> (B, S, K)
                stoch = self._draw(logits, sample)
                for key, value in (("deter", deter), ("stoch", stoch), ("logits", logits)):
                    out[key].append(value)
            post = {k: torch.stack(v) for k, v in out.items()}  # T x (B, ...) -> (T, B, ...)
        prior_logits = self._logits(self.prior_net, post["deter"])  # all rows at once: (T, B, D) -> (T, B, S, K)
        return post, {"deter": post["deter"], "stoch": self._draw(prior_logits, sample), "logits": prior_logits}

    def _posterior_layers(self) -> tuple[nn.Linear, Callable[[torch.Tensor], torch.Tensor]]:
        """The posterior net as ``(first linear layer on cat(deter, embed), the rest)``: ``post_net(x) ==
        rest(first(x))``."""
        net = self.post_net
        if not len(net.hidden):
            return net.out, lambda x: x
        tail = nn.Sequential(*list(net.hidden[0])[1:], *list(net.hidden)[1:], net.out)  # norm, act, ..., logits
        return net.hidden[0][0], tail

    # ----------------------------------------------------------------------------------------------- imagine
    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step (official ``imagine`` with ``single=True``): state ``(N, ...)``, action ``(N, A)``."""
        deter = self._step(state["deter"], state["stoch"], action)
        logits = self._logits(self.prior_net, deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits}

    def imagine(self, policy: Callable[[State], torch.Tensor], start: State,
                horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior ``horizon`` steps from ``start`` ``(N, ...)`` with ``action_t = policy(state_t)``
        (:func:`reverie.models.dynamics.base.rollout`).

        Returns:
            ``(states, actions)``: states ``(H+1, N, ...)`` (:attr:`feature_keys`: ``deter``, ``stoch``) with
            ``start`` at index 0, actions ``(H+1, N, A)``, ``actions[t]`` chosen at ``states[t]`` (the last one is
            never executed; the official code draws it as ``lastact``).
        """
        return rollout(self.img_step, policy, start, horizon, self.feature_keys)

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, post: State, prior: State, prev_action: torch.Tensor | None = None,
             is_first: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``dyn`` and ``rep`` ``(T, B)`` with free bits; info: the unclipped ``kl`` and the latent entropies."""
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {k: kl[k].mean() for k in ("kl", "prior_entropy", "post_entropy")}
