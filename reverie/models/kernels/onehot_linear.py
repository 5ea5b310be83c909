"""Linear layers on ``cat(deter, one-hot stoch)`` features as row gathers, replacing ``F.linear`` on
:meth:`reverie.models.dynamics.CategoricalRSSM.features` (docs/changelog.md, round 1)::

    y = h @ W_h^T + sum_s W_z[:, s*K + index_s] + b          W = [W_h | W_z], index_s = argmax of group s of z

The features stay a dense tensor: :class:`OneHotFeatures` is that tensor, carrying the class index beside it, and
:class:`OneHotLinear` (the fast RSSM's input layer and every layer that reads its features) gathers rows where its
input carries an index, else it is ``nn.Linear``. The backward: ``W_z``'s gradient by ``index_add``, the input's
densely. ``tests/models/kernels/test_onehot_linear.py`` checks both against dense ``F.linear`` in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# from this many rows on (imagination's T*B) the layer gathers rows; below (the observe loop's B rows per step) the
# dense product is cheaper
GATHER_MIN_ROWS = 256


def one_hot_argmax(stoch: torch.Tensor) -> torch.Tensor:
    """Class index ``(..., S)`` int64 of an exact one-hot ``(..., S, K)``, as ``stoch @ [0, 1, .., K-1]`` (faster
    on CPU than ``argmax``); for the columns of a wider tensor (rows of ``S*K`` adjacent entries at a larger
    stride), one product with the block matrix of those weights, which reads the rows where they are."""
    s, k = stoch.shape[-2:]
    classes = torch.arange(k, device=stoch.device, dtype=torch.float32)
    with torch.autocast(stoch.device.type, enabled=False):  # float32: autocast would cast both to 16 bits
        x = stoch.detach().float()
        if x.is_contiguous() or x.stride()[-2:] != (k, 1):
            return (x @ classes).long()
        rows = x.flatten(-2).reshape(-1, s * k)  # a view: (M, S*K) rows at the tensor's stride
        weights = torch.block_diag(*[classes[:, None]] * s)  # (S*K, S): group g's classes in column g
        return (rows @ weights).long().view(*stoch.shape[:-1])


class OneHotFeatures(torch.Tensor):
    """Dense features ``(..., W + S*K)`` whose last ``S*K`` columns are ``S`` exact one-hot groups (``width`` ``W``:
    the columns before, ``groups`` ``S``), with their class index ``(..., S)`` where known. Any operation gives a
    plain tensor, except those that keep the last dimension and act on the leading ones (indexing, ``flatten``,
    ``detach``, a dtype cast), which keep the mark and index the index alike. An in-place write drops the mark
    (:meth:`parts`); copies and pickles are plain tensors."""

    width: int
    groups: int

    @staticmethod
    def of(dense: torch.Tensor, width: int, groups: int, index: torch.Tensor | None = None) -> "OneHotFeatures":
        out = dense.as_subclass(OneHotFeatures)  # the same tensor (storage, autograd history), another class
        out.width, out.groups, out.known, out.written = width, groups, index, _version(dense)
        return out

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()

    def __reduce_ex__(self, protocol: int):
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    def parts(self) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None:
        """``(deter (..., W) or None, stoch (..., S, K), index (..., S))`` (views and the class index), or None after
        an in-place write, and always for inference tensors (they count no writes)."""
        if self.written is None or _version(self) != self.written:
            return None
        plain = self.as_subclass(torch.Tensor)
        stoch = plain[..., self.width:].unflatten(-1, (self.groups, -1))
        index = one_hot_argmax(stoch) if self.known is None else self.known
        return (plain[..., :self.width] if self.width else None), stoch, index

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        source = args[0] if args else None
        keep = _LEADING.get(func)
        if keep is None or type(source) is not cls or type(out) is not torch.Tensor \
                or not out.is_floating_point() or out.shape[-1] != source.shape[-1] \
                or not keep(source.dim(), *args[1:], **kwargs) or _version(source) != source.written:
            return out
        index = source.known
        if index is not None and func in (torch.Tensor.__getitem__, torch.Tensor.flatten):
            index = func(index, *args[1:], **kwargs)  # the same leading dimensions
        return OneHotFeatures.of(out, source.width, source.groups, index)


def _version(x: torch.Tensor) -> int | None:
    """The in-place write counter; None for inference tensors (they keep none)."""
    return None if x.is_inference() else x._version


def _leading_item(dims: int, item, *_, **__) -> bool:
    items = item if isinstance(item, tuple) else (item,)
    used = sum(i.dim() if torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) else 1 for i in items)
    return not any(i is Ellipsis or i is None for i in items) and used < dims  # never the last dimension


def _leading_flatten(dims: int, start_dim: int = 0, end_dim: int = -1) -> bool:
    return end_dim % dims < dims - 1


_LEADING = {  # the operations that keep the mark, each with its check of the arguments
    torch.Tensor.__getitem__: _leading_item,
    torch.Tensor.flatten: _leading_flatten,
    torch.Tensor.detach: lambda *_, **__: True,
    torch.Tensor.to: lambda *_, **__: True,
}


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


def gather_table(weight: torch.Tensor, stoch_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``W_z^T`` ``(S*K, O)``: the last ``stoch_dim`` input columns of ``weight``, contiguous, without gradient, in
    ``dtype``."""
    return weight.detach()[:, weight.shape[1] - stoch_dim:].t().to(dtype).contiguous()


def onehot_linear(deter: torch.Tensor | None, stoch: torch.Tensor, index: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(cat(deter, flat stoch), weight (O, D + S*K), bias (O,))`` ``(..., O)`` as row gathers, for
    ``deter (..., D)`` (or None), the exact one-hot ``stoch (..., S, K)`` of ``index (..., S)``; in the autocast
    dtype if on, else the input's. ValueError: ``weight``'s input width differs from ``D + S*K``.
    """
    s, k = stoch.shape[-2:]
    d = 0 if deter is None else deter.shape[-1]
    if weight.shape[1] != d + s * k:
        raise ValueError(f"onehot_linear: weight takes {weight.shape[1]} inputs but the features have {d + s * k} "
                         f"(deter + stoch * classes); build the layer with the RSSM's feat_dim")
    device = weight.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else stoch.dtype
    lead = index.shape[:-1]
    flat = flat_rows(index, k)  # (..., S) -> (M, S) rows of W_z
    deter = None if deter is None else deter.reshape(-1, d).to(dtype)
    w_h = None if deter is None else weight[:, :d].to(dtype)
    with torch.autocast(device, enabled=False):
        out = _OneHotLinear.apply(deter, stoch, flat, weight, bias, dtype,
                                  gather_table(weight, s * k, dtype), w_h)
    return out.reshape(*lead, out.shape[-1])


class OneHotLinear(nn.Linear):
    """``nn.Linear`` that gathers rows (through :func:`onehot_linear`) where its input is a :class:`OneHotFeatures`
    of at least :data:`GATHER_MIN_ROWS` rows on CPU computing in float32 or wider (in bf16 the matrix units make the
    dense product as fast). The gather table is rebuilt each call: a cache would miss writes through
    ``weight.data`` (docs/changelog.md)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = None
        if type(x) is OneHotFeatures and x.shape[:-1].numel() >= GATHER_MIN_ROWS and gathers_pay(x):
            parts = x.parts()
        if parts is None:
            return F.linear(x.as_subclass(torch.Tensor), self.weight, self.bias)
        return onehot_linear(*parts, self.weight, self.bias)


def gathers_pay(x: torch.Tensor) -> bool:
    """Whether a layer reading ``x`` would gather: on CPU, computing in float32 or float64 (autocast off, or on in
    one of those)."""
    if x.device.type != "cpu":
        return False
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    return dtype in (torch.float32, torch.float64)
