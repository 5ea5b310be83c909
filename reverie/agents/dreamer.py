"""DreamerV3 (Hafner et al. 2023): world model learning + actor-critic learning in imagination.

Defaults are the 2023 reference configuration (DESIGN.md section 4); size presets set the widths.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

from reverie.agents.base import WorldModelAgent, adam
from reverie.agents.returns import ReturnNormalizer, imagination_weights, lambda_return
from reverie.compiling import compile_callables
from reverie.distributed import all_finite, all_gather_cat, average_gradients
from reverie.models.distributions import BoundedNormal, TwoHotSymlog, UnimixCategorical, unimix_sample
from reverie.models.mlp_tape import MLPTape
from reverie.models.networks import MLP
from reverie.models.onehot_linear import SplitFeat
from reverie.models.world_model import WorldModel
from reverie.precision import autocast, resolve_precision
from reverie.types import ActionSpec

LOSS_SCALES = {"reward": 1.0, "cont": 1.0, "dyn": 0.5, "rep": 0.1}  # reference loss_scales; decoder keys: 1.0


def _finite_step(opt: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor, ok: bool = True) -> int:
    """Step ``opt`` only when ``loss`` and the total gradient norm are finite (and ``ok``); otherwise drop the
    gradients and leave parameters and optimiser moments untouched (issue 6 guard; one host sync).

    Returns:
        1 when the step was skipped, else 0 (summed into the ``guard/nonfinite`` metric).
    """
    if ok and bool(torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)):
        opt.step()
        return 0
    opt.zero_grad(set_to_none=True)
    return 1


def _no_stoch(feat: torch.Tensor | SplitFeat) -> torch.Tensor | SplitFeat:
    """Split features without the one-hot tensor (its class index stays): for inputs that get no gradient."""
    return SplitFeat(feat.deter, None, feat.index, feat.classes) if isinstance(feat, SplitFeat) else feat


class Actor(nn.Module):
    """Policy ``pi(a_t | s_t)`` on features ``(..., D + S*K)``.

    Discrete: :class:`UnimixCategorical` over ``A`` one-hot actions (unimix 1%). Continuous:
    :class:`BoundedNormal` with ``tanh`` mean and std in ``[0.1, 1.0]`` (reference ``actor.minstd/maxstd``).
    ``net``: the network from features to ``A`` (discrete) or ``2A`` outputs; None builds the 2023 :class:`MLP`.
    """

    def __init__(self, feat_dim: int, spec: ActionSpec, units: int, layers: int, unimix: float = 0.01,
                 min_std: float = 0.1, max_std: float = 1.0, net: nn.Module | None = None):
        super().__init__()
        self.spec, self.unimix, self.min_std, self.max_std = spec, unimix, min_std, max_std
        self.net = net if net is not None else MLP(feat_dim, spec.dim if spec.discrete else 2 * spec.dim,
                                                   units=units, layers=layers)

    def forward(self, feat: torch.Tensor) -> torch.distributions.Distribution:
        return self.dist(self.net(feat))

    def dist(self, out: torch.Tensor) -> torch.distributions.Distribution:
        """The policy distribution from the network's output ``(..., A)`` (discrete) or ``(..., 2A)``."""
        if self.spec.discrete:
            return UnimixCategorical(out, self.unimix)
        mean, std = out.chunk(2, -1)
        return BoundedNormal(mean, std, self.min_std, self.max_std)

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """A sample ``(..., A)`` float32 of :meth:`dist` ``(out)`` without building the distribution object (the
        imagination rollout's hot path, one call per step). Discrete: a one-hot draw of the unimix categorical
        (:func:`reverie.models.distributions.unimix_sample`, the same law as ``dist(out).sample()``); continuous:
        ``dist(out).sample()``."""
        if self.spec.discrete:
            return unimix_sample(out.detach(), self.unimix)
        return self.dist(out).sample()


class DreamerV3(WorldModelAgent):
    """DreamerV3 agent implementing the :class:`reverie.agents.base.Agent` protocol.

    Args:
        obs_shapes: ``{key: shape}`` of the observations the world model encodes and decodes.
        action_spec: :class:`reverie.types.ActionSpec`.
        deter, stoch, classes, units, layers: size preset (DESIGN.md section 4; ``xs``: 256/32/32/256/1).
        cnn_depth: channel multiplier of the image encoder/decoder (size preset ``cnn_depth``; s=32).
        cnn: further conv-stack arguments (``channels``, ``kernel``, ``stride``, ``padding``, ``min_res``,
            ``norm``, ``act``; see :class:`reverie.models.conv.ConvEncoder`); None for the reference stack.
        horizon: imagination horizon ``H`` (15). gamma: ``1 - 1/333``. lam: 0.95.
        imag_last: imagine from the posterior states of the last ``K`` rows of each replayed sequence only
            (``N = K*B`` starts instead of ``T*B``); 0 (the 2023 reference) starts from every row. The current
            official code has the same knob (``imag_last``, default 0): a CPU preset's lever on the behaviour
            cost, which grows with ``N``.
        free_nats: free bits (1.0). unimix: latent/actor uniform mix (0.01).
        loss_scales: world-model loss scales; keys must equal the world model's loss keys (decoder keys
            default to 1.0).
        actor_entropy: entropy scale (3e-4). slow_critic_fraction: EMA step of the slow critic (0.02).
        slow_reg: scale of the critic regulariser towards the slow critic (1.0).
        model_lr/model_eps/model_clip: world-model Adam (1e-4, 1e-8, 1000).
        actor_lr, critic_lr / ac_eps / ac_clip: actor and critic Adam (3e-5, 1e-5, 100).
        device: torch device for parameters and updates.
        precision: ``"auto"`` (bfloat16 where the hardware runs it natively), ``"float32"`` or ``"bfloat16"``;
            parameters and distributions stay float32 (see :mod:`reverie.precision`).
        compile: ``torch.compile`` the RSSM cell and the MLP heads (:mod:`reverie.compiling`): the first updates
            take longer while it compiles, then each is faster (docs/speed.md); where compiling cannot run, a
            ``RuntimeWarning`` and eager execution. Same losses as eager within float tolerance. Off by default.
        onehot_gather: the one-hot latent enters every first layer that reads the model features (heads, actor,
            critics, RSSM cell input) by row gathers instead of a dense product (:mod:`reverie.models.onehot_linear`,
            docs/speed.md "Hot path"): the same losses up to float rounding, fewer FLOPs. Categorical latents only;
            with ``compile`` the dense path is traced instead (compile sees plain tensors).

    Raises:
        ValueError: ``loss_scales`` keys that differ from the world model's losses.
    """

    optimizers = ("model_opt", "actor_opt", "critic_opt")  # saved with the module state (WorldModelAgent)

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_spec: ActionSpec, *, deter: int = 512,
                 stoch: int = 32, classes: int = 32, units: int = 512, layers: int = 2, cnn_depth: int = 32,
                 cnn: dict | None = None, horizon: int = 15, imag_last: int = 0,
                 gamma: float = 1.0 - 1.0 / 333.0, lam: float = 0.95, free_nats: float = 1.0, unimix: float = 0.01,
                 loss_scales: dict[str, float] | None = None, actor_entropy: float = 3e-4,
                 slow_critic_fraction: float = 0.02, slow_reg: float = 1.0, model_lr: float = 1e-4,
                 model_eps: float = 1e-8, model_clip: float = 1000.0, actor_lr: float = 3e-5, critic_lr: float = 3e-5,
                 ac_eps: float = 1e-5, ac_clip: float = 100.0, device: str = "cpu", precision: str = "auto",
                 compile: bool = False, onehot_gather: bool = True):
        super().__init__()
        if imag_last < 0:
            raise ValueError(f"DreamerV3: imag_last must be >= 0 (0: imagine from every replayed row), got {imag_last}")
        self.spec, self.horizon, self.gamma, self.lam = action_spec, horizon, gamma, lam
        self.imag_last = int(imag_last)
        self.actor_entropy, self.slow_fraction, self.slow_reg = actor_entropy, slow_critic_fraction, slow_reg
        self.model_clip, self.ac_clip = model_clip, ac_clip
        self.obs_keys = sorted(obs_shapes)
        self.wm = WorldModel(obs_shapes, action_spec.dim, deter=deter, stoch=stoch, classes=classes, units=units,
                             layers=layers, unimix=unimix, free_nats=free_nats, cnn_depth=cnn_depth,
                             cnn=dict(cnn) if cnn else None, onehot_gather=onehot_gather and not compile)
        feat = self.wm.rssm.feat_dim
        self.actor = Actor(feat, action_spec, units, layers, unimix)
        self.critic = MLP(feat, 255, units=units, layers=layers, out_scale=0.0)
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.retnorm = ReturnNormalizer()
        scales = {k: 1.0 for k in self.wm.loss_keys} | LOSS_SCALES | dict(loss_scales or {})
        if set(scales) != set(self.wm.loss_keys):
            raise ValueError(f"loss_scales keys {sorted(scales)} differ from the world model's losses "
                             f"{sorted(self.wm.loss_keys)}")
        self.loss_scales = scales
        self.device = torch.device(device)
        self.compute_dtype = resolve_precision(precision, self.device)
        self.to(self.device)
        self.model_opt = adam(self.wm.parameters(), lr=model_lr, eps=model_eps)
        self.actor_opt = adam(self.actor.parameters(), lr=actor_lr, eps=ac_eps)
        self.critic_opt = adam(self.critic.parameters(), lr=critic_lr, eps=ac_eps)
        self.compiled = bool(compile) and self._compile()

    def _compile(self) -> bool:
        """Compile the hot callables in place (``compile=True``); False where torch.compile cannot run here.

        The RSSM cell (``_step_deter``: input layer + LayerNorm GRU, run once per step of the observe scan and of
        imagination) and every MLP forward; the per-step Python loops stay eager, so shapes stay fixed per call
        site (B for the scan, T*B for imagination, N envs for acting), each compiled once.
        """
        wm, rssm = self.wm, self.wm.rssm
        rssm.defer_weight_grads = False  # compile traces the cell on plain tensors (no ScanLinears objects)
        modules = {"actor": self.actor.net, "critic": self.critic, "slow critic": self.slow_critic,
                   "reward head": wm.reward_head, "continue head": wm.cont_head, "prior net": rssm.prior_net,
                   "vector encoder": wm.encoder, "vector decoder": wm.decoder,
                   "image encoder": wm.image_encoder, "image decoder": wm.image_decoder}
        targets = {name: (m, "forward") for name, m in modules.items() if m is not None}
        return compile_callables({"rssm cell": (rssm, "_step_deter"), **targets}, self.device.type)

    # ----------------------------------------------------------------------------------------------- acting
    @torch.inference_mode()
    def act(self, obs: dict[str, np.ndarray], state: Any = None, mode: str = "explore") -> tuple[np.ndarray, Any]:
        """One policy step for ``N`` envs (Agent protocol).

        Args:
            obs: ``(N, ...)`` arrays with the observation keys and ``is_first (N,)``.
            state: from :meth:`initial_state` or the previous call; None starts fresh.
            mode: ``"explore"``/``"sample"`` sample from the actor, ``"eval"`` takes its mode.

        Returns:
            ``(action (N, A) float32, state)``; one-hot actions for discrete spaces, ``[-1, 1]`` for Box.

        Raises:
            ValueError: unknown ``mode``.
        """
        data, rssm_state, prev_action = self._act_inputs(obs, state, mode)
        with autocast(self.device, self.compute_dtype):
            return self._act(data, rssm_state, prev_action, mode)

    def _act(self, data, rssm_state, prev_action, mode):
        post = self.wm.posterior_step(data, prev_action, rssm_state)
        dist = self.actor(self.wm.rssm.features(post))
        action = dist.mode if mode == "eval" else dist.sample()
        if not self.spec.discrete:
            action = action.clamp(-1.0, 1.0)
        return action.cpu().numpy().astype(np.float32), (post, action)

    # ----------------------------------------------------------------------------------------------- learning
    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """One DreamerV3 update: world model, then actor and critic on imagined trajectories.

        Args:
            batch: replay sample with observation keys, ``prev_action (T, B, A)``, ``reward``, ``is_first``,
                ``is_terminal`` ``(T, B)``.

        Returns:
            metrics: world-model losses (``loss/<key>``), ``kl``, entropies, actor/critic losses, return and
            advantage statistics, gradient norms.
        """
        data = self._update_inputs(batch)
        # every replay window starts from the initial state with a zero previous action: row 0 counts as is_first
        # (2023 reference: embodied/replay/generic.py `_sample` sets seq['is_first'][0] = True)
        data["is_first"] = torch.cat([torch.ones_like(data["is_first"][:1]), data["is_first"][1:]])
        with autocast(self.device, self.compute_dtype):
            metrics = self._update(data)
        return self._metric_floats(metrics)

    def _update(self, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        metrics: dict[str, torch.Tensor] = {}

        # --- world model (eq. 4-5) ---
        losses, post, info = self.wm.loss(data)
        model_loss = sum(self.loss_scales[k] * v.mean() for k, v in losses.items())
        self.model_opt.zero_grad(set_to_none=True)
        model_loss.backward()
        average_gradients(self.wm.parameters())  # data parallel: mean over ranks (no-op in one process)
        metrics["grad_norm/model"] = nn.utils.clip_grad_norm_(self.wm.parameters(), self.model_clip)
        skipped = _finite_step(self.model_opt, model_loss, metrics["grad_norm/model"], all_finite(model_loss))
        metrics |= {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics["loss/model"] = model_loss.detach()
        metrics |= info

        # --- imagination from every posterior state (section 4), or from the last imag_last rows ---
        rows = slice(-self.imag_last, None) if self.imag_last else slice(None)
        start = {k: v.detach()[rows].flatten(0, 1) for k, v in post.items()}  # (K, B, ...) -> (K*B, ...)
        start_cont = 1.0 - data["is_terminal"][rows].flatten(0, 1).float()  # (K, B) -> (K*B,)
        behavior = self._behavior(start, start_cont)
        metrics["guard/nonfinite"] = torch.tensor(float(skipped + behavior.pop("guard/nonfinite")))
        return metrics | behavior

    def _behavior(self, start: dict[str, torch.Tensor], start_cont: torch.Tensor) -> dict[str, torch.Tensor]:
        """Actor and critic losses on an imagined rollout of horizon ``H`` from ``start`` ``(N, ...)``."""
        rssm, discrete = self.wm.rssm, self.spec.discrete
        dists: list[torch.distributions.Distribution] = []  # continuous: pi(. | s_t), t = 0..H, for the actor loss
        # discrete: the rollout's actor passes are recorded, and the actor loss differentiates them over all steps
        # at once (mlp_tape.py) instead of a second forward pass. CPU (measured and tested there; CUDA autocast
        # runs LayerNorm in float32, which the tape's kernels do not follow); compiled heads keep the second pass.
        tape = MLPTape(self.actor.net, self.horizon) if discrete and not self.compiled and \
            self.device.type == "cpu" else None

        def policy(state: dict[str, torch.Tensor]) -> torch.Tensor:
            feat = _no_stoch(rssm.features(state)).to(self.compute_dtype)  # (N, F); the actor's input is detached
            if discrete:  # sampling only (no grad); the actor loss evaluates pi on all steps at once below
                return self.actor.sample(self.actor.net(feat) if tape is None else tape(feat))
            dist = self.actor(feat.detach())
            dists.append(dist)
            return dist.rsample()

        # Discrete actions learn by REINFORCE: the rollout needs no gradients. Continuous actions learn by
        # backpropagating returns through the dynamics (straight through the world model into the actions).
        # With onehot_gather the heads read (deter, class index): the one-hot latent itself is only needed
        # where a gradient flows into it (continuous actions).
        keys = ("deter", "stoch") if not rssm.onehot_gather else ("deter", "index") if discrete else \
            ("deter", "stoch", "index")
        with torch.no_grad() if discrete else nullcontext():
            states, actions = rssm.imagine(policy, start, self.horizon, keys=keys)  # (H+1, N, ...)
            feat = rssm.features(states).to(self.compute_dtype)  # (H+1, N, F), cast once, read by every head
            reward = torch.cat([torch.zeros_like(start_cont)[None], self.wm.reward(feat[1:]).mean])  # (H+1, N)
            cont = torch.cat([start_cont[None], self.wm.cont(feat[1:]).mode])  # start's own flag is known
        # Discrete: one critic pass serves the returns (detached) and the critic loss, and one softmax of it the
        # values and the loss's backward. Continuous: the returns need values differentiable in the imagined
        # states, so the critic loss gets its own pass below.
        critic_probs = None
        with torch.enable_grad() if discrete else nullcontext():
            critic_out = self.critic(feat)  # (H+1, N, 255)
        if discrete:
            with torch.no_grad():
                critic_probs = torch.softmax(critic_out, -1, dtype=torch.float32)  # (H+1, N, 255)
                value = TwoHotSymlog(critic_out, probs=critic_probs).mean  # (H+1, N)
        else:
            value = TwoHotSymlog(critic_out).mean  # (H+1, N)
        ret = lambda_return(reward, value if not discrete else value.detach(), cont, self.gamma, self.lam)  # (H, N)
        weight = imagination_weights(cont.detach(), self.gamma)[:-1]  # (H, N)

        # --- actor: advantage at t weights log pi(a_t | s_t), a_t sampled at s_t (eq. 8-9) ---
        all_ret = all_gather_cat(ret.detach().flatten())  # data parallel: every rank's returns, one global scale
        finite_ret = bool(torch.isfinite(all_ret).all())  # a non-finite return must not poison the normaliser's EMAs
        if finite_ret:
            self.retnorm.update(all_ret)
        scale = self.retnorm.scale()
        # continuous (dynamics backprop): the baseline keeps its gradient through the imagined states, as the 2023
        # reference's `adv = normed_ret - normed_base` with `base = value[:-1]` (agent.py, ImagActorCritic.loss);
        # discrete: REINFORCE weights log pi by the detached advantage either way
        adv = (ret - value[:-1]) / scale  # (H, N)
        if discrete:  # pi(. | s_t) for t < H: the rollout's passes (same weights, same states: the same values)
            actor_feat = _no_stoch(feat[:-1]).detach()
            policy_dist = self.actor(actor_feat) if tape is None else self.actor.dist(tape.replay(actor_feat))  # (H, N)
            objective = policy_dist.log_prob(actions[:-1]) * adv.detach()  # (H, N)
            entropy = policy_dist.entropy()  # (H, N)
        else:
            objective = adv
            entropy = torch.stack([dists[t].entropy() for t in range(self.horizon)])  # (H, N)
        actor_loss = -(weight * (objective + self.actor_entropy * entropy)).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        # inputs=: through the world model and critic only the activation gradients are needed on the way to
        # the actions, not their weight gradients (those matmuls are skipped).
        actor_loss.backward(inputs=list(self.actor.parameters()))
        if tape is not None:
            tape.clear()  # its activations are not needed after this backward pass
        average_gradients(self.actor.parameters())
        actor_norm = nn.utils.clip_grad_norm_(self.actor.parameters(), self.ac_clip)
        skipped = _finite_step(self.actor_opt, actor_loss, actor_norm, finite_ret and all_finite(actor_loss))

        # --- critic: two-hot regression to the lambda-return, regularised towards the slow critic ---
        critic_feat = feat[:-1].detach()
        critic_dist = TwoHotSymlog(critic_out[:-1], probs=critic_probs[:-1]) if discrete else \
            TwoHotSymlog(self.critic(critic_feat))
        with torch.no_grad():
            slow_target = TwoHotSymlog(self.slow_critic(critic_feat)).mean
        critic_loss = -critic_dist.log_prob_mix([ret.detach(), slow_target], [1.0, self.slow_reg])  # (H, N)
        critic_loss = (weight * critic_loss).mean()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward(inputs=list(self.critic.parameters()))
        average_gradients(self.critic.parameters())
        critic_norm = nn.utils.clip_grad_norm_(self.critic.parameters(), self.ac_clip)
        skipped += _finite_step(self.critic_opt, critic_loss, critic_norm, all_finite(critic_loss))
        with torch.no_grad():
            for slow, fast in zip(self.slow_critic.parameters(), self.critic.parameters()):
                slow.lerp_(fast, self.slow_fraction)
        return {
            "loss/actor": actor_loss.detach(), "loss/critic": critic_loss.detach(),
            "grad_norm/actor": actor_norm, "grad_norm/critic": critic_norm,
            "actor/entropy": entropy.detach().mean(), "return/mean": ret.detach().mean(),
            "return/scale": scale.detach(), "advantage/mean": adv.detach().mean(), "advantage/std": adv.detach().std(),
            "value/mean": value.detach().mean(), "value/std": value.detach().std(),
            "return/low": self.retnorm.low.detach().clone(), "return/high": self.retnorm.high.detach().clone(),
            "imagine/reward_mean": reward.detach().mean(),
            "guard/nonfinite": skipped,
        }

