"""The block-GRU RSSM's observe scan as one autograd node, its backward written out (:class:`FusedBlockRSSM`
replaces the step-by-step loop of :meth:`reverie.models.dynamics.BlockRSSM._posterior_steps` under autograd;
docs/speed.md). The forward loop runs without
recording into ``(T, B, ...)`` buffers; the backward runs the reverse loop, then forms each weight's gradient once
over ``T*B`` rows.

One step (official ``rssm.py`` ``_core`` and ``_observe``; :class:`reverie.models.dynamics.block.BlockGRU`), row
``t`` of the precomputed inputs ``ax_t = in_action(prev_action_t)`` and ``ex_t = embed_t @ W_e^T + b_e``::

    resets:  h, z = h * keep_t, z * keep_t                              (only on steps where some row resets)
    inputs:  x = cat(silu(rms(h @ W_d^T + b_d)), silu(rms(z @ W_s^T + b_s)), ax_t)           (B, 3*hidden)
    block:   p = h block g @ W1_g[:D/G] + x @ W1_g[D/G:] + b1   for every block g            (B, D)
             y = silu(rms(p));   r, c, u = per block g: y block g @ W2_g + b2              (B, G, 3, D/G)
    GRU:     h' = lerp(h, tanh(sigmoid(r) * c), sigmoid(u - 1))
    post:    logits = silu(rms(h' @ W_q^T + ex_t)) @ W_o^T + b_o                           (B, S*K)
    sample:  z' = one_hot(unimix draw from logits)    value one-hot, gradient of the unimix probabilities

Values and draws are the loop's (all uniforms drawn at once in the loop's order); gradients agree up to float
addition order (``tests/models/kernels/test_block_scan.py``, float64 and bf16). Not differentiable twice; applies
with ``dynlayers: 1`` and ``obslayers: 1`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from reverie.models import draws
from reverie.models.dynamics.block import BlockRSSM
from reverie.models.kernels.straight_through import straight_through_grad

_aten = torch.ops.aten


@dataclass
class BlockScanSpec:
    """The scan's non-differentiable inputs: ``keep`` ``(T, B, 1)``, ``resets`` (``T`` bools), compute ``dtype``,
    ``G``, ``S``, ``K``, ``unimix`` and the four RMSNorms' ``eps`` (in_deter, in_stoch, block layer, posterior)."""

    keep: torch.Tensor
    resets: list[bool]
    dtype: torch.dtype
    blocks: int
    stoch: int
    classes: int
    unimix: float
    eps: tuple[float, float, float, float]


def _to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)  # no dispatch for the casts that do nothing (float32 throughout)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor, rstd: torch.Tensor) -> None:
    """RMSNorm of ``x (B, n)`` into ``out``, as ``rms_norm`` computes it; ``rstd (B, 1)`` gets the inverse RMS."""
    wide = torch.promote_types(x.dtype, torch.float32)
    xw = _to(x, wide)
    torch.rsqrt(torch.mean(xw * xw, -1, keepdim=True).add_(eps), out=rstd)
    torch.mul(_to(xw * rstd, x.dtype), _to(weight, x.dtype), out=out)


def _rms_input_grad(grad: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Gradient of ``x (B, n)`` through ``y = x * rstd * weight``: ``rstd * (g w - (x rstd) mean(g w x rstd))``."""
    wide = torch.promote_types(x.dtype, torch.float32)
    gw = _to(grad, wide) * _to(weight, wide)
    xr = _to(x, wide) * rstd
    return _to((gw - xr * (gw * xr).mean(-1, keepdim=True)) * rstd, x.dtype)


def _rms_weight_grad(grads: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """RMSNorm scale gradient ``(n,)``: ``sum over (T, B) of g * x * rstd``."""
    wide = torch.promote_types(x.dtype, torch.float32)
    return _to((_to(grads, wide) * _to(x, wide) * rstd).sum((0, 1)), dtype)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])  # (T, B, n) -> (T*B, n)


class _BlockObserveScan(torch.autograd.Function):
    """``(ax, ex (T, B, hidden), deter0 (B, D), stoch0 (B, S, K), spec, weights...) -> (deter (T, B, D), logits
    (T, B, S*K), stoch (T, B, S, K))``; see the module docstring."""

    @staticmethod
    def forward(ctx, ax, ex, deter0, stoch0, spec, wd, bd, nd, ws, bs, ns, w1, b1, n1, w2, b2, wq, nq, wo, bo):
        dt, G, S, K = spec.dtype, spec.blocks, spec.stoch, spec.classes
        T, B, H = ax.shape
        D = deter0.shape[-1]
        P = D // G
        pd = torch.promote_types(dt, torch.float32)  # the sampler's probabilities and the one-hot latents
        sd = torch.promote_types(deter0.dtype, dt)  # the state: lerp promotes the float32 state with the gates
        wide = torch.promote_types(dt, torch.float32)
        with torch.autocast(ax.device.type, enabled=False), torch.no_grad():
            wdt, bd_, wst, bs_, b1_, wq_, wot, bo_ = (_to(w, dt) for w in (wd.t(), bd, ws.t(), bs, b1, wq, wo.t(), bo))
            w1_ = _to(w1, dt)
            own_w, w2_ = w1_[:, :P], _to(w2, dt)  # (G, D/G, D/G), (G, D/G, 3D/G)
            shared_w = w1_[:, P:].permute(1, 0, 2).reshape(3 * H, D)  # (G, 3h, D/G) -> (3h, G*D/G)
            b2_ = _to(b2, dt)
            wqt = wq_.t()
            new = ax.new_empty
            prev, z = new(T, B, D, dtype=sd), new(T, B, S * K, dtype=dt)  # each step's state after the reset
            a0, a1, n0, n1_ = (new(T, B, H, dtype=dt) for _ in range(4))  # the input layers, before/after the norm
            x = new(T, B, 3 * H, dtype=dt)
            pre, npre, y = (new(T, B, D, dtype=dt) for _ in range(3))  # the block layer
            sr, cand, ct, upd = (new(T, B, D, dtype=dt) for _ in range(4))  # the gates
            q, nq_, p1 = (new(T, B, H, dtype=dt) for _ in range(3))  # the posterior layer
            rstd = new(4, T, B, 1, dtype=wide)
            deters, logits = new(T, B, D, dtype=sd), new(T, B, S * K, dtype=dt)
            probs, stochs = new(T, B, S, K, dtype=pd), new(T, B, S, K, dtype=pd)
            # all steps' uniforms at once: rand of (T, B, S, 1) gives the numbers of T calls of (B, S, 1)
            source = draws.source()
            if source is None:
                u = torch.rand(T, B, S, 1, device=ax.device, dtype=torch.float32)
                target = ((u - spec.unimix) * (1.0 / (1.0 - spec.unimix))).to(pd)
                uniform = (u < spec.unimix, (u * (K / spec.unimix)).long().clamp_(max=K - 1)) \
                    if spec.unimix > 0 else None
            else:  # a draw source is installed (reverie.models.draws): each step asks it instead
                target, uniform = ax.new_zeros(T), None
            steps = zip(prev, z, a0, a1, n0, n1_, x, pre, npre, y, sr, cand, ct, upd, q, nq_, p1, *rstd, deters, logits,
                        probs, stochs, ax, ex, target)  # each buffer's views of step t, made once
            h, s = deter0, stoch0
            for t, (prev_t, z_t, a0_t, a1_t, n0_t, n1_t, x_t, pre_t, npre_t, y_t, sr_t, cand_t, ct_t, upd_t, q_t,
                    nq_t, p1_t, r0, r1, r2, r3, h_t, logits_t, probs_t, stoch_t, ax_t, ex_t,
                    target_t) in enumerate(steps):
                if spec.resets[t]:
                    k = spec.keep[t]
                    h, s = h * k, s * k.unsqueeze(-1)
                prev_t.copy_(h)
                z_t.copy_(s.view(B, S * K))
                hd = _to(prev_t, dt)
                torch.addmm(bd_, hd, wdt, out=a0_t)  # in_deter
                torch.addmm(bs_, z_t, wst, out=a1_t)  # in_stoch
                _rms(a0_t, nd, spec.eps[0], n0_t, r0)
                _rms(a1_t, ns, spec.eps[1], n1_t, r1)
                torch.cat([F.silu(n0_t), F.silu(n1_t), ax_t], -1, out=x_t)
                own = torch.bmm(hd.view(B, G, P).transpose(0, 1), own_w)  # (G, B, D/G)
                torch.add(own.transpose(0, 1).reshape(B, D) + x_t @ shared_w, b1_, out=pre_t)
                _rms(pre_t, n1, spec.eps[2], npre_t, r2)
                _aten.silu.out(npre_t, out=y_t)
                gates = torch.bmm(y_t.view(B, G, P).transpose(0, 1), w2_)  # (G, B, 3D/G): r, c, u per block
                gates = (gates.transpose(0, 1).reshape(B, 3 * D) + b2_).view(B, G, 3, P)
                torch.sigmoid(gates[:, :, 0].reshape(B, D), out=sr_t)
                cand_t.copy_(gates[:, :, 1].reshape(B, D))
                torch.tanh(sr_t * cand_t, out=ct_t)
                torch.sigmoid(gates[:, :, 2].reshape(B, D) - 1.0, out=upd_t)
                h = torch.lerp(prev_t, _to(ct_t, sd), _to(upd_t, sd), out=h_t)
                torch.add(_to(h, dt) @ wqt, ex_t, out=q_t)  # posterior
                _rms(q_t, nq, spec.eps[3], nq_t, r3)
                _aten.silu.out(nq_t, out=p1_t)
                torch.addmm(bo_, p1_t, wot, out=logits_t)
                probs_t.copy_(torch.softmax(logits_t.view(B, S, K), -1, dtype=pd))
                if source is not None:
                    index = source.categorical(probs_t, spec.unimix).unsqueeze(-1)  # (B, S) -> (B, S, 1)
                else:
                    index = (probs_t.cumsum(-1) < target_t).sum(-1, keepdim=True).clamp_(max=K - 1)  # (B, S, 1)
                if uniform is not None:
                    index = torch.where(uniform[0][t], uniform[1][t], index)
                s = stoch_t.zero_().scatter_(-1, index, 1.0)  # (B, S, K) one-hot
        # saved through autograd, not on ctx: freed after backward, and in-place edits of a parameter raise
        ctx.save_for_backward(prev, z, a0, a1, n0, n1_, x, pre, npre, y, sr, cand, ct, upd, deters, q, nq_, p1,
                              rstd, probs, wd, ws, w1, w2, wq, wo, nd, ns, n1, nq)
        ctx.spec = spec
        ctx.dtypes = (deter0.dtype, stoch0.dtype, wd.dtype, sd)
        return deters, logits, stochs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_deter, g_logits, g_stoch):
        (prev, z, a0, a1, n0, n1_, x, pre, npre, y, sr, cand, ct, upd, deters, q, nq_, p1, rstd, probs, wd, ws, w1,
         w2, wq, wo, nd, ns, n1, nq) = ctx.saved_tensors
        spec = ctx.spec
        deter_dtype, stoch_dtype, w_dtype, sd = ctx.dtypes
        dt, G, S, K = spec.dtype, spec.blocks, spec.stoch, spec.classes
        T, B, D = prev.shape
        H, P = a0.shape[-1], D // G
        pd = probs.dtype
        with torch.autocast(prev.device.type, enabled=False):
            new = prev.new_empty
            g_ax, g_ex = new(T, B, H, dtype=dt), new(T, B, H, dtype=dt)  # the outputs' gradients for ax and ex
            # ... and, per layer, what the weights' products after the loop read
            g_a0, g_a1, g_n0, g_n1, g_nq = (new(T, B, H, dtype=dt) for _ in range(5))
            g_pre, g_npre = new(T, B, D, dtype=dt), new(T, B, D, dtype=dt)
            g_gates, g_l = new(T, B, G, 3, P, dtype=dt), new(T, B, S * K, dtype=dt)
            wd_, ws_, wq_, wo_, w1_, w2_ = (_to(w, dt) for w in (wd, ws, wq, wo, w1, w2))
            w2t, own_wt = w2_.transpose(1, 2), w1_[:, :P].transpose(1, 2)  # (G, 3D/G, D/G), (G, D/G, D/G)
            shared_wt = w1_[:, P:].permute(1, 0, 2).reshape(3 * H, D).t()  # (G*D/G, 3h)
            no = [None] * T
            steps = zip(prev, a0, a1, n0, n1_, pre, npre, sr, cand, ct, upd, q, nq_, *rstd, probs, g_ax, g_ex, g_a0,
                        g_a1, g_n0, g_n1, g_nq, g_pre, g_npre, g_gates, g_l,
                        no if g_deter is None else g_deter, no if g_logits is None else g_logits,
                        no if g_stoch is None else g_stoch)
            dh_next = ds_next = None  # gradients reaching step t's state from step t+1
            for t, (prev_t, a0_t, a1_t, n0_t, n1_t, pre_t, npre_t, sr_t, cand_t, ct_t, upd_t, q_t, nq_t, r0, r1, r2,
                    r3, probs_t, gax_t, gex_t, ga0_t, ga1_t, gn0_t, gn1_t, gnq_t, gpre_t, gnpre_t, gg_t, gl_t, gd_t,
                    glo_t, gs_t) in reversed(list(enumerate(steps))):
                # sample: straight-through, the gradient of (1 - unimix) * softmax(logits) + unimix / K
                gs = gs_t
                if ds_next is not None:
                    gs = ds_next if gs is None else gs + ds_next
                if gs is not None:
                    st = _to(straight_through_grad(_to(gs, pd), probs_t, spec.unimix).view(B, S * K), dt)
                    gl_t.copy_(st if glo_t is None else st + glo_t)
                elif glo_t is not None:
                    gl_t.copy_(glo_t)
                else:
                    gl_t.zero_()
                # posterior: logits = silu(rms(h' @ W_q^T + ex)) @ W_o^T + b_o
                torch.ops.aten.silu_backward.grad_input(gl_t @ wo_, nq_t, grad_input=gnq_t)
                gq = gex_t.copy_(_rms_input_grad(gnq_t, q_t, r3, nq))
                dh = _to(gq @ wq_, sd)
                if gd_t is not None:
                    dh = dh + gd_t
                if dh_next is not None:
                    dh = dh + dh_next
                # GRU: h' = lerp(h, ct, upd) in the state's dtype, the gates in the compute dtype
                u_s = _to(upd_t, sd)
                d_upd = _to(dh * (_to(ct_t, sd) - prev_t), dt)
                d_prev = dh * (1.0 - u_s)
                d_tanh = _aten.tanh_backward(_to(dh * u_s, dt), ct_t)
                blocks = (B, G, P)  # each gate's gradient into its place of the (B, G, 3, D/G) layout
                _aten.sigmoid_backward.grad_input((d_tanh * cand_t).view(blocks), sr_t.view(blocks),
                                                  grad_input=gg_t[:, :, 0])
                torch.mul(d_tanh.view(blocks), sr_t.view(blocks), out=gg_t[:, :, 1])
                _aten.sigmoid_backward.grad_input(d_upd.view(blocks), upd_t.view(blocks), grad_input=gg_t[:, :, 2])
                # gate layer: per block, r, c, u = y block g @ W2_g + b2
                gy = torch.bmm(gg_t.view(B, G, 3 * P).transpose(0, 1), w2t)  # (G, B, 3D/G) @ (G, 3D/G, D/G)
                _aten.silu_backward.grad_input(gy.transpose(0, 1).reshape(B, D), npre_t, grad_input=gnpre_t)
                gp = gpre_t.copy_(_rms_input_grad(gnpre_t, pre_t, r2, n1))
                # block layer: p = h block g @ W1_g[:D/G] + x @ W1_g[D/G:] + b1
                gx = gp @ shared_wt  # (B, 3h)
                g_own = torch.bmm(gp.view(B, G, P).transpose(0, 1), own_wt)  # (G, B, D/G)
                d_prev = d_prev + _to(g_own.transpose(0, 1).reshape(B, D), sd)
                gax_t.copy_(gx[:, 2 * H:])
                # inputs: silu(rms(h @ W_d^T + b_d)), silu(rms(z @ W_s^T + b_s))
                _aten.silu_backward.grad_input(gx[:, :H], n0_t, grad_input=gn0_t)
                _aten.silu_backward.grad_input(gx[:, H:2 * H], n1_t, grad_input=gn1_t)
                ga0_t.copy_(_rms_input_grad(gn0_t, a0_t, r0, nd))
                ga1_t.copy_(_rms_input_grad(gn1_t, a1_t, r1, ns))
                d_prev = d_prev + _to(ga0_t @ wd_, sd)
                ds = _to(ga1_t @ ws_, pd).view(B, S, K)
                if spec.resets[t]:  # h, z = h * keep, z * keep
                    k = spec.keep[t]
                    d_prev, ds = d_prev * k, ds * k.unsqueeze(-1)
                dh_next, ds_next = d_prev, ds
            # every weight's gradient from all steps at once: (T*B) rows per product
            wt, tb = w_dtype, T * B
            grads = {
                "wd": _to(_flat(g_a0).t() @ _to(_flat(prev), dt), wt), "bd": g_a0.sum((0, 1), dtype=wt),
                "nd": _rms_weight_grad(g_n0, a0, rstd[0], wt),
                "ws": _to(_flat(g_a1).t() @ _flat(z), wt), "bs": g_a1.sum((0, 1), dtype=wt),
                "ns": _rms_weight_grad(g_n1, a1, rstd[1], wt),
                "n1": _rms_weight_grad(g_npre, pre, rstd[2], wt), "b1": g_pre.sum((0, 1), dtype=wt),
                "w2": _to(torch.bmm(y.view(tb, G, P).permute(1, 2, 0), g_gates.view(tb, G, 3 * P).transpose(0, 1)), wt),
                "b2": g_gates.view(tb, 3 * D).sum(0, dtype=wt),
                "wq": _to(_flat(g_ex).t() @ _to(_flat(deters), dt), wt), "nq": _rms_weight_grad(g_nq, q, rstd[3], wt),
                "wo": _to(_flat(g_l).t() @ _flat(p1), wt), "bo": g_l.sum((0, 1), dtype=wt),
            }
            g_pre_blocks = g_pre.view(tb, G, P).transpose(0, 1)  # (G, T*B, D/G)
            own = torch.bmm(_to(prev, dt).view(tb, G, P).permute(1, 2, 0), g_pre_blocks)  # (G, D/G, D/G)
            shared = (_flat(x).t() @ _flat(g_pre)).view(3 * H, G, P).permute(1, 0, 2)  # (3h, G*D/G) -> (G, 3h, D/G)
            grads["w1"] = _to(torch.cat([own, shared], 1), wt)
        need = ctx.needs_input_grad
        return (g_ax, g_ex, _to(dh_next, deter_dtype) if need[2] else None,
                _to(ds_next, stoch_dtype) if need[3] else None, None,
                grads["wd"], grads["bd"], grads["nd"], grads["ws"], grads["bs"], grads["ns"], grads["w1"], grads["b1"],
                grads["n1"], grads["w2"], grads["b2"], grads["wq"], grads["nq"], grads["wo"], grads["bo"])


def scan_applies(rssm: nn.Module) -> bool:
    """Whether ``rssm``'s modules are exactly the classes :func:`block_observe_scan` reads (``dynlayers: 1``,
    ``obslayers: 1``; a subclass may compute something else)."""
    from reverie.models.block_linear import BlockLinear
    from reverie.models.dynamics.block import BlockGRU
    from reverie.models.rms_mlp import Dense, RMSMLP
    from reverie.models.rmsnorm import RMSNorm

    def norm_dense(m: nn.Module) -> bool:
        return (isinstance(m, nn.Sequential) and len(m) == 3 and type(m[0]) is Dense and type(m[1]) is RMSNorm
                and type(m[2]) is nn.SiLU)

    core, post = rssm.core, rssm.post_net
    return (type(core) is BlockGRU and all(norm_dense(m) for m in (core.in_deter, core.in_stoch, core.in_action))
            and len(core.hidden) == 3 and type(core.hidden[0]) is BlockLinear and type(core.hidden[1]) is RMSNorm
            and type(core.hidden[2]) is nn.SiLU and type(core.gates) is BlockLinear and type(post) is RMSMLP
            and len(post.hidden) == 1 and norm_dense(post.hidden[0]) and type(post.out) is Dense)


def block_observe_scan(rssm, action_x: torch.Tensor, embed_x: torch.Tensor, keep: torch.Tensor, resets: list[bool],
                       deter: torch.Tensor, stoch: torch.Tensor,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled observe scan of ``rssm`` as one autograd node: ``action_x`` (``core.in_action(prev_action)``) and
    ``embed_x`` (the embedding's part of the posterior's first layer) ``(T, B, hidden)``, ``keep`` ``(T, B, 1)``,
    state ``deter (B, D)``, ``stoch (B, S, K)`` -> posterior ``deter (T, B, D)``, ``logits (T, B, S*K)`` in
    ``dtype``, straight-through one-hot ``stoch (T, B, S, K)``.
    """
    core, post = rssm.core, rssm.post_net
    block, norm = core.hidden[0], core.hidden[1]
    first, post_norm = post.hidden[0][0], post.hidden[0][1]
    norms = (core.in_deter[1], core.in_stoch[1], norm, post_norm)
    spec = BlockScanSpec(keep, resets, dtype, core.blocks, rssm.stoch, rssm.classes, rssm.unimix,
                         tuple(float(n.eps) for n in norms))
    return _BlockObserveScan.apply(action_x, embed_x, deter, stoch, spec,
                                   core.in_deter[0].weight, core.in_deter[0].bias, norms[0].weight,
                                   core.in_stoch[0].weight, core.in_stoch[0].bias, norms[1].weight,
                                   block.weight, block.bias, norm.weight, core.gates.weight, core.gates.bias,
                                   first.weight[:, :rssm.deter], post_norm.weight, post.out.weight, post.out.bias)


class FusedBlockRSSM(BlockRSSM):
    """:class:`BlockRSSM` whose posterior scan is :func:`block_observe_scan` where it applies (sampled, with
    autograd, on CPU), else the loop; made from one by :meth:`adopt`."""

    @classmethod
    def adopt(cls, rssm: BlockRSSM) -> "FusedBlockRSSM":
        """Make ``rssm`` this class in place (parameters and keys unchanged). ValueError: the scan does not
        reproduce the module's loop (:func:`check_block_scan`)."""
        check_block_scan(rssm)
        rssm.__class__ = cls
        return rssm

    def _posterior_steps(self, action_x: torch.Tensor, embed_x: torch.Tensor, keep: torch.Tensor,
                         resets: list[bool], deter: torch.Tensor, stoch: torch.Tensor, sample: bool):
        device = action_x.device.type
        if not (sample and torch.is_grad_enabled() and device == "cpu"):
            return super()._posterior_steps(action_x, embed_x, keep, resets, deter, stoch, sample)
        weight = self.core.gates.weight
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        if weight.dtype == torch.float64:  # autocast leaves float64 alone
            dtype = torch.float64
        deter, logits, stoch = block_observe_scan(self, action_x, embed_x, keep.to(deter.dtype), resets, deter,
                                                  stoch, dtype)
        return {"deter": deter, "stoch": stoch,
                "logits": logits.unflatten(-1, (self.stoch, self.classes))}  # (T, B, S*K) -> (T, B, S, K)


def check_block_scan(rssm: BlockRSSM) -> None:
    """ValueError unless three observe steps of the scan and the loop (a reset in the second, the same random
    state) agree within ``1e-4`` relative."""
    dyn_dtype = rssm.core.gates.weight.dtype
    gen = torch.Generator().manual_seed(0)
    T, B = 3, 4
    embed = torch.randn(T, B, rssm.embed_dim, generator=gen, dtype=dyn_dtype)
    action = torch.rand(T, B, rssm.action_dim, generator=gen, dtype=dyn_dtype) * 2 - 1
    is_first = torch.zeros(T, B, dtype=torch.bool)
    is_first[1, :2] = True
    state = rssm.initial(B)
    state["deter"] = torch.randn(B, rssm.deter, generator=gen, dtype=dyn_dtype)
    outs = []
    readable = type(rssm)
    # never torch.manual_seed (it would seed every CUDA device): read the CPU stream's state and put it back
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        start = torch.get_rng_state()
        try:
            for cls in (readable, FusedBlockRSSM):
                rssm.__class__ = cls
                torch.set_rng_state(start)
                post, _ = rssm.observe(embed, action, is_first, state)
                outs.append({k: v.detach() for k, v in post.items()})
        finally:
            rssm.__class__ = readable
    problems = [k for k in outs[0] if outs[0][k].shape != outs[1][k].shape
                or not torch.allclose(outs[0][k].double(), outs[1][k].double(), rtol=1e-4, atol=1e-5)]
    if problems:
        raise ValueError(f"BlockRSSM: the fused observe scan (reverie/models/kernels/block_scan.py) computes other "
                         f"{problems} than the module's observe loop (an edited module?); set agent.module.kernels=off "
                         f"to run the modules as written, or update the scan")
