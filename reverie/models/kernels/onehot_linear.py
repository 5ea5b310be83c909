"""Linear layers on ``cat(deter, one-hot stoch)`` features as row gathers, replacing ``F.linear`` on
:meth:`reverie.models.dynamics.CategoricalRSSM.features` (docs/changelog.md, round 1)::

    y = h @ W_h^T + sum_s W_z[:, s*K + index_s] + b          W = [W_h | W_z], index_s = argmax of group s of z

The backward: ``W_z``'s gradient by ``index_add``, ``h``'s densely, ``z``'s only when it requires grad.
``tests/models/kernels/test_onehot_linear.py`` checks both against dense ``F.linear`` in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def one_hot_argmax(stoch: torch.Tensor) -> torch.Tensor:
    """Class index ``(..., S)`` int64 of an exact one-hot ``(..., S, K)``, as ``stoch @ [0, 1, .., K-1]`` (faster
    on CPU than ``argmax``)."""
    classes = torch.arange(stoch.shape[-1], device=stoch.device, dtype=torch.float32)
    with torch.autocast(stoch.device.type, enabled=False):  # float32: autocast would cast both to 16 bits
        return (stoch.detach().float() @ classes).long()


@dataclass
class SplitFeat:
    """Model features ``cat(deter, flat stoch)`` in split form: ``deter`` ``(..., D)`` or None, ``stoch``
    ``(..., S, K)`` exact one-hot or None (no gradient needed), ``index`` ``(..., S)`` int64, ``classes`` ``K``."""

    deter: torch.Tensor | None
    stoch: torch.Tensor | None
    index: torch.Tensor
    classes: int

    @classmethod
    def from_state(cls, deter: torch.Tensor | None, stoch: torch.Tensor) -> "SplitFeat":
        """From ``deter (..., D)`` (or None) and an exact one-hot ``stoch (..., S, K)``."""
        return cls(deter, stoch, one_hot_argmax(stoch), stoch.shape[-1])

    @property
    def lead(self) -> torch.Size:
        """Leading dims ``(...)``."""
        return self.index.shape[:-1]

    @property
    def shape(self) -> torch.Size:
        """``(..., D + S*K)``: the dense features' shape."""
        return torch.Size((*self.lead, self.dim))

    @property
    def dim(self) -> int:
        """``D + S*K``."""
        return (0 if self.deter is None else self.deter.shape[-1]) + self.index.shape[-1] * self.classes

    def _map(self, fn) -> "SplitFeat":
        return SplitFeat(None if self.deter is None else fn(self.deter), None if self.stoch is None else fn(self.stoch),
                         fn(self.index), self.classes)

    def __getitem__(self, item) -> "SplitFeat":
        """Index the leading dims."""
        return self._map(lambda t: t[item])

    def flatten(self, start: int, end: int) -> "SplitFeat":
        """Flatten leading dims ``start..end`` (non-negative)."""
        return self._map(lambda t: t.flatten(start, end))

    def detach(self) -> "SplitFeat":
        return self._map(lambda t: t.detach())

    def to(self, dtype: torch.dtype) -> "SplitFeat":
        """Cast ``deter`` and ``stoch``; ``index`` stays int64."""
        return SplitFeat(None if self.deter is None else self.deter.to(dtype),
                         None if self.stoch is None else self.stoch.to(dtype), self.index, self.classes)

    def dense(self) -> torch.Tensor:
        """``cat(deter, flat one-hot)`` ``(..., D + S*K)``, rebuilt from ``index`` when ``stoch`` is None."""
        stoch = self.stoch
        if stoch is None:
            dtype = torch.float32 if self.deter is None else self.deter.dtype
            stoch = torch.zeros(*self.index.shape, self.classes, dtype=dtype, device=self.index.device)
            stoch.scatter_(-1, self.index.unsqueeze(-1), 1.0)
        stoch = stoch.flatten(-2)
        return stoch if self.deter is None else torch.cat([self.deter, stoch.to(self.deter.dtype)], -1)


_ONE_CALL_ELEMENTS = 1 << 21  # up to this many (M * S * O) the W_z gradient is one index_add on a repeated g
_BLOCK_ELEMENTS = 1 << 20  # elements of g (rows x O) per block of index_add calls


class _OneHotLinear(torch.autograd.Function):
    """``deter (M, D), stoch (M, S, K), flat (M, S), weight (O, D + S*K), bias (O,) -> (M, O)`` in ``dtype``."""

    @staticmethod
    def forward(ctx, deter, stoch, flat, weight, bias, dtype, table, w_h):
        d = 0 if deter is None else deter.shape[-1]
        out = F.embedding_bag(flat, table, mode="sum")  # (M, S) -> (M, O): sum of S rows of W_z^T, in table's dtype
        if bias is not None:
            out = out + bias.to(out.dtype)
        out = out.to(dtype)
        if deter is not None:
            out = torch.addmm(out, deter, w_h.t())  # + h @ W_h^T
        ctx.save_for_backward(deter, flat, weight, w_h)
        ctx.d, ctx.dtype, ctx.has_bias = d, dtype, bias is not None
        ctx.stoch_meta = None if stoch is None else (stoch.shape, stoch.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        deter, flat, weight, w_h = ctx.saved_tensors
        d, dtype = ctx.d, ctx.dtype
        grad_deter = grad_stoch = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_deter = grad @ w_h  # (M, O) @ (O, D) -> (M, D)
        if ctx.needs_input_grad[1]:
            shape, stoch_dtype = ctx.stoch_meta
            grad_stoch = (grad @ weight[:, d:].to(dtype)).view(shape).to(stoch_dtype)  # dense: (M, O) @ (O, S*K)
        if ctx.needs_input_grad[3]:
            grad_weight = onehot_weight_grad(grad, deter, flat, weight)
        if ctx.has_bias and ctx.needs_input_grad[4]:
            grad_bias = grad.sum(0).to(weight.dtype)
        return grad_deter, grad_stoch, None, grad_weight, grad_bias, None, None, None


def flat_rows(index: torch.Tensor, classes: int) -> torch.Tensor:
    """Rows of ``W_z^T`` ``(S*K, O)`` to sum: ``index (..., S)`` -> ``(M, S)`` with ``s * K + index_s``."""
    s = index.shape[-1]
    return index.reshape(-1, s) + torch.arange(0, s * classes, classes, device=index.device)


def onehot_weight_grad(grad: torch.Tensor, deter: torch.Tensor | None, flat: torch.Tensor,
                       weight: torch.Tensor) -> torch.Tensor:
    """Gradient of ``weight (O, D + S*K)`` for ``grad (M, O)`` at ``deter (M, D)`` (or None) and ``flat (M, S)``."""
    d = 0 if deter is None else deter.shape[-1]
    grad_weight = torch.empty_like(weight)
    grad_weight[:, d:] = _index_grad(grad, flat, weight.shape[1] - d, weight.dtype).t()
    if deter is not None:
        grad_weight[:, :d] = (grad.t() @ deter.to(grad.dtype)).to(weight.dtype)  # (O, M) @ (M, D)
    return grad_weight


def _index_grad(grad: torch.Tensor, flat: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Gradient of ``W_z^T`` ``(S*K, O)`` in ``dtype``: row ``flat[m, s]`` receives ``grad[m]``."""
    grad_z = grad.new_zeros(rows, grad.shape[1], dtype=dtype)  # (S*K, O)
    m, groups = flat.shape
    if m * groups * grad.shape[1] <= _ONE_CALL_ELEMENTS:  # small batch: one call on g repeated S times
        grad_z.index_add_(0, flat.reshape(-1), grad.to(dtype).repeat_interleave(groups, 0))  # (M*S, O)
        return grad_z
    block = max(1, _BLOCK_ELEMENTS // grad.shape[1])
    for start in range(0, m, block):  # large batch: S sparse row updates per block (it stays in cache)
        g_block, flat_block = grad[start:start + block].to(dtype), flat[start:start + block]
        for s in range(groups):  # rows flat[:, s] += g, without an (M*S, O) copy
            grad_z.index_add_(0, flat_block[:, s], g_block)
    return grad_z


def gather_table(weight: torch.Tensor, stoch_dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``W_z^T`` ``(S*K, O)``: the last ``stoch_dim`` input columns of ``weight``, contiguous, without gradient, in
    ``dtype`` (default the weight's)."""
    table = weight.detach()[:, weight.shape[1] - stoch_dim:].t()
    return table.to(dtype or weight.dtype).contiguous()


def _compute_dtype(weight: torch.Tensor, feat: "SplitFeat") -> torch.dtype:
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype if feat.deter is None else feat.deter.dtype


def onehot_linear(feat: SplitFeat, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  table: torch.Tensor | None = None, w_h: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(feat.dense(), weight (O, D + S*K), bias (O,))`` ``(..., O)`` as row gathers, in the autocast dtype
    if on, else ``deter``'s; ``table``/``w_h``: cached :func:`gather_table` and ``W_h`` in that dtype, or None.
    ValueError: ``weight``'s input width differs from ``feat.dim``.
    """
    if weight.shape[1] != feat.dim:
        raise ValueError(f"onehot_linear: weight takes {weight.shape[1]} inputs but the features have {feat.dim} "
                         f"(deter + stoch * classes); build the layer with the RSSM's feat_dim")
    dtype = _compute_dtype(weight, feat)
    lead = feat.lead
    s, k = feat.index.shape[-1], feat.classes
    flat = flat_rows(feat.index, k)  # (..., S) -> (M, S) rows of W_z
    deter = None if feat.deter is None else feat.deter.reshape(-1, feat.deter.shape[-1]).to(dtype)
    stoch = None if feat.stoch is None else feat.stoch.reshape(-1, s, k)
    if table is None:
        table = gather_table(weight, s * k, dtype)
    if w_h is None and deter is not None:
        w_h = weight[:, :deter.shape[-1]].to(dtype)
    with torch.autocast(weight.device.type, enabled=False):
        out = _OneHotLinear.apply(deter, stoch, flat, weight, bias, dtype, table, w_h)
    return out.reshape(*lead, out.shape[-1])


class FeatLinear(nn.Linear):
    """``nn.Linear`` that also takes :class:`SplitFeat` inputs (through :func:`onehot_linear`). The gather table is
    rebuilt each call: a cache would miss writes through ``weight.data`` (docs/changelog.md)."""

    def forward(self, x: torch.Tensor | SplitFeat) -> torch.Tensor:
        if not isinstance(x, SplitFeat):
            return super().forward(x)
        return onehot_linear(x, self.weight, self.bias)


def take_split_features(module: nn.Module) -> nn.Module:
    """Make every ``nn.Linear`` under ``module`` (itself included) a :class:`FeatLinear` in place; returns
    ``module``."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = FeatLinear
    return module
