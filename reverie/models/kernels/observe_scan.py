"""The categorical RSSM's observe scan as one autograd node, its backward written out (replaces the step-by-step
loop of :meth:`reverie.models.dynamics.CategoricalRSSM._observe_steps` under autograd; docs/changelog.md round 3).
The backward runs the reverse loop with the kernels autograd would call, then forms each weight's gradient once.

One step (DreamerV3 2023 reference ``nets.py`` ``RSSM.obs_step`` with ``img_step`` inside; row ``t`` of each input):

    resets:   h, s = h * keep + h0 * first, s * keep + s0 * first        (only on steps with some is_first)
    input:    x = silu(LN_in(s @ W_z^T + a_t))                            a_t = in_a(prev_action_t), precomputed
    GRU:      r, c, u = split(LN_gru(cat(x, h) @ W_gru^T))
              h' = sigmoid(u - 1) * tanh(sigmoid(r) * c) + (1 - sigmoid(u - 1)) * h     (as lerp, as GRUCell)
    post:     logits = silu(LN_post(h' @ W_h^T + e_t)) @ W_out^T + b_out  e_t = post_e(embed_t), precomputed
    sample:   s' = one_hot(unimix draw from logits)    value one-hot, gradient of the unimix probabilities

Values and draws are the loop's (with ``B >= 256`` rows in float32 the loop's input layer gathers rows: a draw
can differ); gradients agree up to float addition order (``tests/models/kernels/test_observe_scan.py``). Not
differentiable twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reverie.models.distributions import one_hot_index, unimix_index
from reverie.models.kernels.straight_through import straight_through_grad

_LN_GRADS = [True, True, True]  # native_layer_norm_backward: input, weight and bias gradients


def stacked_weight_grad(pairs: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype,
                        bias: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(sum_t g_t^T @ x_t (O, I), sum_t g_t.sum(0) (O,) or None)`` over ``(x_t (B, I), g_t (B, O))`` pairs."""
    x = torch.cat([x for x, _ in pairs])  # (steps * B, I)
    g = torch.cat([g for _, g in pairs])  # (steps * B, O)
    return (g.t() @ x).to(dtype), g.sum(0, dtype=dtype) if bias else None


@dataclass
class ScanSpec:
    """The scan's non-differentiable inputs: ``first`` ``(T, B, 1)`` floats, ``resets`` (``T`` bools), compute
    ``dtype``, ``S``, ``K``, ``unimix`` and the three LayerNorms' ``eps`` (input, GRU, posterior)."""

    first: torch.Tensor
    resets: list[bool]
    dtype: torch.dtype
    stoch: int
    classes: int
    unimix: float
    eps: tuple[float, float, float]


class _ObserveScan(torch.autograd.Function):
    """``(action_proj, embed_proj (T, B, U), deter0 (B, D), stoch0 (B, S, K), init state, spec, weights...) ->
    (deter (T, B, D), logits (T, B, S*K), stoch (T, B, S, K))``; see the module docstring."""

    @staticmethod
    def forward(ctx, action_proj, embed_proj, deter0, stoch0, init_deter, init_stoch, spec, w_z, w_gru, w_h, w_out,
                b_out, ln_in_w, ln_in_b, ln_gru_w, ln_gru_b, ln_post_w, ln_post_b):
        dt = spec.dtype
        T, B, U = action_proj.shape
        S, K = spec.stoch, spec.classes
        D = deter0.shape[-1]
        pd = torch.promote_types(dt, torch.float32)  # the sampler's probabilities: float32 at least
        # the state's dtype: the GRU mixes the previous state as it is (float32 under bf16 autocast), as GRUCell does
        sd = torch.promote_types(dt, deter0.dtype)
        if any(spec.resets):
            sd = torch.promote_types(sd, init_deter.dtype)
        with torch.autocast(action_proj.device.type, enabled=False):
            wz, wg, wh, wo, bo = (w.to(dt) for w in (w_z, w_gru, w_h, w_out, b_out))
            deters = action_proj.new_empty(T, B, D, dtype=sd)
            logits_out = action_proj.new_empty(T, B, S * K, dtype=dt)
            stochs = action_proj.new_empty(T, B, S, K, dtype=pd)
            steps = []
            h, s = deter0, stoch0
            for t in range(T):
                if spec.resets[t]:
                    keep, first = 1.0 - spec.first[t], spec.first[t]  # (B, 1)
                    h = h * keep + init_deter * first
                    s = s * keep.unsqueeze(-1) + init_stoch * first.unsqueeze(-1)
                hp = h.to(sd)  # the previous state
                z = s.flatten(-2).to(dt)  # (B, S*K)
                x1 = F.linear(z, wz) + action_proj[t]
                n1, m1, r1 = torch.native_layer_norm(x1, (U,), ln_in_w, ln_in_b, spec.eps[0])
                c = torch.cat([F.silu(n1), hp.to(dt)], -1)  # (B, U + D)
                p0 = F.linear(c, wg)
                p1, m2, r2 = torch.native_layer_norm(p0, (3 * D,), ln_gru_w, ln_gru_b, spec.eps[1])
                reset, cand, update = p1.chunk(3, -1)
                reset = torch.sigmoid(reset)
                cand_t = torch.tanh(reset * cand)
                update = torch.sigmoid(update - 1.0)
                h = torch.lerp(hp, cand_t.to(sd), update.to(sd))  # (B, D) in the state's dtype, as GRUCell mixes
                hd = h.to(dt)
                q1 = F.linear(hd, wh) + embed_proj[t]
                q2, m3, r3 = torch.native_layer_norm(q1, (U,), ln_post_w, ln_post_b, spec.eps[2])
                q3 = F.silu(q2)
                logits = F.linear(q3, wo, bo)  # (B, S*K)
                probs = torch.softmax(logits.view(B, S, K), -1, dtype=pd)
                s = one_hot_index(unimix_index(probs, spec.unimix), K, pd)  # (B, S, K)
                deters[t], logits_out[t], stochs[t] = h, logits, s
                steps.append((z, x1, m1, r1, n1, c, p0, m2, r2, reset, cand, cand_t, update, hp, hd, q1, m3, r3,
                              q2, q3, probs))
        # saved through autograd, not on ctx: freed after backward, and in-place edits of a parameter raise
        ctx.save_for_backward(*[x for step in steps for x in step], wz, wg, wh, wo, ln_in_w, ln_in_b, ln_gru_w,
                              ln_gru_b, ln_post_w, ln_post_b)
        ctx.spec, ctx.per_step = spec, len(steps[0])
        ctx.dtypes = (deter0.dtype, stoch0.dtype, init_deter.dtype, w_z.dtype, sd)
        return deters, logits_out, stochs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_deter, g_logits, g_stoch):
        spec, k, saved = ctx.spec, ctx.per_step, ctx.saved_tensors
        T = len(spec.resets)
        steps = [saved[t * k:(t + 1) * k] for t in range(T)]
        wz, wg, wh, wo, ln_in_w, ln_in_b, ln_gru_w, ln_gru_b, ln_post_w, ln_post_b = saved[T * k:]
        deter_dtype, stoch_dtype, init_dtype, w_dtype, sd = ctx.dtypes
        dt = spec.dtype
        B, U = steps[0][1].shape
        S, K = spec.stoch, spec.classes
        D = steps[0][13].shape[-1]  # hp
        with torch.autocast(wz.device.type, enabled=False):
            g_action = wz.new_empty(T, B, U)
            g_embed = wz.new_empty(T, B, U)
            filed = {"z": [], "gru": [], "h": [], "out": []}  # per step (input, output gradient) of each weight
            ln_grads = [[] for _ in range(6)]
            g_init = torch.zeros(B, D, dtype=init_dtype, device=wz.device)
            dh_next = ds_next = None  # gradients reaching step t's state from step t+1
            for t in reversed(range(T)):
                (z, x1, m1, r1, n1, c, p0, m2, r2, reset, cand, cand_t, update, hp, hd, q1, m3, r3, q2, q3,
                 probs) = steps[t]
                # sample: straight-through, the gradient of (1 - unimix) * softmax(logits) + unimix / K
                gs = g_stoch[t] if g_stoch is not None else None
                if ds_next is not None:
                    gs = ds_next if gs is None else gs + ds_next
                gl = g_logits[t] if g_logits is not None else None
                if gs is not None:
                    st = straight_through_grad(gs, probs, spec.unimix).flatten(-2).to(wz.dtype)
                    gl = st if gl is None else gl + st
                if gl is None:
                    gl = wz.new_zeros(B, S * K)
                filed["out"].append((q3, gl))
                # posterior: logits = silu(LN(h @ W_h^T + e)) @ W_out^T + b
                dq2 = torch.ops.aten.silu_backward(gl @ wo, q2)
                dq1, dw, db = torch.ops.aten.native_layer_norm_backward(dq2, q1, (U,), m3, r3, ln_post_w, ln_post_b,
                                                                       _LN_GRADS)
                ln_grads[4].append(dw)
                ln_grads[5].append(db)
                g_embed[t] = dq1
                filed["h"].append((hd, dq1))
                dh = (dq1 @ wh).to(sd)
                if g_deter is not None:
                    dh = dh + g_deter[t]
                if dh_next is not None:
                    dh = dh + dh_next
                # GRU: h = lerp(hp, cand_t, update) in the state's dtype, the gates in the compute dtype
                u_s = update.to(sd)
                d_update = (dh * (cand_t.to(sd) - hp)).to(dt)
                d_hp = dh * (1.0 - u_s)
                d_pre = torch.ops.aten.tanh_backward((dh * u_s).to(dt), cand_t)
                d_reset = torch.ops.aten.sigmoid_backward(d_pre * cand, reset)
                d_p1 = torch.cat([d_reset, d_pre * reset, torch.ops.aten.sigmoid_backward(d_update, update)], -1)
                dp0, dw, db = torch.ops.aten.native_layer_norm_backward(d_p1, p0, (3 * D,), m2, r2, ln_gru_w,
                                                                       ln_gru_b, _LN_GRADS)
                ln_grads[2].append(dw)
                ln_grads[3].append(db)
                filed["gru"].append((c, dp0))
                dx, dh_c = (dp0 @ wg).split([U, D], -1)
                d_hp = d_hp + dh_c.to(sd)
                # input: x = silu(LN(z @ W_z^T + a))
                dx1, dw, db = torch.ops.aten.native_layer_norm_backward(torch.ops.aten.silu_backward(dx, n1), x1,
                                                                       (U,), m1, r1, ln_in_w, ln_in_b, _LN_GRADS)
                ln_grads[0].append(dw)
                ln_grads[1].append(db)
                g_action[t] = dx1
                filed["z"].append((z, dx1))
                ds = (dx1 @ wz).view(B, S, K).to(torch.promote_types(dt, torch.float32))
                if spec.resets[t]:  # h = h * keep + h0 * first (and s alike): split the gradient
                    first = spec.first[t]
                    g_init += d_hp * first
                    d_hp = d_hp * (1.0 - first)
                    ds = ds * (1.0 - first).unsqueeze(-1)
                dh_next, ds_next = d_hp, ds
            grads = {name: stacked_weight_grad(pairs, w_dtype)[0] for name, pairs in filed.items() if name != "out"}
            grads["out"], g_bias = stacked_weight_grad(filed["out"], w_dtype, bias=True)
        need = ctx.needs_input_grad
        return (g_action, g_embed, dh_next.to(deter_dtype) if need[2] else None,
                ds_next.to(stoch_dtype) if need[3] else None, g_init if need[4] else None, None, None,
                grads["z"], grads["gru"], grads["h"], grads["out"], g_bias,
                *[torch.stack(g).sum(0) for g in ln_grads])


def observe_scan(rssm, action_proj: torch.Tensor, embed_proj: torch.Tensor, first: torch.Tensor, resets: list[bool],
                 deter: torch.Tensor, stoch: torch.Tensor, init: dict[str, torch.Tensor],
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled observe scan of ``rssm`` as one autograd node: ``action_proj`` (``in_a(prev_action)``),
    ``embed_proj`` (``post_e(embed)``) ``(T, B, U)``, ``first`` ``(T, B, 1)``, state ``deter (B, D)``, ``stoch
    (B, S, K)``, ``init = rssm.initial(B)`` -> posterior ``deter (T, B, D)``, ``logits (T, B, S*K)`` in ``dtype``,
    straight-through one-hot ``stoch (T, B, S, K)``.
    """
    ln_in, ln_gru, ln_post = rssm.in_norm[0], rssm.gru.norm, rssm.post_norm[0]
    spec = ScanSpec(first, resets, dtype, rssm.stoch, rssm.classes, rssm.unimix, (ln_in.eps, ln_gru.eps, ln_post.eps))
    return _ObserveScan.apply(action_proj, embed_proj, deter, stoch, init["deter"], init["stoch"], spec,
                              rssm.in_z.weight, rssm.gru.linear.weight, rssm.post_h.weight, rssm.post_out.weight,
                              rssm.post_out.bias, ln_in.weight, ln_in.bias, ln_gru.weight, ln_gru.bias, ln_post.weight,
                              ln_post.bias)
