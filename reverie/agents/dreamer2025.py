"""DreamerV3 as the current official code has it (danijar/dreamerv3 at e3f0224, the 2024-25 rewrite): ``agent=
dreamerv3_2025``. docs/dreamerv3.md has the table of what changed since the 2023 code, file and line on both sides.

One update (``dreamerv3/agent.py`` ``Agent.loss``, ``imag_loss``, ``repl_loss``), one loss, one optimiser:

- world model (:class:`reverie.models.world_model_2025.WorldModel2025`): reconstruction, reward, continue
  (target ``(1 - is_terminal) * (1 - 1/horizon)``), ``dyn``, ``rep``;
- imagination of ``H`` steps from the posterior states of the last ``K`` rows (``imag_last``; 0: all ``T``),
  without gradients into the world model; the imagined continue *probabilities* discount the lambda-returns
  (``contdisc``: gamma 1 in the return, the discount lives in the continue head) and weight the losses
  (``cumprod``, starting with the start state's own prediction);
- policy by REINFORCE for every action type: ``-sg(weight) * (log pi(a_t | s_t) * sg(adv_t) + actent * H[pi])``
  with ``adv = (R - v) / max(1, P95 - P5)`` (EMA percentiles of the returns; the advantage itself is not
  normalised further: ``advnorm: none``);
- value: two-hot symexp regression to the lambda-return plus ``slowreg`` times the slow value's prediction
  (``slowtar: False``: the return bootstraps with the fast value);
- replay value (``repval``): on the replayed rows, lambda-returns of the real rewards and terminations that
  bootstrap with each row's imagined return (``gamma = 1 - 1/horizon``, ``lam`` 0.95, cut at ``is_last``),
  trained through the posterior features into the world model;
- total ``rec 1, rew 1, con 1, dyn 1, rep 0.1, policy 1, value 1, repval 0.3``, one backward pass, LaProp with
  AGC (:class:`reverie.agents.optim.LaProp`) over all parameters; the slow value moves 2% towards the value after it.

Replay context (``replay_context: 1``, official ``configs.yaml:15``, ``agent.py:312-340``): every replay row stores a
posterior latent, the entries of the dynamics' ``context_spec()`` as ``posterior_<name>`` (the block RSSM's
``posterior_deter``, ``posterior_stoch``; :func:`reverie.replay.latent_key`) with ``has_posterior``: the acting
posterior when the agent acted on the row (the official driver stores the policy's outputs with each step,
``driver.py:70-77``), none (``has_posterior`` false) for prefill rows and rows from a dataset. A training window
has ``batch_length + 1`` rows: row 0 is the context, whose stored latent is the state before row 1 (the dynamics'
``context_state``), and rows ``1..T`` are trained (row 1 ``is_first`` only where its data says so); a context row
without a latent starts row 1 from the initial state instead, as a window without context does. After the update the
posteriors of rows ``1..T`` are written back into the replay (``update``'s ``replay_writes``; official ``train``
returns them as ``outs['replay']``, ``agent.py:144-150``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from reverie.agents import objectives
from reverie.agents.base import UpdateResult, WorldModelAgent, loss_scale_table
from reverie.agents.dreamer import Actor
from reverie.agents.returns import ReturnNormalizer, imagination_weights, lambda_return
from reverie.agents.optim import LaProp
from reverie.models.distributions import TwoHotSymexp
from reverie.models.dynamics import check_dynamics
from reverie.models.kernels import install
from reverie.models.rms_mlp import RMSMLP
from reverie.models.world_model_2025 import WorldModel2025
from reverie.replay.buffer import LATENT_FLAG, latent_key
from reverie.runtime.collectives import all_gather_cat
from reverie.runtime.precision import autocast
from reverie.types import ActionSpec

#: official ``loss_scales`` (``configs.yaml:86``); ``rec`` applies to every observation key; ``barlow`` and ``infonce``
#: are R2-Dreamer's (``configs/model/_base_.yaml:22-23``), read with ``representation: r2`` / ``infonce`` only
LOSS_SCALES = {"rec": 1.0, "barlow": 0.05, "infonce": 1.0, "reward": 1.0, "cont": 1.0, "dyn": 1.0, "rep": 0.1,
               "policy": 1.0, "value": 1.0, "repval": 0.3}
#: the losses of the update besides the world model's
BEHAVIOR_LOSSES = ("policy", "value", "repval")


def replay_is_last(is_last: torch.Tensor, is_first: torch.Tensor) -> torch.Tensor:
    """``is_last (T, B)`` also set on every row followed by an ``is_first`` row in the window (an episode left
    without its last row; official ``replay.py:287-291``)."""
    following = torch.zeros_like(is_first)
    following[:-1] = is_first[1:]
    return is_last | following


def replay_returns(reward: torch.Tensor, boot: torch.Tensor, is_terminal: torch.Tensor, is_last: torch.Tensor,
                   gamma: float, lam: float) -> torch.Tensor:
    """Lambda-returns ``(K-1, B)`` of replayed rows ``(K, B)`` that bootstrap with ``boot``, each row's imagined
    return (official ``repl_loss`` and ``lambda_return``, ``agent.py:449-490``)::

        R_t = r_{t+1} + gamma (1 - term_{t+1}) ((1 - lam_{t+1}) boot_{t+1} + lam_{t+1} R_{t+1}),   R_{K-1} = boot_{K-1}

    with ``lam_{t+1} = 0`` where ``is_last_{t+1}``: an episode's last row bootstraps from its own imagined return
    and nothing after it enters. Rows that are themselves ``is_last`` get ``(1 - term_t) boot_t`` here (the official
    code runs the recursion on into the next episode); the loss gives them weight 0 either way.
    """
    return lambda_return(reward, boot, 1.0 - is_terminal.float(), gamma, lam, is_last=is_last)


class PolicyLag(nn.Module):
    """The official code's acting copy of the policy (``embodied/jax/agent.py``: ``policy_params`` and
    ``pending_sync``): the agent acts with a copy of its world model and actor; the first update after the copy was
    last refreshed stores the parameters it starts from as pending, and the next ``act`` acts with the copy, then
    takes the pending parameters. So the policy lags the trained parameters by the updates of one to two acting
    steps (the official DMC runs: 16 envs at ratio 1024, 16 updates per policy call, 16-32 updates behind).

    Holds ``wm``/``actor`` (the acting copy), ``pending_wm``/``pending_actor`` and the flag ``pending`` (a buffer),
    all saved with the agent, so a resumed run acts as the run it continues.
    """

    def __init__(self, wm: nn.Module, actor: nn.Module):
        super().__init__()
        self.wm, self.actor = copy.deepcopy(wm).requires_grad_(False), copy.deepcopy(actor).requires_grad_(False)
        self.pending_wm = copy.deepcopy(wm).requires_grad_(False)
        self.pending_actor = copy.deepcopy(actor).requires_grad_(False)
        self.register_buffer("pending", torch.zeros((), dtype=torch.bool))

    def before_update(self, wm: nn.Module, actor: nn.Module) -> None:
        """The first update since the copy took the pending parameters: keep the ones it starts from."""
        if not bool(self.pending):
            _copy_state(((self.pending_wm, wm), (self.pending_actor, actor)))
            self.pending.fill_(True)

    def acted(self) -> None:
        """After acting: the copy takes the pending parameters, if any."""
        if bool(self.pending):
            _copy_state(((self.wm, self.pending_wm), (self.actor, self.pending_actor)))
            self.pending.fill_(False)


@torch.no_grad()
def _copy_state(pairs) -> None:
    """Copy each ``(target, source)`` module pair's parameters and buffers (same architecture) in place."""
    for target, source in pairs:
        for a, b in zip(target.state_dict().values(), source.state_dict().values()):
            a.copy_(b)


class DreamerV3_2025(WorldModelAgent):
    """The current official DreamerV3 agent, with the :class:`reverie.agents.base.Agent` protocol.

    Args:
        obs_shapes: ``{key: shape}``. action_spec: :class:`reverie.types.ActionSpec`.
        dynamics: the dynamics factory or :class:`reverie.models.dynamics.BlockRSSM` arguments (config
            ``agent.module.dynamics``).
        units: width of encoder, decoder, heads, policy and value (size presets).
        enc_layers, dec_layers, reward_layers, cont_layers, actor_layers, critic_layers: hidden layers
            (official 3, 3, 1, 1, 3, 3).
        cnn_depth, cnn: image stacks (:class:`reverie.models.world_model_2025.WorldModel2025`).
        horizon: imagination length ``H`` (``imag_length: 15``). imag_last: imagine from the last ``K`` rows of
            each replayed sequence (0: all rows; official default 0).
        gamma: ``1 - 1/horizon`` (``horizon: 333``): the continue target's factor (``contdisc``) and the replay
            return's discount. contdisc: put the discount into the continue head (official True); False discounts
            the imagined returns by ``gamma`` instead.
        lam: lambda of both returns (0.95). loss_scales: the official scales (:data:`LOSS_SCALES`) overridden;
            after ``rec`` is spread over the decoded keys and the other objectives' entries are dropped, the keys
            must be the update's losses, as a set (official ``agent.py:237-238``).
        representation, objectives: the world model's representation objective and its settings
            (:class:`reverie.agents.DreamerV3`; R2-Dreamer builds on this agent's official code).
        actor_entropy: ``actent`` (3e-4). actor_outscale, critic_outscale: output layer init scales (0.01, 0.0).
        actor_unimix: uniform mix of the discrete policy (0.0: the official ``policy`` config sets ``unimix: 0.01``
            but the ``categorical`` head it selects never reads it, ``heads.py:101-110``).
        min_std, max_std: bounds of the continuous policy's std (0.1, 1.0).
        slow_critic_fraction: the slow value's EMA rate (``slowvalue.rate: 0.02``, every update).
        slow_reg: ``slowreg`` (1.0) of the value and replay value losses.
        retnorm_decay, retnorm_limit, retnorm_low, retnorm_high: the return percentile normaliser (rate 0.01,
            limit 1.0, 5th and 95th percentiles; ``retnorm`` in ``configs.yaml:111``).
        lr, agc, eps, beta1, beta2, warmup: :class:`reverie.agents.optim.LaProp` (4e-5, 0.3, 1e-20, 0.9, 0.999, 1000).
        replay_context: 1: windows start from the stored posterior of their first row (module docstring; the
            official default; the dynamics' ``context_spec``, ``context_rows`` and ``context_state``); 0: every
            window starts from the initial state at row 0.
        kernels: ``"auto"`` or ``"off"`` (``agent.module.kernels``): the two-hot kernel in the reward, value and
            replay value losses and the sampling kernel in the policy's draw (:mod:`reverie.models.kernels`; the
            dynamics read the key through their own config block).
        device, precision: as :class:`reverie.agents.DreamerV3`.
        policy_lag: act with the official code's lagging copy of the policy (:class:`PolicyLag`; on under
            ``exp=reference``); False: act with the parameters as trained.

    Raises:
        ValueError: ``imag_last`` negative or 1 with the replay value loss on (its returns need two rows),
            a loss without a scale or a scale of no loss, ``replay_context`` other than 0 or 1, or 1 with a dynamics
            whose ``context_spec()`` is empty (it cannot start a window from a stored row), an unknown
            ``representation`` or objective setting.
        TypeError: a dynamics without the members of :class:`reverie.models.dynamics.Dynamics`.
    """

    optimizers = ("opt",)

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_spec: ActionSpec,
                 dynamics: Callable[..., Any] | dict | None = None, units: int = 1024, enc_layers: int = 3,
                 dec_layers: int = 3, reward_layers: int = 1, cont_layers: int = 1, actor_layers: int = 3,
                 critic_layers: int = 3, cnn_depth: int = 64, cnn: dict | None = None, horizon: int = 15,
                 imag_last: int = 0, gamma: float = 1.0 - 1.0 / 333.0, contdisc: bool = True, lam: float = 0.95,
                 loss_scales: dict[str, float] | None = None, actor_entropy: float = 3e-4,
                 actor_outscale: float = 0.01, critic_outscale: float = 0.0, actor_unimix: float = 0.0,
                 min_std: float = 0.1, max_std: float = 1.0, slow_critic_fraction: float = 0.02,
                 slow_reg: float = 1.0, retnorm_decay: float = 0.99, retnorm_limit: float = 1.0,
                 retnorm_low: float = 0.05, retnorm_high: float = 0.95, lr: float = 4e-5, agc: float = 0.3,
                 eps: float = 1e-20, beta1: float = 0.9, beta2: float = 0.999, warmup: int = 1000,
                 replay_context: int = 0, kernels: str = "auto", device: str = "cpu", precision: str = "auto",
                 representation: str = "reconstruction", objectives: dict | None = None, policy_lag: bool = False):
        super().__init__()
        if replay_context not in (0, 1):
            raise ValueError(f"DreamerV3_2025: replay_context must be 0 (no context) or 1 (one context row, the "
                             f"official default), got {replay_context!r}")
        self.replay_context = int(replay_context)
        self.fast = False  # install (below): the kernels of the value losses and the policy's draw
        scales = LOSS_SCALES | dict(loss_scales or {})
        if imag_last < 0 or (imag_last == 1 and scales.get("repval")):
            raise ValueError(f"DreamerV3_2025: imag_last must be 0 (all rows) or >= 2 with the replay value loss on "
                             f"(its returns need two rows), got {imag_last}")
        self.spec, self.horizon, self.imag_last = action_spec, int(horizon), int(imag_last)
        self.gamma, self.contdisc, self.lam = float(gamma), bool(contdisc), float(lam)
        self.actor_entropy = actor_entropy
        self.slow_fraction, self.slow_reg = slow_critic_fraction, slow_reg
        self.obs_keys = sorted(obs_shapes)
        self.wm = WorldModel2025(obs_shapes, action_spec.dim, dynamics, units=units, enc_layers=enc_layers,
                                 dec_layers=dec_layers, reward_layers=reward_layers, cont_layers=cont_layers,
                                 cnn_depth=cnn_depth, cnn=cnn, cont_discount=self.gamma if contdisc else 1.0,
                                 kernels=kernels, representation=representation, objectives=objectives)
        check_dynamics(self.wm.dynamics)
        # the replay context's entries (the dynamics' context_spec, read once) and their replay keys posterior_<name>
        self._context_spec = dict(self.wm.dynamics.context_spec())
        self._context = {name: latent_key(name) for name in self._context_spec}
        if self.replay_context and not self._context:
            raise ValueError(f"DreamerV3_2025: replay_context={self.replay_context} needs a dynamics that can start "
                             f"a window from a stored row, but {type(self.wm.dynamics).__name__}.context_spec() is "
                             f"empty; set agent.module.replay_context=0")
        # the one loss of the update: one scale per loss key, checked as a set (loss_scale_table)
        self.loss_scales = loss_scale_table(loss_scales, self.wm.representation,
                                            (*self.wm.loss_keys, *BEHAVIOR_LOSSES), "DreamerV3_2025",
                                            defaults=LOSS_SCALES)
        feat = self.wm.dynamics.feat_dim
        out = action_spec.dim if action_spec.discrete else 2 * action_spec.dim
        split = None if action_spec.discrete else (action_spec.dim, action_spec.dim)  # mean, std: heads.py:146-148
        self.actor = Actor(feat, action_spec, units, actor_layers, actor_unimix, min_std, max_std,
                           net=RMSMLP(feat, out, units, actor_layers, actor_outscale, out_split=split))
        self.critic = RMSMLP(feat, 255, units, critic_layers, critic_outscale)
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.retnorm = ReturnNormalizer(retnorm_decay, retnorm_limit, retnorm_low, retnorm_high)
        # policy_lag: the official acting copy (module docstring of PolicyLag); its modules are saved with the agent
        self.policy_lag = PolicyLag(self.wm, self.actor) if policy_lag else None
        install(self, kernels)  # into every module built above (reverie.models.kernels), with the agent's setting
        self._place(device, precision)
        self.opt = LaProp(self.trainable(), lr=lr, agc=agc, eps=eps, beta1=beta1, beta2=beta2, warmup=warmup)

    def trainable(self) -> list[nn.Parameter]:
        """Every parameter the one optimiser trains: world model, policy and value (not the slow value)."""
        return [*self.wm.parameters(), *self.actor.parameters(), *self.critic.parameters()]

    # ----------------------------------------------------------------------------------------------- acting
    def _acting_model(self) -> nn.Module:
        """With ``policy_lag`` the acting copy filters and acts, then takes the pending parameters
        (:class:`PolicyLag`, in :meth:`_acted`)."""
        return self.policy_lag.wm if self.policy_lag is not None else self.wm

    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """Sample the policy (``"explore"``, ``"sample"``) or take its mode (``"eval"``; the official policy
        samples in every mode; official ``Agent.policy``); one-hot, or clipped to ``[-1, 1]``."""
        actor = self.policy_lag.actor if self.policy_lag is not None else self.actor
        dist = actor(self._acting_model().dynamics.features(post))
        action = dist.mode if mode == "eval" else dist.sample()
        return (action if self.spec.discrete else action.clamp(-1.0, 1.0)).float()

    def _acted(self) -> None:
        if self.policy_lag is not None:
            self.policy_lag.acted()

    def replay_latent_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The replay keys of the stored latents with their per-row shapes: ``posterior_<name>`` for every entry of
        the dynamics' ``context_spec()`` (the block RSSM's ``posterior_deter (D,)``, ``posterior_stoch (S, K)``
        float32) and ``has_posterior ()`` bool; empty without replay context."""
        if not self.replay_context:
            return {}
        spec = self._context_spec
        return {key: spec[name] for name, key in self._context.items()} | {LATENT_FLAG: ((), np.dtype(bool))}

    def replay_latent(self, state: Any) -> dict[str, np.ndarray]:
        """The latents to store with the row the agent just acted on: the dynamics' ``context_rows`` of the acting
        carry in ``state`` (what :meth:`act` returned for that row) as ``(N, ...)`` arrays, ``has_posterior`` true;
        empty without replay context or without a state (the row gets no latent)."""
        if not self.replay_context or state is None:
            return {}
        carry = state[0]
        rows = self.wm.dynamics.context_rows({k: v[None] for k, v in carry.items()})  # (N, ...) -> (1, N, ...)
        spec = self._context_spec
        out = {key: rows[name][0].cpu().numpy().astype(spec[name][1], copy=False)
               for name, key in self._context.items()}  # (1, N, ...) -> (N, ...)
        n = next(iter(out.values())).shape[0]
        return out | {LATENT_FLAG: np.ones(n, bool)}

    # ----------------------------------------------------------------------------------------------- learning
    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """One update on a replay batch ``(T, B, ...)`` with observation keys, ``prev_action``, ``reward``,
        ``is_first``, ``is_last``, ``is_terminal``; returns the metrics (``loss/<key>`` for every loss, gradient
        norm, returns), ``skipped`` and, with replay context, ``replay_writes``: the dynamics' ``context_rows`` of
        the trained rows' posteriors as ``posterior_<name> (T, B, ...)`` and ``has_posterior (T, B)`` (false, with
        zeros, where a row's entries are not all finite), for :meth:`reverie.replay.Replay.write` at
        ``replay_start + 1``.

        Without replay context row 0 starts from the initial state (official ``replay.py:286`` sets ``is_first``
        there). With it the batch has ``T + 1`` rows and the latent keys: row 0 is the context (its stored
        posterior is the state before row 1; none: the initial state), rows ``1..T`` are trained and their
        posteriors returned as ``replay_writes`` (official ``_apply_replay_context``, ``agent.py:312-340``).

        Raises:
            ValueError: replay context is on but the batch lacks the latent keys (sample a replay built with
                :meth:`replay_latent_spec`).
        """
        if self.policy_lag is not None:
            self.policy_lag.before_update(self.wm, self.actor)
        data = self._update_inputs(batch)
        data["is_last"] = torch.as_tensor(np.asarray(batch["is_last"]), device=self.device)
        state = None
        if self.replay_context:
            missing = [k for k in (*self._context.values(), LATENT_FLAG) if k not in batch]
            if missing:
                raise ValueError(f"DreamerV3_2025 with replay_context=1 needs the stored latents {missing} in the "
                                 f"batch (a replay built with agent.replay_latent_spec(), sampled with "
                                 f"batch_length + 1 rows); set agent.module.replay_context=0 to train without them")
            dtype = next(self.wm.parameters()).dtype
            rows = {name: torch.as_tensor(np.asarray(batch[key][0]), device=self.device)
                    for name, key in self._context.items()}  # the context row's stored latent, (B, ...)
            state = self.wm.dynamics.context_state({k: v.to(dtype) if v.is_floating_point() else v
                                                    for k, v in rows.items()})
            has = torch.as_tensor(np.asarray(batch[LATENT_FLAG][0]), device=self.device)  # (B,)
            data = {k: v[1:] for k, v in data.items()}  # (T+1, B, ...) -> (T, B, ...): the trained rows
            data["is_first"] = torch.cat([data["is_first"][:1] | ~has[None], data["is_first"][1:]])
        else:
            data["is_first"] = torch.cat([torch.ones_like(data["is_first"][:1]), data["is_first"][1:]])
        with autocast(self.device, self.compute_dtype):
            metrics, post, skipped = self._update(data, state)
        return self._result(metrics, skipped, self._context_writes(post) if self.replay_context else None)

    def _context_writes(self, post: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """``replay_writes`` of the trained rows' posteriors ``(T, B, ...)``: a row whose entries are not all
        finite is not kept (zeros, ``has_posterior`` false)."""
        dynamics = self.wm.dynamics
        rows = dynamics.context_rows({k: v.detach() for k, v in post.items()})  # {name: (T, B, ...)}
        T, B = next(iter(rows.values())).shape[:2]
        finite = torch.ones(T, B, dtype=torch.bool, device=self.device)
        for value in rows.values():
            finite &= torch.isfinite(value).reshape(T, B, -1).all(-1)  # (T, B, ...) -> (T, B, X) -> (T, B)
        spec, writes = self._context_spec, {}
        for name, key in self._context.items():
            value = rows[name]
            keep = finite.reshape(T, B, *[1] * (value.dim() - 2)).to(value.dtype)  # (T, B) -> (T, B, 1, ...)
            writes[key] = (value * keep).nan_to_num().cpu().numpy().astype(spec[name][1], copy=False)
        return writes | {LATENT_FLAG: finite.cpu().numpy()}

    def _update(self, data: dict[str, torch.Tensor], state: dict[str, torch.Tensor] | None = None):
        wm, T, B = self.wm, *data["is_first"].shape
        losses, post, feat, info = wm.loss(data, state)
        K = min(self.imag_last or T, T)
        start = {k: v.detach() for k, v in wm.dynamics.starts(post, K).items()}  # (K*B, ...): rows T-K..T-1
        imag = self._imagine(start)
        losses |= self._imagination_losses(imag)
        if self.loss_scales["repval"]:
            last = replay_is_last(data["is_last"], data["is_first"])
            rows = {"feat": feat[-K:], "reward": data["reward"][-K:], "is_terminal": data["is_terminal"][-K:],
                    "is_last": last[-K:], "boot": imag["ret"][0].detach().view(K, B)}  # (K*B,) -> (K, B)
            losses["repval"] = self._replay_value_loss(rows)
        scales = {k: v for k, v in self.loss_scales.items() if k != "repval" or v}  # repval 0: not computed
        total = objectives.weighted_sum(losses, scales, "DreamerV3_2025")
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics["loss/model"] = sum(self.loss_scales[k] * losses[k].detach().mean() for k in wm.loss_keys)
        metrics["loss/total"] = total.detach()
        norm, skipped = self._optimize(total, bool(torch.isfinite(imag["ret"]).all()), imag["retnorm"])
        metrics |= {"grad_norm/total": norm} | info | imag["metrics"]
        return metrics, post, skipped

    def _imagine(self, start: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Roll out the policy for ``H`` steps from ``start`` ``(N, ...)`` without gradients (official
        ``agent.py:188-200``: the imagined features are stop-gradient) and read rewards, continue probabilities
        and slow values. Returns ``feat (H+1, N, F)``, ``action (H+1, N, A)``, ``reward``, ``cont`` ``(H+1, N)``
        and ``slow`` ``(H, N)`` (the value loss's targets read rows ``t < H`` only)."""
        dynamics, actor = self.wm.dynamics, self.actor

        def policy(state: dict[str, torch.Tensor]) -> torch.Tensor:
            return actor.sample(actor.net(dynamics.features(state)), fast=self.fast)

        with torch.no_grad():
            states, actions = dynamics.imagine(policy, start, self.horizon)  # (H+1, N, ...)
            feat = dynamics.features(states)  # (H+1, N, F)
            reward = self.wm.reward(feat).mean  # (H+1, N); row 0's is never read
            cont = self.wm.cont(feat).probs  # (H+1, N): probabilities, row 0 the start state's own prediction
            slow = TwoHotSymexp(self.slow_critic(feat[:-1])).mean  # (H, N)
        return {"feat": feat, "action": actions, "reward": reward, "cont": cont, "slow": slow}

    def _imagination_losses(self, imag: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Policy and value losses ``(H, N)`` on an imagined rollout (official ``imag_loss``, ``agent.py:382-446``);
        stores the returns ``ret (H, N)`` and metrics in ``imag``."""
        feat, cont = imag["feat"], imag["cont"]
        value_out = self.critic(feat[:-1])  # (H, N, 255): the loss's rows, with gradient
        with torch.no_grad():  # one softmax for the values and (kernels) the loss's gradient; row H only bootstraps
            probs = torch.softmax(value_out, -1, dtype=torch.promote_types(value_out.dtype, torch.float32))
            last = TwoHotSymexp(self.critic(feat[-1:])).mean  # (1, N)
            value = torch.cat([TwoHotSymexp(value_out, probs=probs).mean, last])  # (H+1, N)
        disc = 1.0 if self.contdisc else self.gamma
        ret = lambda_return(imag["reward"], value, cont, disc, self.lam)  # (H, N)
        weight = imagination_weights(cont, disc)[:-1]  # (H, N): cumprod(disc * cont) / disc
        gathered = all_gather_cat(ret.flatten())  # data parallel: every rank's returns, one global scale
        finite = bool(torch.isfinite(gathered).all())  # a non-finite return must not move the normaliser
        stats = self.retnorm.next(gathered) if finite else (self.retnorm.low, self.retnorm.high)
        scale = self.retnorm.scale(stats)  # stored by _optimize only if the step is taken
        adv = objectives.advantage(ret, value[:-1], scale)  # (H, N)
        policy = self.actor(feat[:-1])  # pi(. | s_t), t < H
        entropy = policy.entropy()  # (H, N)
        policy_loss = objectives.reinforce_policy_loss(policy.log_prob(imag["action"][:-1]), adv, entropy, weight,
                                                       self.actor_entropy)
        value_loss = objectives.critic_loss(TwoHotSymexp(value_out, probs=probs, fast=self.fast), ret, imag["slow"],
                                            weight, self.slow_reg)
        imag["ret"], imag["retnorm"] = ret, stats
        imag["metrics"] = {"return/mean": ret.mean(), "return/scale": scale.detach().clone(),
                           "return/low": stats[0].clone(), "return/high": stats[1].clone(),
                           "advantage/mean": adv.mean(), "advantage/std": adv.std(),
                           "actor/entropy": entropy.detach().mean(),
                           "value/mean": value.mean(), "imagine/reward_mean": imag["reward"].mean(),
                           "imagine/cont_mean": cont.mean(), "imagine/weight_mean": weight.mean()}
        return {"policy": policy_loss, "value": value_loss}

    def _replay_value_loss(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        """The replay value loss ``(K-1, B)`` (official ``repl_loss``, ``agent.py:449-479``) on the last ``K``
        replayed rows: ``feat (K, B, F)`` with gradient, ``reward``, ``is_terminal``, ``is_last``, and ``boot``
        ``(K, B)``, each row's imagined lambda-return. Returns (``lambda_return`` with ``value = boot``)::

            R_t = r_{t+1} + gamma (1 - term_{t+1}) ((1 - lam_{t+1}) boot_{t+1} + lam_{t+1} R_{t+1}),
            R_{K-1} = boot_{K-1}

        with ``lam_{t+1} = 0`` where ``is_last_{t+1}``; rows that are themselves ``is_last`` get weight 0."""
        feat = rows["feat"][:-1]  # (K-1, B, F): the loss's rows (the last one only bootstraps, through ``boot``)
        value_out = self.critic(feat)  # (K-1, B, 255), gradient into the world model (repval_grad: True)
        with torch.no_grad():
            slow = TwoHotSymexp(self.slow_critic(feat)).mean  # (K-1, B)
        ret = replay_returns(rows["reward"], rows["boot"], rows["is_terminal"], rows["is_last"], self.gamma, self.lam)
        weight = 1.0 - rows["is_last"][:-1].float()  # (K-1, B)
        return objectives.critic_loss(TwoHotSymexp(value_out, fast=self.fast), ret, slow, weight, self.slow_reg)

    def _optimize(self, loss: torch.Tensor, finite_returns: bool,
                  retnorm: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """One backward pass and one guarded LaProp step over all parameters; when it is taken, the return
        normaliser stores ``retnorm`` (this update's ``(low, high)``) and the slow value follows.

        Returns:
            ``(grad_norm, skipped)``: the total gradient norm before AGC and 1 when the step was skipped (a
            non-finite loss, gradient or return on any rank: parameters, moments, normaliser and slow value stay).
        """
        # the shared guarded step; no global-norm clip (``clip`` inf: the official chain clips per tensor, by AGC
        # inside LaProp.step)
        norm, skipped = self._step(self.opt, loss, self.trainable(), float("inf"), ok=finite_returns)
        if skipped:
            return norm, 1
        self.retnorm.commit(retnorm)
        self._follow(self.slow_critic, self.critic, self.slow_fraction)
        return norm, 0
