"""A STORM-style transformer dynamics (Zhang et al. 2023, "STORM: Efficient Stochastic Transformer based World Models
for Reinforcement Learning", section 3.1 and Figure 2; reference code weipu-zhang/STORM at 1c50658, ``sub_models/``).

No recurrent state: the posterior over the categorical latent ``z_t`` is read from the encoder's embedding alone, and
a causal transformer over one token per step predicts the prior of the next latent::

    posterior q(z_t | e_t):            logits = W_post e_t                           (world_models.py:125,135)
    token     x_t = stem(z_{t-1}, a_{t-1})   Linear-LN-ReLU-Linear-LN of cat(z, a)   (transformer_model.py:51-57)
    deter     h_t = transformer(x_{t-L+1..t}) causal, within the episode, last L      (transformer_model.py:64-76)
    prior     p(z_t | h_t):            logits = W_prior h_t                          (world_models.py:126,141)
    z_t       straight-through one-hot sample of unimix(logits)                      (world_models.py:128-133,313)

Timing is the RSSM's (:mod:`reverie.models.dynamics.base`): ``h_t`` is the transformer's output at the token of
``(z_{t-1}, prev_action_t)``, so the prior of step ``t`` comes from the posteriors before it and the features of
step ``t`` are ``cat(h_t, z_t)`` as in DreamerV3. STORM's ``h_t`` is the output at the token of ``(z_t, a_t)``
(predicting ``z_{t+1}``, ``r_t``, the termination after ``a_t``): the same quantity, indexed one step later.
Where ``is_first_t`` the previous latent and action are zero (the start token ``stem(0, 0)``) and attention does not
reach any token before ``t``: the mask replaces the RSSM's reset.

The transformer is STORM's post-LN block (``attention_blocks.py:48-132``): bias-free query/key/value/output
projections, attention probabilities and outputs with dropout, residual and LayerNorm (eps 1e-6), then a ReLU
feed-forward of ``units`` (STORM: ``2 * width``) with dropout, residual and LayerNorm. Positions: STORM adds a learned
absolute embedding of the index within the sequence (``attention_blocks.py:147-172``); here each head has a learned
bias per relative offset ``0 .. L-1`` (added to the attention scores), so that a token's keys and values do not
depend on where it sat in a window and the fixed-size cache can slide past ``L`` (acting through whole episodes,
imagination from any row). ``positions="absolute"`` is STORM's embedding, ``episode_mask=False`` STORM's context
across episode starts, and :meth:`TransformerDynamics.observe_storm` STORM's window timing (the world model's
``loss_layout: storm``). docs/transformer.md lists every difference.

State (every entry batch-first, fixed-shaped: ``(N, ...)`` for one step, ``(T, B, ...)`` along a sequence):

- ``deter (.., D)`` ``h_t``; ``stoch (.., S, K)`` ``z_t``; ``logits (.., S, K)`` of the distribution ``z_t`` was
  drawn from (the posterior's in ``observe``, the prior's in ``img_step``);
- ``keys``, ``values`` ``(.., layers, L, D)``: the key-value cache, each layer's keys and values of the tokens
  ``x_{t-L+1} .. x_t`` (oldest first; slot ``L-1`` is ``x_t``); ``valid (.., L)`` bool: which of them the next
  token may attend to (false before the episode's first token and before the start of the data).

STORM imagines with a cache that grows from a re-encoded context of 8 observed steps (``world_models.py:341-376``,
``train.py:52-73``); here every posterior row already carries its context (the keys and values of the tokens before
it in the window, up to ``L``), so :meth:`TransformerDynamics.starts` takes imagination starts from any rows of an
observed window, as the RSSM's do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models.distributions import UnimixCategorical, one_hot_index, unimix_sample
from reverie.models.dynamics.base import Policy, State, free_bits, rollout
from reverie.models.dynamics.categorical import kl_losses, scale_action
from reverie.models.switch import resolve

POSITIONS = ("relative", "absolute")


def attention_mask(is_first: torch.Tensor, carry_valid: torch.Tensor, context: int,
                   episodes: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Which keys each query of a window may attend to, and at which relative offset.

    The keys are the ``L`` cached tokens before the window (slot ``j`` is the token ``j - L`` steps relative to row
    0) followed by the window's ``T`` tokens: key ``j`` sits at position ``p_j = j - L``. Query ``t`` attends to key
    ``j`` iff ``p_j <= t`` (causal), ``t - p_j < L`` (the last ``L`` tokens: what the cache holds), no ``is_first``
    lies in ``(p_j, t]`` (the same episode; only with ``episodes``) and the key is valid (cached slots:
    ``carry_valid``; window tokens: always).

    Args:
        is_first: ``(T, B)`` bool. carry_valid: ``(B, L)`` bool, the cache's ``valid`` before the window.
        context: ``L``. episodes: block attention across ``is_first`` (False: STORM's context, which has no
            episode mask, ``world_models.py:393``).

    Returns:
        ``(allowed (B, T, L + T) bool, offsets (T, L + T) int64)``: ``offsets[t, j] = t - p_j``, clamped into
        ``[0, L - 1]`` (where ``allowed`` is false the offset is never read).
    """
    T, B = is_first.shape
    L = context
    device = is_first.device
    query = torch.arange(T, device=device)[:, None]  # (T, 1)
    position = torch.arange(L + T, device=device)[None, :] - L  # (1, L + T): p_j
    offsets = query - position  # (T, L + T)
    band = (offsets >= 0) & (offsets < L)  # causal and within the last L tokens
    episode = torch.cumsum(is_first.to(torch.int64), 0).transpose(0, 1)  # (T, B) -> (B, T): episode index per row
    key_episode = torch.cat([torch.zeros(B, L, dtype=torch.int64, device=device), episode], 1)  # (B, L + T)
    same = episode[:, :, None] == key_episode[:, None, :] if episodes else torch.ones((), dtype=torch.bool,
                                                                                        device=device)
    key_valid = torch.cat([carry_valid.bool(), torch.ones(B, T, dtype=torch.bool, device=device)], 1)  # (B, L + T)
    allowed = band[None] & same & key_valid[:, None, :]
    return allowed, offsets.clamp(0, L - 1)


class Block(nn.Module):
    """One post-LN transformer block of STORM (``attention_blocks.py:48-132``, ``AttentionBlockKVCache``).

    ``x <- LN(x + drop(W_o attn(W_q x, K, V)))``, then ``x <- LN(x + drop(W_2 relu(W_1 x)))``; the keys and values
    ``K = W_k x'``, ``V = W_v x'`` of the attended tokens ``x'`` come from :meth:`keys_values` (cached or not).
    Attention probabilities are ``softmax(q k^T / sqrt(d_head) + bias)`` with dropout (STORM's ``attn_dropout``).
    """

    def __init__(self, width: int, heads: int, units: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.query = nn.Linear(width, width, bias=False)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.attn_norm = nn.LayerNorm(width, eps=1e-6)
        self.ffn_in = nn.Linear(width, units)
        self.ffn_out = nn.Linear(units, width)
        self.ffn_norm = nn.LayerNorm(width, eps=1e-6)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` ``(B, T, D)`` of the tokens' inputs to this block ``x (B, T, D)``."""
        return self.key(x), self.value(x)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, H, T, D/H)``: one slice of the width per head."""
        B, T, D = x.shape
        return x.reshape(B, T, self.heads, D // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                drop: bool) -> torch.Tensor:
        """``x (B, Tq, D)`` attending to ``keys``, ``values`` ``(B, Tk, D)`` with the additive score ``bias``
        ``(B, H, Tq, Tk)`` (``-inf`` where masked) -> ``(B, Tq, D)``. ``drop``: apply dropout."""
        return self.attend(x, [self.split(keys)], [self.split(values)], bias, drop)

    def attend(self, x: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], bias: torch.Tensor,
               drop: bool) -> torch.Tensor:
        """:meth:`forward` with the attended tokens in chunks already split by head, ``(B, H, Tk_i, D/H)`` each
        (imagination: the start's cache and the imagined tokens, never concatenated); ``bias (B, H, Tq, sum Tk_i)``
        in the chunks' order."""
        B, Tq, D = x.shape
        q = self.split(self.query(x)) / math.sqrt(D // self.heads)  # (B, H, Tq, D/H)
        scores = torch.cat([q @ k.transpose(-1, -2) for k in keys], -1) + bias  # (B, H, Tq, Tk)
        probs = F.dropout(torch.softmax(scores, -1), self.dropout, training=drop)
        parts = probs.split([k.shape[-2] for k in keys], -1)
        attended = sum(p.to(v.dtype) @ v for p, v in zip(parts, values))  # (B, H, Tq, D/H)
        attended = attended.transpose(1, 2).reshape(B, Tq, D)  # (B, H, Tq, D/H) -> (B, Tq, D)
        x = self.attn_norm(x + F.dropout(self.out(attended), self.dropout, training=drop))
        return self.ffn_norm(x + F.dropout(self.ffn_out(F.relu(self.ffn_in(x))), self.dropout, training=drop))


class TransformerDynamics(nn.Module):
    """A STORM-style transformer dynamics, a :class:`reverie.models.dynamics.Dynamics` (module docstring).

    Args:
        action_dim: ``A``. embed_dim: ``E`` (both filled in by the world model).
        deter: ``D``, the transformer's width (STORM ``TransformerHiddenDim: 512``, ``config_files/STORM.yaml:29``);
            the ``h_t`` part of the features.
        stoch: ``S`` latent groups. classes: ``K`` per group (STORM: 32 x 32, ``world_models.py:222``).
        units: hidden width of each block's feed-forward part; None: ``2 * deter`` (STORM,
            ``transformer_model.py:60``).
        layers: transformer blocks (STORM ``TransformerNumLayers: 2``). heads: attention heads (STORM 8); must
            divide ``deter``.
        context: ``L``, the tokens a step attends to (itself and the ``L - 1`` before it) and the size of the cache
            (STORM ``TransformerMaxLength: 64``, the training sequence length).
        dropout: of the attention probabilities, the attention output and the feed-forward output (STORM 0.1,
            ``world_models.py:241``), applied in :meth:`observe` only while the module is in training mode and
            autograd records (the world-model update); imagination, acting and reports run without it, as STORM's
            ``eval()`` mode (``train.py:61,102``).
        unimix: uniform mix of the latent distributions (STORM and DreamerV3: 0.01, ``world_models.py:128``).
        free_nats: free bits of ``dyn`` and ``rep`` (STORM ``free_bits=1``, ``world_models.py:269``).
        action_clip: every action entering the stem is scaled into ``[-clip, clip]`` (:func:`scale_action`,
            DreamerV3's ``rssm.action_clip``); 0 turns it off. One-hot actions are unchanged.
        kernels: accepted for the config's shared ``agent.module.dynamics`` block; there is no fast path for this
            module, so ``"auto"`` and ``"off"`` run the same code.
        positions: ``"relative"`` (a learned score bias per layer, head and offset; the cache slides past ``L``) or
            ``"absolute"`` (STORM's: a learned embedding of the token's index in its context added to the token,
            then LayerNorm, ``attention_blocks.py:147-164``, ``transformer_model.py:62,69-71``). Absolute positions
            are baked into the cached keys, so a window holds at most ``L`` tokens (:meth:`observe` refuses longer
            ones) and a step after a full cache re-runs the last ``L`` tokens at positions ``0 .. L-1`` (STORM's
            acting re-runs its context each step, ``train.py:105-111``); the state keeps the tokens for it.
        episode_mask: block attention across ``is_first`` (True); False: STORM's context, which attends across
            episode starts (``world_models.py:393``; the token at ``is_first`` is still the start token).

    Raises:
        ValueError: ``heads`` does not divide ``deter``; a size below 1; ``dropout`` outside ``[0, 1)``; an unknown
            ``kernels`` or ``positions``; any other keyword (the keys of another dynamics' config block, e.g.
            ``hidden`` of the 2025 agent's: the message says how to replace the block).
    """

    loss_keys = ("dyn", "rep")
    feature_keys = ("deter", "stoch")

    def __init__(self, action_dim: int, embed_dim: int, deter: int = 512, stoch: int = 32, classes: int = 32,
                 units: int | None = None, layers: int = 2, heads: int = 8, context: int = 64, dropout: float = 0.1,
                 unimix: float = 0.01, free_nats: float = 1.0, action_clip: float = 1.0, kernels: str = "auto",
                 positions: str = "relative", episode_mask: bool = True, **foreign):
        super().__init__()
        if foreign:  # keys of another dynamics' block that dynamics=storm merged into (Hydra merges, never deletes)
            raise ValueError(
                f"TransformerDynamics: agent.module.dynamics holds keys this dynamics does not read: "
                f"{sorted(foreign)} (the agent's own dynamics block, e.g. agent=dreamerv3_2025's BlockRSSM, under "
                f"dynamics=storm). dynamics=storm is made for agent=dreamerv3; with another agent replace the whole "
                f"block: '~agent.module.dynamics' '+agent.module.dynamics={{_target_: "
                f"reverie.models.dynamics.TransformerDynamics, _partial_: true, deter: 256, stoch: 32, classes: 32, "
                f"context: 16}}' (agent=dreamerv3_2025 also needs agent.module.replay_context=0)")
        units = 2 * deter if units is None else int(units)
        if min(deter, stoch, classes, units, layers, heads, context) < 1:
            raise ValueError(f"TransformerDynamics: deter, stoch, classes, units, layers, heads and context must be "
                             f">= 1; got deter={deter} stoch={stoch} classes={classes} units={units} layers={layers} "
                             f"heads={heads} context={context}")
        if deter % heads:
            raise ValueError(f"TransformerDynamics: heads={heads} must divide the width deter={deter}; set "
                             f"agent.module.dynamics.heads to a divisor of {deter} (STORM: 8 heads at width 512)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TransformerDynamics: dropout must be in [0, 1), got {dropout}")
        if positions not in POSITIONS:
            raise ValueError(f"TransformerDynamics: positions must be one of {POSITIONS} (absolute: STORM's learned "
                             f"embedding), got {positions!r}")
        self.positions, self.episode_mask = positions, bool(episode_mask)
        # the state: absolute positions keep the window's tokens (before their positions) to re-run a full cache
        self.state_keys = ("deter", "stoch", "logits", "keys", "values", "valid") + \
            (("tokens",) if positions == "absolute" else ())
        self.kernels_allowed = resolve(kernels)  # checked; nothing to install (no fast path here)
        self.action_dim, self.embed_dim = action_dim, embed_dim
        self.deter, self.stoch, self.classes, self.units = deter, stoch, classes, units
        self.layers, self.heads, self.context, self.dropout = layers, heads, context, float(dropout)
        self.unimix, self.free_nats, self.action_clip = unimix, free_nats, float(action_clip)
        self.feat_dim = deter + stoch * classes
        # the token of (z_{t-1}, a_{t-1}): STORM's stem (transformer_model.py:51-57); PyTorch's default init as there
        self.stem = nn.Sequential(nn.Linear(stoch * classes + action_dim, deter, bias=False), nn.LayerNorm(deter),
                                  nn.ReLU(), nn.Linear(deter, deter, bias=False), nn.LayerNorm(deter))
        self.blocks = nn.ModuleList(Block(deter, heads, units, dropout) for _ in range(layers))
        if positions == "relative":  # a learned score bias per layer, head and relative offset 0..L-1
            self.position_bias = nn.Parameter(torch.zeros(layers, heads, context))
        else:  # STORM's PositionalEncoding1D (attention_blocks.py:147-164) and the LayerNorm after it
            self.position = nn.Embedding(context, deter)  # (transformer_model.py:58,70)
            self.position_norm = nn.LayerNorm(deter, eps=1e-6)  # (transformer_model.py:62,71)
        self.post_net = nn.Linear(embed_dim, stoch * classes)  # STORM DistHead.post_head
        self.prior_net = nn.Linear(deter, stoch * classes)  # STORM DistHead.prior_head

    # ------------------------------------------------------------------------------------------------ states
    def initial(self, batch: int) -> State:
        """The state before the first step ``(batch, ...)``: an empty cache (nothing valid), ``deter``, ``stoch``
        and ``logits`` zero. A step from it (``is_first`` or :meth:`img_step`) reads the zero latent and attends to
        itself alone; its own features are not a prediction (the RSSM's initial state is a learned one)."""
        w = self.prior_net.weight
        cache = w.new_zeros(batch, self.layers, self.context, self.deter)
        state = {"deter": w.new_zeros(batch, self.deter), "stoch": w.new_zeros(batch, self.stoch, self.classes),
                 "logits": w.new_zeros(batch, self.stoch, self.classes), "keys": cache, "values": cache.clone(),
                 "valid": torch.zeros(batch, self.context, dtype=torch.bool, device=w.device)}
        if self.positions == "absolute":  # the tokens before their positions (N, L, D), to re-run a full cache
            state["tokens"] = w.new_zeros(batch, self.context, self.deter)
        return state

    def features(self, state: State) -> torch.Tensor:
        """``cat(deter, flat stoch)`` ``(..., D + S*K)`` (DreamerV3's features; STORM's agent reads
        ``cat(z, h)``, ``world_models.py:360``)."""
        return torch.cat([state["deter"], state["stoch"].flatten(-2)], -1)  # (..., S, K) -> (..., S*K), concat

    def dist(self, state: State) -> torch.distributions.Independent:
        """The latent distribution of a state (or of its logits ``(..., S, K)``): event shape ``(S, K)``."""
        logits = state["logits"] if isinstance(state, dict) else state
        return torch.distributions.Independent(UnimixCategorical(logits, self.unimix), 1)

    def _draw(self, logits: torch.Tensor, sample: bool) -> torch.Tensor:
        """One-hot ``(..., S, K)``: a straight-through sample of the unimix distribution, or its mode."""
        if not sample:
            return one_hot_index(logits.argmax(-1), self.classes, torch.promote_types(logits.dtype, torch.float32))
        return unimix_sample(logits, self.unimix)

    def _logits(self, net: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return net(x).unflatten(-1, (self.stoch, self.classes))  # (..., S*K) -> (..., S, K)

    def _tokens(self, prev_stoch: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``stem(cat(z_{t-1}, a_{t-1}))`` ``(..., D)`` from ``(..., S, K)`` and ``(..., A)`` (action scaled)."""
        action = scale_action(action, self.action_clip)
        return self.stem(torch.cat([prev_stoch.flatten(-2).to(action.dtype), action], -1))

    def _bias(self, layer: int, offsets: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
        """The additive attention scores ``(B, H, Tq, Tk)``: the layer's offset bias where ``allowed``
        ``(B, Tq, Tk)``, ``-inf`` elsewhere; ``offsets (Tq, Tk)`` index ``position_bias[layer]``. Absolute
        positions: ``(B, 1, Tq, Tk)``, 0 or ``-inf`` (STORM's ``masked_fill(mask == 0, -1e9)``,
        ``attention_blocks.py:39-40``: the same probabilities)."""
        if self.positions == "absolute":
            zero = torch.zeros((), dtype=self.prior_net.weight.dtype, device=allowed.device)
            return zero.expand(allowed.shape)[:, None].masked_fill(~allowed[:, None], float("-inf"))
        bias = self.position_bias[layer][:, offsets]  # (H, L)[:, (Tq, Tk)] -> (H, Tq, Tk)
        return bias[None].masked_fill(~allowed[:, None], float("-inf"))

    def _place(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Absolute positions: ``LN(token + E[position])`` ``(..., D)`` from tokens ``(..., D)`` and ``position
        (...)`` int64 (STORM ``transformer_model.py:69-71``); relative: the tokens as they are."""
        if self.positions == "relative":
            return tokens
        return self.position_norm(tokens + self.position(position).to(tokens.dtype))

    # ----------------------------------------------------------------------------------------------- observe
    def observe(self, embed: torch.Tensor, prev_action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None, sample: bool = True) -> tuple[State, State]:
        """Posterior and prior states along observed sequences, all steps at once
        (:meth:`reverie.models.dynamics.Dynamics.observe`): ``embed (T, B, E)``, ``prev_action (T, B, A)``,
        ``is_first (T, B)`` bool and the state before the window (``(B, ...)``: its cache is attended to; None:
        :meth:`initial`) -> states ``(T, B, ...)`` (module docstring; the posterior's ``stoch`` drawn from
        ``q(z_t | e_t)``, the prior's from ``p(z_t | h_t)``, both sharing ``deter`` and the cache).

        Each row's ``keys``/``values`` ``(T, B, layers, L, D)`` are a view of the window's keys and values (no copy
        per row; :meth:`starts` copies the rows it takes).

        Raises:
            ValueError: absolute positions and ``T > L``; NotImplementedError: absolute positions, a carried cache
                that holds tokens and ``T > 1`` (acting continues one step at a time).
        """
        T, B = is_first.shape
        state = self.initial(B) if state is None else state
        post_logits = self._logits(self.post_net, embed)  # (T, B, S, K): the embedding alone (STORM section 3.1)
        stoch = self._draw(post_logits, sample)
        first = is_first.to(stoch.dtype)[..., None]  # (T, B) -> (T, B, 1)
        prev_stoch = torch.cat([state["stoch"][None].to(stoch.dtype), stoch[:-1]])  # z_{t-1}: (T, B, S, K)
        prev_stoch = prev_stoch * (1.0 - first[..., None])  # the start token where is_first
        tokens = self._tokens(prev_stoch, prev_action * (1.0 - first).to(prev_action.dtype))  # (T, B, D)
        if self.positions == "absolute" and bool((state["valid"] > 0.5).any()):  # acting: one step after a carry
            if T != 1:
                raise NotImplementedError("TransformerDynamics(positions='absolute'): observe continues a carried "
                                          "cache one step at a time (T = 1, acting); observe longer windows from "
                                          "state=None")
            valid = state["valid"] > 0.5
            if self.episode_mask:
                valid = valid & ~is_first[0, :, None]
            deter, cache = self._step(state, tokens[0], valid)
            deter, cache = deter[None], {k: v[None] for k, v in cache.items()}  # (B, ...) -> (1, B, ...)
        else:
            deter, cache = self._transform(tokens, is_first, state)
        return self._post_and_prior(deter, cache, stoch, post_logits, sample)

    def observe_storm(self, embed: torch.Tensor, action: torch.Tensor, is_first: torch.Tensor,
                      sample: bool = True) -> tuple[State, State]:
        """STORM's window pass (``world_models.py:384-398``, the world-model update's ``loss_layout: storm``): one
        token per observed step ``t = 0 .. T-1``, ``x_t = stem(z_t, a_t)``, no start token before it.

        Args:
            embed: ``(T, B, E)`` of ``o_0 .. o_{T-1}``. action: ``(T, B, A)``, ``a_t`` the action taken after
                ``o_t`` (reverie's rows: the next row's ``prev_action``). is_first: ``(T, B)``, whether the row
                after ``o_t`` starts an episode (the next row's ``is_first``): there the token is the start token
                ``stem(0, 0)``, as :meth:`observe` makes it, and with ``episode_mask`` attention stops before it.
            sample: draw the latents (False: their modes).

        Returns:
            ``(steps, next)`` ``(T, B, ...)`` in STORM's timing, sharing ``deter`` (STORM's ``h_t``, the output at
            ``x_t``) and the cache (the tokens up to ``x_t``): ``steps`` holds the posterior ``z_t ~ q(z_t | o_t)``,
            ``next`` the prior of the step after, ``z_{t+1} ~ p(z_{t+1} | h_t)``, which is a state of reverie's
            timing: row ``t + 1``'s prior (an imagination start: :meth:`truncate` of it follows a context).

        Raises:
            ValueError: absolute positions and ``T > L``.
        """
        post_logits = self._logits(self.post_net, embed)  # (T, B, S, K)
        stoch = self._draw(post_logits, sample)
        first = is_first.to(stoch.dtype)[..., None]  # (T, B, 1)
        tokens = self._tokens(stoch * (1.0 - first[..., None]), action * (1.0 - first).to(action.dtype))
        deter, cache = self._transform(tokens, is_first, self.initial(is_first.shape[1]))
        return self._post_and_prior(deter, cache, stoch, post_logits, sample)  # the prior: z_{t+1}

    def _post_and_prior(self, deter: torch.Tensor, cache: dict[str, torch.Tensor], stoch: torch.Tensor,
                        post_logits: torch.Tensor, sample: bool) -> tuple[State, State]:
        """The posterior and prior states ``(T, B, ...)`` sharing ``deter`` and the cache: the posterior with the
        given latents, the prior with latents drawn from ``prior_net(deter)``."""
        prior_logits = self._logits(self.prior_net, deter)  # (T, B, S, K)
        shared = {"deter": deter, **cache}
        return ({**shared, "stoch": stoch, "logits": post_logits},
                {**shared, "stoch": self._draw(prior_logits, sample), "logits": prior_logits})

    def storm_posterior(self, steps: State, next_: State) -> State:
        """Reverie's posterior states of rows ``1 .. T-2`` ``(T-2, B, ...)`` from :meth:`observe_storm`'s ``(T-1,
        B, ...)`` pair: row ``t``'s ``deter`` and cache are step ``t - 1``'s (the token ``(z_{t-1}, a_{t-1})``), its
        latent the posterior of ``o_t`` (imagination starts, :meth:`starts`)."""
        return {**{k: v[:-1] for k, v in next_.items()}, "stoch": steps["stoch"][1:], "logits": steps["logits"][1:]}

    def _transform(self, tokens: torch.Tensor, is_first: torch.Tensor,
                   state: State) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The transformer over a window's tokens ``(T, B, D)`` after ``state``'s cache ``(B, ...)``: ``deter
        (T, B, D)`` and each row's cache entries ``(T, B, ...)`` (``keys``, ``values``, ``valid``; ``tokens`` with
        absolute positions, where a token's position is the number of tokens it may attend to before it)."""
        T, B = is_first.shape
        L = self.context
        if self.positions == "absolute" and T > L:
            raise ValueError(f"TransformerDynamics(positions='absolute'): a window of {T} tokens needs context >= "
                             f"{T} (STORM: TransformerMaxLength = BatchLength), got context={L}")
        allowed, offsets = attention_mask(is_first, state["valid"] > 0.5, L, self.episode_mask)  # (B, T, L+T)
        drop = self.training and self.dropout > 0 and torch.is_grad_enabled()
        raw = tokens.transpose(0, 1)  # (T, B, D) -> (B, T, D)
        x = self._place(raw, allowed.sum(-1) - 1)  # absolute: the index among the tokens attended to
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            k, v = block.keys_values(x)  # (B, T, D)
            k = torch.cat([state["keys"][:, layer].to(k.dtype), k], 1)  # (B, L, D) + (B, T, D) -> (B, L+T, D)
            v = torch.cat([state["values"][:, layer].to(v.dtype), v], 1)
            keys.append(k)
            values.append(v)
            x = block(x, k, v, self._bias(layer, offsets, allowed), drop)
        deter = x.transpose(0, 1)  # (B, T, D) -> (T, B, D)
        # the cache after row t: the tokens t-L+1..t, i.e. the combined keys' slots t+1..t+L, as a sliding view
        cache = {name: torch.stack(parts, 1).unfold(2, L, 1)[:, :, 1:].permute(2, 0, 1, 4, 3)
                 for name, parts in (("keys", keys), ("values", values))}
        # (B, layers, L+T, D) -> unfold (B, layers, T+1, D, L) -> rows 1.. (B, layers, T, D, L) -> (T, B, layers, L, D)
        cache["valid"] = torch.diagonal(allowed.unfold(2, L, 1)[:, :, 1:], 0, 1, 2).permute(2, 0, 1)
        # the next query may attend where row t's did: allowed[b, t, t+1+j]; (B, T, T, L) -> (B, L, T) -> (T, B, L)
        if self.positions == "absolute":  # (B, L+T, D) -> unfold (B, T+1, D, L) -> rows 1.. -> (T, B, L, D)
            raw = torch.cat([state["tokens"].to(raw.dtype), raw], 1)
            cache["tokens"] = raw.unfold(1, L, 1)[:, 1:].permute(1, 0, 3, 2)
        return deter, cache

    # ----------------------------------------------------------------------------------------------- imagine
    def img_step(self, state: State, action: torch.Tensor, sample: bool = True) -> State:
        """One prior step with the key-value cache: state ``(N, ...)`` and action ``(N, A)`` -> the next state
        ``(N, ...)``. The token of ``(z_t, a_t)`` attends to the cache's last ``L - 1`` valid tokens and itself;
        the cache drops its oldest slot and appends the token (STORM ``forward_with_kv_cache``,
        ``transformer_model.py:86-102``, which keeps every token instead). No dropout."""
        deter, cache = self._step(state, self._tokens(state["stoch"], action), state["valid"] > 0.5)
        logits = self._logits(self.prior_net, deter)
        return {"deter": deter, "stoch": self._draw(logits, sample), "logits": logits, **cache}

    def _step(self, state: State, token: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor,
                                                                                       dict[str, torch.Tensor]]:
        """One token ``(N, D)`` after the cache of ``state`` (``valid (N, L)``: the cached slots it may attend to)
        -> ``deter (N, D)`` and the cache entries after it ``(N, ...)``. Absolute positions: the token's position is
        the number of valid slots; where a cache is full, :meth:`_rerun`."""
        N, L = token.shape[0], self.context
        if self.positions == "absolute":
            count = valid.sum(-1)  # (N,)
            if bool((count >= L).any()):
                return self._rerun(state, token, valid)
            x = self._place(token, count)[:, None]  # (N, 1, D)
        else:
            x = token[:, None]  # (N, 1, D)
        new_valid = torch.cat([valid[:, 1:], torch.ones(N, 1, dtype=torch.bool, device=x.device)], 1)
        offsets = torch.arange(L - 1, -1, -1, device=x.device)[None]  # slot j is L-1-j steps back: (1, L)
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            k, v = block.keys_values(x)  # (N, 1, D)
            k = torch.cat([state["keys"][:, layer, 1:].to(k.dtype), k], 1)  # (N, L-1, D) + (N, 1, D) -> (N, L, D)
            v = torch.cat([state["values"][:, layer, 1:].to(v.dtype), v], 1)
            keys.append(k)
            values.append(v)
            x = block(x, k, v, self._bias(layer, offsets, new_valid[:, None]), drop=False)
        cache = {"keys": torch.stack(keys, 1), "values": torch.stack(values, 1),  # (N, layers, L, D)
                 "valid": new_valid}
        if self.positions == "absolute":
            cache["tokens"] = torch.cat([state["tokens"][:, 1:].to(token.dtype), token[:, None]], 1)  # (N, L, D)
        return x[:, 0], cache

    def _rerun(self, state: State, token: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor,
                                                                                        dict[str, torch.Tensor]]:
        """Absolute positions after a full cache: the last ``L`` tokens (the cache's newest ``L - 1`` and
        ``token (N, D)``) run again at positions ``0 .. L-1`` (those that are valid; STORM's acting re-runs its
        context at every step, ``train.py:105-111``, ``world_models.py:281-289``). Returns as :meth:`_step`."""
        N, L = token.shape[0], self.context
        window = torch.cat([state["tokens"][:, 1:].to(token.dtype), token[:, None]], 1)  # (N, L, D)
        new_valid = torch.cat([valid[:, 1:], torch.ones(N, 1, dtype=torch.bool, device=token.device)], 1)
        x = self._place(window, (new_valid.cumsum(-1) - 1).clamp(min=0))  # (N, L, D)
        slots = torch.arange(L, device=token.device)
        causal = slots[:, None] >= slots[None, :]  # (L, L): query i, key j <= i
        allowed = causal & (new_valid[:, None, :] | (slots[:, None] == slots[None, :]))  # (N, L, L); self always
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            k, v = block.keys_values(x)  # (N, L, D)
            keys.append(k)
            values.append(v)
            x = block(x, k, v, self._bias(layer, None, allowed), drop=False)
        cache = {"keys": torch.stack(keys, 1), "values": torch.stack(values, 1), "valid": new_valid,
                 "tokens": window}
        return x[:, -1], cache

    def imagine(self, policy: Policy, start: State, horizon: int) -> tuple[State, torch.Tensor]:
        """Roll the prior ``horizon`` steps from ``start`` ``(N, ...)`` with ``action_t = policy(state_t)`` (STORM
        section 3.2, ``world_models.py:358-369``). Returns ``(states, actions)``: the :attr:`feature_keys`
        ``(H+1, N, ...)`` (the cache is not stacked over ``H``) and ``actions (H+1, N, A)``; the policy is called
        ``H + 1`` times in order, as by :func:`reverie.models.dynamics.rollout`, with states that hold
        ``deter``, ``stoch`` and ``logits``.

        The same steps as :meth:`img_step` applied ``H`` times, without copying the cache at every step: each
        imagined token attends to the start's cache (split by head once) and to the imagined tokens so far, the
        slots that fell out of the last ``L`` masked. Absolute positions: the ``m``-th imagined token sits at the
        start's number of valid slots plus ``m - 1``; where that would pass ``L - 1``, :meth:`img_step` ``H`` times
        (:func:`reverie.models.dynamics.rollout`: full caches re-run).
        """
        N, L = start["deter"].shape[0], self.context
        device = start["deter"].device
        slots = torch.arange(L, device=device)
        start_valid = start["valid"] > 0.5  # (N, L)
        count = start_valid.sum(-1)  # (N,): the first imagined token's absolute position
        if self.positions == "absolute" and bool((count + horizon > L).any()):
            return rollout(self.img_step, policy, start, horizon, self.feature_keys)
        # (N, L, D) -> (N, H, L, D/H), contiguous once (a strided one would be copied by every step's matmul)
        cache = [(block.split(start["keys"][:, i]).contiguous(), block.split(start["values"][:, i]).contiguous())
                 for i, block in enumerate(self.blocks)]
        new: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = [([], []) for _ in self.blocks]
        state = {k: start[k] for k in ("deter", "stoch", "logits")}
        states, actions = [state], []
        for step in range(horizon + 1):
            if step > 0:  # the step-th imagined token, t + step
                x = self._place(self._tokens(state["stoch"], actions[-1]), count + step - 1)[:, None]  # (N, 1, D)
                made = torch.arange(1, step + 1, device=device)  # imagined tokens m = 1..step
                # cached slot j holds token t-L+1+j: step+L-1-j back, kept while j >= step; token m: step-m back
                offsets = torch.cat([step + L - 1 - slots, step - made]).clamp(0, L - 1)[None]  # (1, L + step)
                allowed = torch.cat([start_valid & (slots >= step), (made > step - L).expand(N, step)], 1)
                for i, block in enumerate(self.blocks):
                    k, v = block.keys_values(x)
                    new[i][0].append(block.split(k))  # (N, H, 1, D/H)
                    new[i][1].append(block.split(v))
                    keys = [cache[i][0], torch.cat(new[i][0], 2)]  # (N, H, L, D/H), (N, H, step, D/H)
                    values = [cache[i][1], torch.cat(new[i][1], 2)]
                    x = block.attend(x, keys, values, self._bias(i, offsets, allowed[:, None]), drop=False)
                deter = x[:, 0]  # (N, 1, D) -> (N, D)
                logits = self._logits(self.prior_net, deter)
                state = {"deter": deter, "stoch": self._draw(logits, True), "logits": logits}
                states.append(state)
            actions.append(policy(state))
        stacked = {k: torch.stack([s[k] for s in states]) for k in self.feature_keys}  # (H+1) x (N, ...)
        return stacked, torch.stack(actions)  # (H+1) x (N, A) -> (H+1, N, A)

    def prior(self, state: State, sample: bool = True) -> State:
        """``state`` ``(..., ...)`` with its latent replaced by the prior's, ``p(z_t | h_t)`` from its own ``deter``:
        what STORM acts on (``train.py:105-115``: the action of step ``t`` is chosen before ``o_t`` enters the
        context, from ``calc_last_dist_feat``'s prior sample). The cache entries are unchanged."""
        logits = self._logits(self.prior_net, state["deter"])
        return {**state, "stoch": self._draw(logits, sample), "logits": logits}

    # ------------------------------------------------------------------------------------- starts and carries
    def starts(self, post: State, last: int = 0) -> State:
        """Imagination starts ``(N, ...)`` from an observed window's posterior ``(T, B, ...)``: every row
        (``last=0``, ``N = T*B``, start ``t*B + b`` from row ``t``, column ``b``) or the last ``last`` rows
        (``N = last*B``). Each start holds its cache: the keys and values of the tokens before it in the window (up
        to ``L``, within its episode), copied here. Not detached (the agent detaches).

        Raises:
            ValueError: ``last`` outside ``[0, T]``.
        """
        T = post["deter"].shape[0]
        if not 0 <= last <= T:
            raise ValueError(f"starts: last must be in [0, T] = [0, {T}] (0: every row), got {last}")
        rows = slice(T - last, None) if last else slice(None)
        return {k: post[k][rows].flatten(0, 1) for k in self.state_keys}  # (K, B, ...) -> (K*B, ...)

    def truncate(self, post: State) -> State:
        """The carry after a window's last row ``(B, ...)``: that row's state, its cache included (what
        ``observe(..., state=)`` continues from)."""
        return {k: post[k][-1] for k in self.state_keys}

    def context_spec(self) -> dict:
        """Empty: a window cannot start from one stored replay row, since the state after a row is the cache of the
        ``L`` tokens before it (``layers x L x D`` keys and values), not a per-row latent; the 2025 agent's replay
        context (``agent.module.replay_context``) does not apply to this dynamics."""
        return {}

    def context_rows(self, post: State) -> dict[str, torch.Tensor]:
        """Not available (:meth:`context_spec` is empty).

        Raises:
            NotImplementedError: always, naming the fix.
        """
        raise NotImplementedError(self._no_context())

    def context_state(self, rows: dict[str, torch.Tensor]) -> State:
        """Not available (:meth:`context_spec` is empty).

        Raises:
            NotImplementedError: always, naming the fix.
        """
        raise NotImplementedError(self._no_context())

    @staticmethod
    def _no_context() -> str:
        return ("TransformerDynamics cannot rebuild its state from one stored replay row (its state is a cache of "
                "the tokens before the row); set agent.module.replay_context=0")

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, post: State, prior: State, prev_action: torch.Tensor,
             is_first: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``dyn`` and ``rep`` ``(T, B)``: DreamerV3's KL terms with free bits per step
        (:func:`reverie.models.dynamics.kl_losses`; STORM ``world_models.py:405-406`` clips the batch mean instead),
        and the unclipped ``kl`` and the latent entropies as info."""
        kl = kl_losses(post["logits"], prior["logits"], self.free_nats, self.unimix)
        return {"dyn": kl["dyn"], "rep": kl["rep"]}, {k: kl[k].mean() for k in ("kl", "prior_entropy", "post_entropy")}

    def storm_loss(self, steps: State, next_: State) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """STORM's KL terms over a window in its timing (:meth:`observe_storm`; ``world_models.py:200-213,
        405-406``): the posteriors of steps ``1 .. T-1`` against the priors predicted at steps ``0 .. T-2`` (step
        0 has no prior: skipped), each KL summed over the ``S`` latents, then free bits on the mean over ``(T-1,
        B)`` (:func:`batch_free_bits`): ``dyn = max(free, mean KL(sg(q) || p))``, ``rep = max(free, mean KL(q ||
        sg(p)))``, scalars ``()``; the unclipped ``kl`` and the latent entropies as info."""
        kl = kl_losses(steps["logits"][1:], next_["logits"][:-1], float("-inf"), self.unimix)  # (T-1, B), no clip
        losses = {k: batch_free_bits(kl[k], self.free_nats) for k in ("dyn", "rep")}
        return losses, {k: kl[k].mean() for k in ("kl", "prior_entropy", "post_entropy")}


def batch_free_bits(kl: torch.Tensor, free_nats: float) -> torch.Tensor:
    """STORM's free bits (``world_models.py:210-212``): ``max(free_nats, mean(kl))`` ``()`` over every step of the
    batch ``kl (T, B)``, where DreamerV3 clips each step (:func:`reverie.models.dynamics.free_bits`)."""
    return free_bits(kl.mean(), free_nats)
