"""The optimiser of the current official DreamerV3: LaProp (Ziyin et al. 2020) with adaptive gradient clipping and a
linear warmup (danijar/dreamerv3 at e3f0224: ``dreamerv3/agent.py:342-379`` ``_make_opt``,
``embodied/jax/opt.py:109-164``, ``configs.yaml:87``). Per parameter tensor ``p`` with gradient ``g`` at step ``t``::

    g <- g / max(1, ||g|| / (agc * max(pmin, ||p||)))            AGC (Brock et al. 2021), per tensor, pmin 1e-3
    v <- beta2 v + (1 - beta2) g^2;   u = g / (sqrt(v / (1 - beta2^t)) + eps)      RMS scaling first ...
    m <- beta1 m + (1 - beta1) u;     p <- p - lr_t m / (1 - beta1^t)              ... then momentum: LaProp
    lr_t = lr * min(1, (t - 1) / warmup)                           (optax's schedules count from 0: lr_1 = 0)"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


@torch.no_grad()
def agc_clip_(params: list[torch.Tensor], grads: list[torch.Tensor], clip: float = 0.3,
              pmin: float = 1e-3) -> torch.Tensor:
    """Adaptive gradient clipping in place (official ``opt.py`` ``clip_by_agc``): scale each ``grads[i]`` so its
    Frobenius norm is at most ``clip * max(pmin, ||params[i]||)``. Returns the factors ``(len(grads),)``."""
    gnorm = torch.stack(torch._foreach_norm(grads)).float()
    pnorm = torch.stack(torch._foreach_norm(params)).float()
    factor = 1.0 / torch.clamp(gnorm / (clip * torch.clamp(pnorm, min=pmin)), min=1.0)
    torch._foreach_mul_(grads, [f.to(g.dtype) for f, g in zip(factor.unbind(), grads)])
    return factor


class LaProp(torch.optim.Optimizer):
    """LaProp with AGC and linear warmup (module docstring), the official defaults (``agc`` 0: no AGC, ``warmup`` 0:
    none). State per parameter: ``step``, ``exp_avg_sq`` (``v``), ``exp_avg`` (``m``), at least float32; parameters
    without a gradient are skipped. ValueError for a negative ``lr``, ``agc`` or ``warmup``, or betas not in [0, 1)."""

    def __init__(self, params: Iterable[nn.Parameter] | Iterable[dict], lr: float = 4e-5, agc: float = 0.3,
                 pmin: float = 1e-3, eps: float = 1e-20, beta1: float = 0.9, beta2: float = 0.999, warmup: int = 1000):
        if lr < 0 or agc < 0 or warmup < 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"LaProp: need lr, agc, warmup >= 0 and betas in [0, 1); got lr={lr} agc={agc} "
                             f"warmup={warmup} beta1={beta1} beta2={beta2}")
        defaults = dict(lr=lr, agc=agc, pmin=pmin, eps=eps, beta1=beta1, beta2=beta2, warmup=int(warmup))
        super().__init__(params, defaults)

    @staticmethod
    def learning_rate(lr: float, warmup: int, step: int) -> float:
        """``lr_t`` of step ``t`` (1-based): ``lr * min(1, (t - 1) / warmup)`` (``lr`` when ``warmup`` is 0)."""
        return lr if warmup <= 0 else lr * min(1.0, (step - 1) / warmup)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group["agc"] > 0:
                agc_clip_(params, grads, group["agc"], group["pmin"])
            beta1, beta2, eps = group["beta1"], group["beta2"], group["eps"]
            for p, g in zip(params, grads):
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    dtype = torch.promote_types(p.dtype, torch.float32)  # float32 at least
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
                state["step"] += 1
                t = state["step"]
                v, m = state["exp_avg_sq"], state["exp_avg"]
                g = g.to(v.dtype)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                u = g / ((v / (1.0 - beta2 ** t)).sqrt_().add_(eps))  # RMS-normalised gradient
                m.mul_(beta1).add_(u, alpha=1.0 - beta1)
                lr = self.learning_rate(group["lr"], group["warmup"], t)
                if lr:
                    p.add_((m / (1.0 - beta1 ** t)).to(p.dtype), alpha=-lr)
        torch.clear_autocast_cache()  # later passes in the same autocast region read the new parameters
        return loss
