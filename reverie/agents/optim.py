"""The optimiser of the current official DreamerV3: LaProp (Ziyin et al. 2020) with adaptive gradient clipping and a
linear warmup (danijar/dreamerv3 at e3f0224: ``dreamerv3/agent.py:342-379`` ``_make_opt``,
``embodied/jax/opt.py:109-164``, ``configs.yaml:87``). Per parameter tensor ``p`` with gradient ``g`` at step ``t``::

    g <- g / max(1, ||g|| / (agc * max(pmin, ||p||)))            AGC (Brock et al. 2021), per tensor, pmin 1e-3
    v <- beta2 v + (1 - beta2) g^2;   u = g / (sqrt(v / (1 - beta2^t)) + eps)      RMS scaling first ...
    m <- beta1 m + (1 - beta1) u;     p <- p - lr_t m / (1 - beta1^t)              ... then momentum: LaProp
    lr_t = lr * min(1, (t - 1) / warmup)                           (optax's schedules count from 0: lr_1 = 0)

``form="original"`` is LaProp as its authors' PyTorch code writes it, which R2-Dreamer uses (NM512/r2dreamer at
546e4fa ``optim/laprop.py:60-90``, its warmup ``dreamer.py:152-157``): the learning rate enters the momentum and the
bias correction is the momentum of the learning rates, and the warmup counts from 1::

    lr_t = lr * min(1, t / warmup);   m <- beta1 m + (1 - beta1) lr_t u;   c <- beta1 c + (1 - beta1) lr_t
    p <- p - (lr_t / c) m

With a constant ``lr_t`` the two forms take the same steps; they differ while the warmup changes it."""

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


FORMS = ("official", "original")


class LaProp(torch.optim.Optimizer):
    """LaProp with AGC and linear warmup (module docstring), the official defaults (``agc`` 0: no AGC, ``warmup`` 0:
    none); ``form`` ``"official"`` or ``"original"`` (module docstring). State per parameter: ``step``,
    ``exp_avg_sq`` (``v``), ``exp_avg`` (``m``), at least float32, and for the original form ``lr_avg`` (``c``);
    parameters without a gradient are skipped. ValueError for a negative ``lr``, ``agc`` or ``warmup``, betas not in
    [0, 1) or an unknown form."""

    def __init__(self, params: Iterable[nn.Parameter] | Iterable[dict], lr: float = 4e-5, agc: float = 0.3,
                 pmin: float = 1e-3, eps: float = 1e-20, beta1: float = 0.9, beta2: float = 0.999, warmup: int = 1000,
                 form: str = "official"):
        if lr < 0 or agc < 0 or warmup < 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"LaProp: need lr, agc, warmup >= 0 and betas in [0, 1); got lr={lr} agc={agc} "
                             f"warmup={warmup} beta1={beta1} beta2={beta2}")
        if form not in FORMS:
            raise ValueError(f"LaProp: form must be one of {FORMS} (agent.module.laprop), got {form!r}")
        defaults = dict(lr=lr, agc=agc, pmin=pmin, eps=eps, beta1=beta1, beta2=beta2, warmup=int(warmup), form=form)
        super().__init__(params, defaults)

    @staticmethod
    def learning_rate(lr: float, warmup: int, step: int, form: str = "official") -> float:
        """``lr_t`` of step ``t`` (1-based): ``lr * min(1, (t - 1) / warmup)``, for the original form
        ``lr * min(1, t / warmup)`` (``lr`` when ``warmup`` is 0)."""
        return lr if warmup <= 0 else lr * min(1.0, (step - (form == "official")) / warmup)

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
            form = group.get("form", "official")  # checkpoints from before the option have no form
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
                lr = self.learning_rate(group["lr"], group["warmup"], t, form)
                if form == "official":
                    m.mul_(beta1).add_(u, alpha=1.0 - beta1)
                    if lr:
                        p.add_((m / (1.0 - beta1 ** t)).to(p.dtype), alpha=-lr)
                elif lr:  # original: the momentum of lr_t u, corrected by the momentum of lr_t
                    m.mul_(beta1).add_(u, alpha=(1.0 - beta1) * lr)
                    state["lr_avg"] = beta1 * state.get("lr_avg", 0.0) + (1.0 - beta1) * lr
                    p.add_(m.to(p.dtype), alpha=-lr / state["lr_avg"])
        torch.clear_autocast_cache()  # later passes in the same autocast region read the new parameters
        return loss
