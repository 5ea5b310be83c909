"""DreamerV3 as the current official code has it (danijar/dreamerv3 at e3f0224, the 2024-25 rewrite): ``agent=
dreamerv3_2025``. docs/dreamerv3.md has the table of what changed since the 2023 code, file and line on both sides.

One update, one loss, one optimiser (``dreamerv3/agent.py`` ``Agent.loss``, ``imag_loss``, ``repl_loss``): the world
model (:func:`reverie.models.world_model_2025.world_model_2025`), policy (REINFORCE) and value on ``H`` imagined steps
without gradients into the world model (``contdisc``: the continue probabilities discount the returns and weight the
losses), and the replay value ``repval`` on replayed rows; total ``rec 1, rew 1, con 1, dyn 1, rep 0.1, policy 1,
value 1, repval 0.3``, one backward pass, :class:`reverie.agents.optim.LaProp` over all parameters.

Replay context (``replay_context: 1``, official ``configs.yaml:15``, ``agent.py:312-340``): every replay row stores a
posterior (``posterior_<name>`` per entry of the dynamics' ``context_spec()``, and ``has_posterior``); a window of
``batch_length + 1`` rows starts row 1 from row 0's stored latent (none: the initial state), and the posteriors of
rows ``1..T`` are written back after the update (``replay_writes``; official ``outs['replay']``,
``agent.py:144-150``)."""

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
from reverie.models.world_model_2025 import world_model_2025
from reverie.replay.buffer import LATENT_FLAG, latent_key
from reverie.runtime.collectives import all_gather_cat
from reverie.runtime.precision import autocast
from reverie.types import ActionSpec

#: official ``loss_scales`` (``configs.yaml:86``); ``barlow``, ``infonce``: R2-Dreamer's
#: ``configs/model/_base_.yaml:22-23``
LOSS_SCALES = {"rec": 1.0, "barlow": 0.05, "infonce": 1.0, "reward": 1.0, "cont": 1.0, "dyn": 1.0, "rep": 0.1,
               "policy": 1.0, "value": 1.0, "repval": 0.3}
BEHAVIOR_LOSSES = ("policy", "value", "repval")


def replay_is_last(is_last: torch.Tensor, is_first: torch.Tensor) -> torch.Tensor:
    """``is_last (T, B)`` also set on every row followed by an ``is_first`` row (official ``replay.py:287-291``)."""
    following = torch.zeros_like(is_first)
    following[:-1] = is_first[1:]
    return is_last | following


def replay_returns(reward: torch.Tensor, boot: torch.Tensor, is_terminal: torch.Tensor, is_last: torch.Tensor,
                   gamma: float, lam: float) -> torch.Tensor:
    """Lambda-returns ``(K-1, B)`` of replayed rows ``(K, B)`` that bootstrap with ``boot``, each row's imagined
    return, ``lam`` 0 after an ``is_last`` row (official ``repl_loss``, ``agent.py:449-490``; :func:`lambda_return`)."""
    return lambda_return(reward, boot, 1.0 - is_terminal.float(), gamma, lam, is_last=is_last)


class PolicyLag(nn.Module):
    """The official code's acting copy of the world model and actor (``embodied/jax/agent.py``: ``policy_params``,
    ``pending_sync``): the first update after a refresh keeps the parameters it starts from as pending, the next ``act``
    acts with the copy and then takes them, so acting lags training by one to two acting steps' updates. Its modules
    and the ``pending`` flag are saved with the agent."""

    def __init__(self, wm: nn.Module, actor: nn.Module):
        super().__init__()
        self.wm, self.actor = copy.deepcopy(wm).requires_grad_(False), copy.deepcopy(actor).requires_grad_(False)
        self.pending_wm = copy.deepcopy(wm).requires_grad_(False)
        self.pending_actor = copy.deepcopy(actor).requires_grad_(False)
        self.register_buffer("pending", torch.zeros((), dtype=torch.bool))

    def before_update(self, wm: nn.Module, actor: nn.Module) -> None:
        """The first update since the last refresh: keep the parameters it starts from as pending."""
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
    """Copy each ``(target, source)`` module pair's parameters and buffers in place."""
    for target, source in pairs:
        for a, b in zip(target.state_dict().values(), source.state_dict().values()):
            a.copy_(b)


class DreamerV3_2025(WorldModelAgent):
    """The current official DreamerV3 agent, with the :class:`reverie.agents.base.Agent` protocol.

    Arguments named as :class:`reverie.agents.DreamerV3`'s mean the same; defaults are the official ``configs.yaml``'s
    but ``replay_context`` (1 starts windows from stored posteriors, module docstring, as ``agent=dreamerv3_2025``
    sets; 0 from the initial state). ``imag_last``: imagine from the last ``K`` rows (0: all). ``contdisc``: ``gamma``
    lives in the continue head (False: it discounts the returns). ``*_outscale``: output layer init scales.
    ``slow_reg``: ``slowreg``. ``retnorm_*``: ``retnorm`` (``configs.yaml:111``). ``lr, agc, eps, beta1, beta2,
    warmup``: :class:`reverie.agents.optim.LaProp`; ``laprop`` its form (``"original"``: R2-Dreamer's).
    ``policy_lag``: act with :class:`PolicyLag` (on under
    ``exp=reference``). ``actor_unimix`` 0: the official ``categorical`` head never reads its ``unimix: 0.01``
    (``heads.py:101-110``).

    Raises:
        ValueError: ``imag_last`` negative, or 1 with ``repval`` on; loss keys and scales that differ as sets
            (official ``agent.py:237-238``); ``replay_context`` not 0 or 1, or 1 with an empty ``context_spec()``;
            an unknown objective setting.
        TypeError: a dynamics without the members of :class:`reverie.models.dynamics.Dynamics`."""

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
                 laprop: str = "official", replay_context: int = 0, kernels: str = "auto", device: str = "cpu",
                 precision: str = "auto", representation: str = "reconstruction", objectives: dict | None = None,
                 policy_lag: bool = False):
        super().__init__()
        if replay_context not in (0, 1):
            raise ValueError(f"DreamerV3_2025: replay_context must be 0 (no context) or 1 (one context row, the "
                             f"official default), got {replay_context!r}")
        self.replay_context = int(replay_context)
        scales = LOSS_SCALES | dict(loss_scales or {})
        if imag_last < 0 or (imag_last == 1 and scales.get("repval")):
            raise ValueError(f"DreamerV3_2025: imag_last must be 0 (all rows) or >= 2 with the replay value loss on "
                             f"(its returns need two rows), got {imag_last}")
        self.spec, self.horizon, self.imag_last = action_spec, int(horizon), int(imag_last)
        self.gamma, self.contdisc, self.lam = float(gamma), bool(contdisc), float(lam)
        self.actor_entropy = actor_entropy
        self.slow_fraction, self.slow_reg = slow_critic_fraction, slow_reg
        self.obs_keys = sorted(obs_shapes)
        self.wm = world_model_2025(obs_shapes, action_spec.dim, dynamics, units=units, enc_layers=enc_layers,
                                   dec_layers=dec_layers, reward_layers=reward_layers, cont_layers=cont_layers,
                                   cnn_depth=cnn_depth, cnn=cnn, cont_discount=self.gamma if contdisc else 1.0,
                                   kernels=kernels, representation=representation, objectives=objectives)
        check_dynamics(self.wm.dynamics)
        self._context_spec = dict(self.wm.dynamics.context_spec())
        self._context = {name: latent_key(name) for name in self._context_spec}
        if self.replay_context and not self._context:
            raise ValueError(f"DreamerV3_2025: replay_context={self.replay_context} needs a dynamics that can start "
                             f"a window from a stored row, but {type(self.wm.dynamics).__name__}.context_spec() is "
                             f"empty; set agent.module.replay_context=0")
        self.loss_scales = loss_scale_table(loss_scales, self.wm.representation,
                                            (*self.wm.loss_keys, *BEHAVIOR_LOSSES), "DreamerV3_2025",
                                            defaults=LOSS_SCALES)
        feat = self.wm.dynamics.feat_dim
        out = action_spec.dim if action_spec.discrete else 2 * action_spec.dim
        split = None if action_spec.discrete else (action_spec.dim, action_spec.dim)  # mean, std: heads.py:146-148
        self.actor = Actor(feat, action_spec, units, actor_layers, actor_unimix, min_std, max_std,
                           net=RMSMLP(feat, out, units, actor_layers, actor_outscale, out_split=split))
        self.critic = RMSMLP(feat, 255, units, critic_layers, critic_outscale, float32_out=True)  # two-hot logits
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.retnorm = ReturnNormalizer(retnorm_decay, retnorm_limit, retnorm_low, retnorm_high)
        self.policy_lag = PolicyLag(self.wm, self.actor) if policy_lag else None
        install(self, kernels)  # into every module built above (reverie.models.kernels), with the agent's setting
        self._place(device, precision)
        self.opt = LaProp(self.trainable(), lr=lr, agc=agc, eps=eps, beta1=beta1, beta2=beta2, warmup=warmup,
                          form=laprop)

    def trainable(self) -> list[nn.Parameter]:
        """Every parameter the one optimiser trains: world model, policy and value (not the slow value)."""
        return [*self.wm.parameters(), *self.actor.parameters(), *self.critic.parameters()]

    def _acting_model(self) -> nn.Module:
        """With ``policy_lag``: the acting copy (:class:`PolicyLag`)."""
        return self.policy_lag.wm if self.policy_lag is not None else self.wm

    def _choose(self, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """Sample the policy (``"explore"``, ``"sample"``) or take its mode (``"eval"``); one-hot, or clipped
        to ``[-1, 1]``."""
        actor = self.policy_lag.actor if self.policy_lag is not None else self.actor
        dist = actor(self._acting_model().dynamics.features(post))
        action = dist.mode if mode == "eval" else dist.sample()
        action = action if self.spec.discrete else action.clamp(-1.0, 1.0)
        return action.to(torch.promote_types(action.dtype, torch.float32))  # float32 (float64 in float64 runs)

    def _acted(self) -> None:
        if self.policy_lag is not None:
            self.policy_lag.acted()

    def replay_latent_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """``{replay key: (per-row shape, dtype)}`` of the stored latents: ``posterior_<name>`` per entry of the
        dynamics' ``context_spec()`` and ``has_posterior ()`` bool; empty without replay context."""
        if not self.replay_context:
            return {}
        spec = self._context_spec
        return {key: spec[name] for name, key in self._context.items()} | {LATENT_FLAG: ((), np.dtype(bool))}

    def replay_latent(self, state: Any) -> dict[str, np.ndarray]:
        """The latents ``(N, ...)`` to store with the row just acted on, from the carry in ``state`` (what
        :meth:`act` returned; official ``driver.py:70-77``), ``has_posterior`` true; empty without replay context or
        without a state."""
        if not self.replay_context or state is None:
            return {}
        carry = state[0]
        rows = self.wm.dynamics.context_rows({k: v[None] for k, v in carry.items()})  # (N, ...) -> (1, N, ...)
        spec = self._context_spec
        out = {key: rows[name][0].cpu().numpy().astype(spec[name][1], copy=False)
               for name, key in self._context.items()}  # (1, N, ...) -> (N, ...)
        n = next(iter(out.values())).shape[0]
        return out | {LATENT_FLAG: np.ones(n, bool)}

    def update(self, batch: dict[str, np.ndarray]) -> UpdateResult:
        """One update on a replay batch ``(T, B, ...)``, row 0 ``is_first`` (official ``replay.py:286``); under replay
        context ``(T + 1, B, ...)``, row 0 the context, with the latent keys (ValueError without). Returns the metrics,
        ``skipped`` and, with replay context, ``replay_writes``: the trained rows' ``posterior_<name> (T, B, ...)`` and
        ``has_posterior (T, B)`` (false where not all finite)."""
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
        """``replay_writes`` of the posteriors ``(T, B, ...)``; non-finite rows: zeros, ``has_posterior`` false."""
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
        """Roll out the policy ``H`` steps from ``start (N, ...)`` without gradients (official ``agent.py:188-200``):
        ``feat (H+1, N, F)``, ``action (H+1, N, A)``, ``reward``, ``cont`` ``(H+1, N)``, ``slow (H, N)``."""
        dynamics, actor = self.wm.dynamics, self.actor

        def policy(state: dict[str, torch.Tensor]) -> torch.Tensor:
            return actor.sample(actor.net(dynamics.features(state)))

        with torch.no_grad():
            states, actions = dynamics.imagine(policy, start, self.horizon)  # (H+1, N, ...)
            feat = dynamics.features(states)  # (H+1, N, F)
            reward = self.wm.reward(feat).mean  # (H+1, N); row 0's is never read
            cont = self.wm.cont(feat).probs  # (H+1, N): probabilities, row 0 the start state's own prediction
            slow = TwoHotSymexp(self.slow_critic(feat[:-1])).mean  # (H, N)
        return {"feat": feat, "action": actions, "reward": reward, "cont": cont, "slow": slow}

    def _imagination_losses(self, imag: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Policy and value losses ``(H, N)`` (official ``imag_loss``, ``agent.py:382-446``); puts ``ret`` and
        metrics into ``imag``."""
        feat, cont = imag["feat"], imag["cont"]
        value_out = self.critic(feat[:-1])  # (H, N, 255): the loss's rows, with gradient
        with torch.no_grad():  # the values: one softmax; row H only bootstraps
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
        value_loss = objectives.critic_loss(TwoHotSymexp(value_out), ret, imag["slow"],
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
        """The replay value loss ``(K-1, B)`` (official ``repl_loss``, ``agent.py:449-479``) on ``feat (K, B, F)``
        and the ``(K, B)`` rows of :func:`replay_returns`; ``is_last`` rows get weight 0."""
        feat = rows["feat"][:-1]  # (K-1, B, F): the loss's rows (the last one only bootstraps, through ``boot``)
        value_out = self.critic(feat)  # (K-1, B, 255), gradient into the world model (repval_grad: True)
        with torch.no_grad():
            slow = TwoHotSymexp(self.slow_critic(feat)).mean  # (K-1, B)
        ret = replay_returns(rows["reward"], rows["boot"], rows["is_terminal"], rows["is_last"], self.gamma, self.lam)
        weight = 1.0 - rows["is_last"][:-1].float()  # (K-1, B)
        return objectives.critic_loss(TwoHotSymexp(value_out), ret, slow, weight, self.slow_reg)

    def _optimize(self, loss: torch.Tensor, finite_returns: bool,
                  retnorm: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """One guarded LaProp step; when taken, the normaliser stores ``retnorm`` and the slow value follows.
        Returns ``(grad_norm before AGC, skipped)``."""
        # no global-norm clip: the official chain clips per tensor, by AGC inside LaProp.step
        norm, skipped = self._step(self.opt, loss, self.trainable(), float("inf"), ok=finite_returns)
        if skipped:
            return norm, 1
        self.retnorm.commit(retnorm)
        self._follow(self.slow_critic, self.critic, self.slow_fraction)
        return norm, 0
