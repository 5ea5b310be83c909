"""Output distributions of the world model and the actor (DreamerV3, Hafner et al. 2023, section 3-4).

All are ``torch.distributions.Distribution`` subclasses, so ``log_prob``, ``entropy``, ``mode``,
``sample``/``rsample`` behave the same for every head. Leading dims are free: ``(T, B, ...)`` or ``(B, ...)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import distributions as td

from reverie.models.conv import ImageMSE, scale_image


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * log(1 + |x|)`` (DreamerV3 eq. 9). Any shape."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`symlog`: ``sign(x) * (exp(|x|) - 1)`` (DreamerV3 eq. 9). Any shape."""
    return torch.sign(x) * torch.expm1(torch.abs(x))


def symlog_bins(num_bins: int = 255, low: float = -20.0, high: float = 20.0) -> torch.Tensor:
    """Bin centres in symlog space, exactly symmetric around 0 when ``low == -high`` and ``num_bins`` is odd.

    Reference config: ``bins: 255`` over ``[-20, 20]``. Built from one half and its mirror so that
    ``bins[i] == -bins[-1 - i]`` holds bit for bit, which makes the mean of uniform probabilities exactly 0.
    """
    if num_bins % 2 == 1 and low == -high:
        half = torch.linspace(0.0, high, (num_bins + 1) // 2)
        return torch.cat([-half.flip(0)[:-1], half])
    return torch.linspace(low, high, num_bins)


_BINS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _default_bins(num_bins: int, device: torch.device, space: str = "symlog") -> torch.Tensor:
    """:func:`symlog_bins` ``(K,)`` float32 on ``device`` (``space="symexp"``: their :func:`symexp`, the bins of
    :class:`TwoHotSymexp`), built once per process (read-only: do not modify)."""
    key = (num_bins, device, space)
    if key not in _BINS:
        bins = symlog_bins(num_bins)
        _BINS[key] = (symexp(bins) if space == "symexp" else bins).to(device)
    return _BINS[key]


_LOG_OF_PROBS_MIN = 1e-30  # given probabilities at least this large enter the log-likelihood as log(p)


class _SparseTargetLogProb(torch.autograd.Function):
    """``sum_j weight[..., j] * log_softmax(logits)[..., index[..., j]]``: the log-likelihood of a target
    distribution with ``J`` nonzero entries, ``logits (..., K)``, ``index``/``weight (..., J)`` -> ``(...)``.

    The same numbers as gathering from ``log_softmax`` (in float32), with a backward that never builds a dense
    ``(..., K)`` target or gather gradient: ``d/dlogits = scatter(weight) - softmax * sum_j weight_j`` (one pass
    over ``(..., K)`` plus ``J`` scattered entries per row). ``weight`` gets no gradient (targets are constants).
    With ``probs`` (``softmax(logits)`` float32, no autograd) given, the forward takes the log of its ``J``
    gathered entries (equal to ``log_softmax`` up to float32 rounding; the full ``log_softmax`` where one of them
    is below 1e-30) and the backward reads it instead of exponentiating: no ``(..., K)`` temporaries at all.
    """

    @staticmethod
    def forward(ctx, logits, index, weight, probs):
        ctx.dtype, ctx.given = logits.dtype, probs is not None
        if probs is not None:  # the caller's float32 softmax: the backward reads it, the forward its J entries
            at = probs.gather(-1, index)  # (..., J)
            # log of a float32 probability of 1e-30 or more is log_softmax to float32 rounding; a smaller one (a
            # target bin ~69 nats or more below the best: near or in the subnormals, or 0) is not, so then the
            # full log_softmax below
            if not bool(((at < _LOG_OF_PROBS_MIN) & (weight != 0)).any()):
                ctx.save_for_backward(probs, index, weight)
                return torch.special.xlogy(weight, at).sum(-1)  # 0 where a weight is 0, even at a 0 probability
        logp = F.log_softmax(logits, -1, dtype=torch.float32)  # (..., K)
        ctx.save_for_backward(logp if probs is None else probs, index, weight)  # the backward needs softmax
        return (logp.gather(-1, index) * weight).sum(-1)

    @staticmethod
    def backward(ctx, grad):
        saved, index, weight = ctx.saved_tensors
        g = grad.unsqueeze(-1)  # (..., 1)
        scale = -(g * weight.sum(-1, keepdim=True))
        grad_logits = saved * scale if ctx.given else saved.exp().mul_(scale)  # - softmax * sum_j g w_j
        grad_logits.scatter_add_(-1, index, g * weight)  # + g w_j at index_j
        return grad_logits.to(ctx.dtype), None, None, None


_MEAN_CHUNK_ELEMENTS = 1 << 19  # logits per chunk of TwoHotSymlog.mean without autograd: 2,048 rows of 255 bins


class TwoHotSymlog(td.Distribution):
    """Categorical over fixed bins in symlog space, trained with two-hot targets (DreamerV3 eq. 10-11).

    Args:
        logits: ``(..., K)`` with ``K = bins.numel()`` (255 by default), any float dtype (16-bit under autocast).
        bins: ``(K,)`` bin centres in symlog space; default :func:`symlog_bins`.
        probs: ``softmax(logits)`` ``(..., K)`` float32 computed without autograd, where the caller has it (e.g.
            DreamerV3's critic: the values for the returns, then the loss on the same outputs): ``probs`` and
            ``mean`` read it when no gradient is recorded through them, and ``log_prob``'s backward uses it
            instead of exponentiating the log-probabilities again.

    Every quantity is computed in float32 (softmax and log_softmax take 16-bit logits with ``dtype=float32``; on
    CPU the op makes the float32 copy inside). ``mean``/``mode``: ``(...)`` in the original (symexp) space; exactly ``0`` for all-zero logits,
    which is why the reward and critic output layers are zero-initialised. ``log_prob(x)``: ``(...)``, the
    cross-entropy of the two-hot encoding of ``symlog(x)`` against the predicted probabilities, computed by
    gathering the two neighbouring bins (the same number as summing over a dense two-hot vector, without
    materialising one, in the forward or the backward pass). ``log_prob_mix`` adds several targets in one pass.
    """

    arg_constraints: dict = {}
    has_rsample = False
    _space = "symlog"  # where the bins live and targets are two-hot encoded
    _squash = staticmethod(symlog)  # target value -> bin space
    _unsquash = staticmethod(symexp)  # expected bin -> value

    def __init__(self, logits: torch.Tensor, bins: torch.Tensor | None = None, probs: torch.Tensor | None = None):
        default_bins = bins is None
        if default_bins:
            bins = _default_bins(logits.shape[-1], logits.device, self._space)
        bins = bins.to(device=logits.device, dtype=torch.float32)
        if bins.shape[-1] != logits.shape[-1]:
            raise ValueError(f"TwoHotSymlog: logits have {logits.shape[-1]} bins, bins tensor has {bins.shape[-1]}")
        self.logits = logits
        self.bins = bins
        k = bins.shape[-1]
        # the default bins are symmetric by construction (symlog_bins); only given bins are checked (a host sync)
        self._symmetric = k % 2 == 1 and (default_bins or bool(torch.equal(bins, -bins.flip(0))))
        self._logp: torch.Tensor | None = None
        if probs is not None and (probs.shape != logits.shape or probs.dtype != torch.float32 or probs.requires_grad):
            raise ValueError(f"TwoHotSymlog: probs must be the float32 softmax of the logits, without autograd "
                             f"(shape {tuple(logits.shape)}); got shape {tuple(probs.shape)}, {probs.dtype}, "
                             f"requires_grad={probs.requires_grad}")
        self._given_probs = probs
        super().__init__(batch_shape=logits.shape[:-1], validate_args=False)

    @property
    def log_probs(self) -> torch.Tensor:
        """``log_softmax(logits)`` ``(..., K)`` float32, computed once and shared by ``mean`` and ``entropy``."""
        if self._logp is None:
            self._logp = F.log_softmax(self.logits, -1, dtype=torch.float32)
        return self._logp

    @property
    def probs(self) -> torch.Tensor:
        if self._given_probs is not None and not (self.logits.requires_grad and torch.is_grad_enabled()):
            return self._given_probs
        # softmax for a distribution only read by its mean (one exp); exp of the shared log_softmax otherwise
        if self._logp is None:
            return torch.softmax(self.logits, -1, dtype=torch.float32)
        return self._logp.exp()

    @property
    def mean(self) -> torch.Tensor:
        k = self.logits.shape[-1]
        rows, chunk = self.logits.numel() // k, max(1, _MEAN_CHUNK_ELEMENTS // k)
        if rows > chunk and self._given_probs is None and self._logp is None and \
                not (self.logits.requires_grad and torch.is_grad_enabled()):
            # no gradient and nothing to share: the probabilities chunk by chunk, each chunk's float32 temporaries
            # reused while in cache (at (15, 1024, 255) bf16 logits: 1.9 ms instead of 3.5, docs/speed.md round 4)
            flat = self.logits.reshape(rows, k)
            out = torch.empty(rows, dtype=torch.float32, device=flat.device)
            for start in range(0, rows, chunk):
                out[start:start + chunk] = self._mean_of(torch.softmax(flat[start:start + chunk], -1,
                                                                       dtype=torch.float32))
            return out.view(self.logits.shape[:-1])
        return self._mean_of(self.probs)

    def _mean_of(self, probs: torch.Tensor) -> torch.Tensor:
        """``symexp(E[bins])`` ``(...)`` of probabilities ``(..., K)``."""
        if self._symmetric:
            # bins[m + i] == -bins[m - i]: pair the halves, so equal probabilities cancel exactly (mean 0 at 0 logits)
            m = self.bins.shape[-1] // 2
            diff = probs[..., m + 1 :] - probs[..., :m].flip(-1)  # (..., m)
            return self._unsquash(diff @ self.bins[m + 1 :])
        return self._unsquash(probs @ self.bins)

    @property
    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.log_prob_mix([value], [1.0])

    def log_prob_mix(self, values: list[torch.Tensor], scales: list[float]) -> torch.Tensor:
        """``sum_i scales[i] * log_prob(values[i])`` ``(...)`` in one pass over the bins (``values[i]`` ``(...)``;
        e.g. DreamerV3's critic loss: the return target plus ``slow_reg`` times the slow critic's mean)."""
        index, weight = [], []
        for value, scale in zip(values, scales):
            below, above, w_below, w_above = two_hot_indices(self._squash(value.float()), self.bins)
            index += [below, above]
            weight += [scale * w_below, scale * w_above]
        return _SparseTargetLogProb.apply(self.logits, torch.stack(index, -1), torch.stack(weight, -1),
                                          self._given_probs)

    def entropy(self) -> torch.Tensor:
        logp = self.log_probs
        return -(logp.exp() * logp).sum(-1)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class TwoHotSymexp(TwoHotSymlog):
    """Categorical over bins spaced by symexp, trained with two-hot targets in the values' own space: the current
    official DreamerV3's reward and value heads (``embodied/jax/heads.py`` ``symexp_twohot``, ``outs.py``
    ``TwoHot``; danijar/dreamerv3 at e3f0224).

    The bins are ``symexp(symlog_bins(K))`` (255 bins from ``-symexp(20)`` to ``symexp(20)``, exactly symmetric);
    ``mean = sum(probs * bins)`` (no symexp afterwards) and ``log_prob(x)`` is the cross-entropy of the two-hot
    encoding of ``x`` itself between its neighbouring bins (weights linear in ``x``, not in ``symlog(x)``). The
    2023 head (:class:`TwoHotSymlog`) encoded ``symlog(x)`` between evenly spaced bins and returned
    ``symexp(sum(probs * bins))``: the same bins in another space, different interpolation and prediction.
    Arguments and the rest of the interface as :class:`TwoHotSymlog`.
    """

    _space = "symexp"
    _squash = staticmethod(_identity)  # values are encoded as they are
    _unsquash = staticmethod(_identity)


def two_hot_indices(x: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Neighbouring bin indices and weights of the two-hot encoding of ``x`` ``(...)`` over sorted ``bins``.

    Returns ``(below, above, w_below, w_above)``, each ``(...)``; the weights sum to 1 and values outside the
    bin range put all weight on the closest end bin.
    """
    x = x.detach()
    k = bins.shape[-1]
    above = torch.searchsorted(bins, x.contiguous(), right=True).clamp(1, k - 1)  # index of first bin > x
    below = above - 1
    lo, hi = bins[below], bins[above]
    w_above = ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
    return below, above, 1.0 - w_above, w_above


def two_hot(x: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Two-hot encoding of ``x`` ``(...)`` over sorted ``bins`` ``(K,)`` -> ``(..., K)`` (DreamerV3 eq. 11).

    The two neighbouring bins get weights proportional to closeness, summing to 1; values outside the bin
    range put all weight on the closest end bin. ``(two_hot(x) * bins).sum(-1) == x`` inside the range.
    """
    below, above, w_below, w_above = two_hot_indices(x, bins)
    out = torch.zeros(*x.shape, bins.shape[-1], device=x.device, dtype=bins.dtype)
    out.scatter_(-1, below.unsqueeze(-1), w_below.unsqueeze(-1))
    out.scatter_add_(-1, above.unsqueeze(-1), w_above.unsqueeze(-1))
    return out


def unimix_probs(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """``(1 - unimix) * softmax(logits) + unimix / K`` (DreamerV3 "1% unimix"). ``(..., K)`` -> ``(..., K)``."""
    probs = torch.softmax(logits, -1)
    return (1.0 - unimix) * probs + unimix / logits.shape[-1] if unimix > 0.0 else probs


def unimix_logits(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """Log-probabilities of :func:`unimix_probs`. ``(..., K)`` -> ``(..., K)``."""
    if unimix <= 0.0:
        return F.log_softmax(logits, -1)
    return torch.log(unimix_probs(logits, unimix))


def one_hot_index(index: torch.Tensor, classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(...)`` int64 -> ``(..., classes)`` one-hot (a scatter, without ``F.one_hot``'s range checks)."""
    out = torch.zeros(*index.shape, classes, device=index.device, dtype=dtype)
    return out.scatter_(-1, index.unsqueeze(-1), 1.0)


def one_hot_sample(probs: torch.Tensor) -> torch.Tensor:
    """One-hot sample ``(..., K)`` in ``probs``' dtype of categorical ``probs`` ``(..., K)`` (rows summing to 1):
    the inverse CDF at one uniform draw per distribution (:func:`_unimix_index` without a uniform part)."""
    return one_hot_index(_unimix_index(probs, 0.0), probs.shape[-1], probs.dtype)


_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
                   torch.float16: torch.int16}


def count_below(cdf: torch.Tensor, target: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """Per row, how many entries of a nondecreasing ``cdf (..., K)`` are below ``target (..., 1)``: ``(..., 1)`` int32
    (int64 for float64); the same numbers as ``torch.searchsorted(cdf, target)`` (left side).

    Summed sign bits of ``cdf - target`` (one subtraction, one shift, one short sum): about 4x faster than
    ``searchsorted``'s per-row binary search on CPU at ``K = 32`` (docs/speed.md, round 4). Exact for finite
    values: IEEE subtraction gives ``a - b < 0`` exactly when ``a < b`` (with subnormals; a process that sets
    ``torch.set_flush_denormal(True)`` could count a difference below ~1e-38 as not below) and ``+0`` when equal
    (one exception: an entry ``-0.0`` counts as below a target ``+0.0``; a cumsum of probabilities has none).
    ``overwrite=True`` works in ``cdf``'s memory (its values are lost; no new ``(..., K)`` tensor, which at the
    rollout's 4 MiB per step is memory traffic saved).

    Raises:
        TypeError: ``cdf - target`` is not a float tensor of 16, 32 or 64 bits (or, with ``overwrite``, not
            ``cdf``'s dtype).
    """
    dtype = cdf.dtype if overwrite else torch.promote_types(cdf.dtype, target.dtype)
    if dtype not in _SAME_WIDTH_INT or (overwrite and target.dtype != dtype):
        raise TypeError(f"count_below needs float16/bfloat16/float32/float64 cdf and target (one dtype with "
                        f"overwrite=True), got {cdf.dtype} and {target.dtype}")
    diff = cdf.sub_(target) if overwrite else cdf - target  # (..., K); the sign bit is set where cdf < target
    bits = diff.view(_SAME_WIDTH_INT[dtype])
    bits.bitwise_right_shift_(8 * bits.element_size() - 1)  # arithmetic shift: -1 where cdf < target, else 0
    return bits.sum(-1, keepdim=True, dtype=torch.int64 if bits.element_size() == 8 else torch.int32).neg_()


@torch.no_grad()
def _unimix_index(probs: torch.Tensor, unimix: float, overwrite: bool = False) -> torch.Tensor:
    """Class index ``(...)`` int64 of one draw from ``(1 - unimix) * probs + unimix / K`` (``probs (..., K)``, rows
    summing to 1), as the mixture it is: one uniform ``u`` per distribution; ``u < unimix`` picks class
    ``floor(u / unimix * K)`` (uniform), otherwise the inverse CDF of ``probs`` at ``(u - unimix) / (1 - unimix)``
    (uniform on ``[0, 1)`` given ``u >= unimix``). Two passes over ``(..., K)`` (cumsum, :func:`count_below`) instead
    of building the mixed probabilities and comparing every class, in one ``(..., K)`` buffer: the cumsum's, or
    with ``overwrite=True`` ``probs``' own (its values are lost)."""
    k = probs.shape[-1]
    u = torch.rand(probs.shape[:-1] + (1,), device=probs.device, dtype=torch.float32)  # (..., 1)
    # (..., K); cdf[..., -1] is 1 up to rounding: a target above it lands on class K-1
    cdf = probs.cumsum_(-1) if overwrite else probs.cumsum(-1)
    target = ((u - unimix) * (1.0 / (1.0 - unimix))).to(cdf.dtype)
    index = count_below(cdf, target, overwrite=True).clamp_(max=k - 1).long()  # the count of classes with cdf < target
    if unimix > 0.0:
        index = torch.where(u < unimix, (u * (k / unimix)).long().clamp_(max=k - 1), index)
    return index.squeeze(-1)


def unimix_sample_index(logits: torch.Tensor, unimix: float = 0.01) -> torch.Tensor:
    """Class index ``(...)`` int64 of a sample of :class:`UnimixCategorical` ``(logits (..., K), unimix)``: the
    same draw :func:`unimix_sample` makes from the same random state, without the one-hot (imagination for
    discrete actions needs no gradient through the latent; the heads read the index, docs/speed.md)."""
    return _unimix_index(torch.softmax(logits, -1, dtype=torch.float32), unimix, overwrite=True)


def straight_through_grad(grad: torch.Tensor, probs: torch.Tensor, unimix: float) -> torch.Tensor:
    """Gradient w.r.t. the logits ``(..., K)`` float32 of the unimix probabilities ``(1 - unimix) * softmax(logits) +
    unimix / K`` for an upstream gradient ``grad (..., K)`` on them: ``(1 - unimix) * p * (g - sum(g * p))`` with
    ``p = softmax(logits)`` ``(..., K)`` float32 (the straight-through estimator's backward, Bengio et al. 2013)."""
    grad_logits = (grad - (grad * probs).sum(-1, keepdim=True)).mul_(probs)
    return grad_logits.mul_(1.0 - unimix) if unimix else grad_logits


class _StraightThrough(torch.autograd.Function):
    """The one-hot of ``index`` ``(...) -> (..., K)`` float32 as the value, the gradient of the unimix
    probabilities ``(1 - unimix) * softmax(logits) + unimix / K`` as the gradient (Bengio et al. 2013; DreamerV3
    section 3): ``d/dlogits = (1 - unimix) * p * (g - sum(g * p))`` with ``p = softmax(logits)`` (given, float32).
    One autograd node instead of the ``sample + probs - probs.detach()`` graph (mix, subtract, add, softmax)."""

    @staticmethod
    def forward(ctx, logits, probs, index, unimix):
        ctx.save_for_backward(probs)
        ctx.unimix, ctx.dtype = unimix, logits.dtype
        return one_hot_index(index, probs.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return straight_through_grad(grad, p, ctx.unimix).to(ctx.dtype), None, None, None


def unimix_sample(logits: torch.Tensor, unimix: float = 0.01) -> torch.Tensor:
    """Straight-through one-hot sample of :class:`UnimixCategorical` without building the distribution.

    The hot path of the RSSM (one call per latent step): ``logits (..., K)`` -> one-hot ``(..., K)`` float32 whose
    value is a sample and whose gradient is that of the unimix probabilities. Same law as
    ``UnimixCategorical(logits, unimix).rsample()``; the class is :func:`unimix_sample_index`'s draw.
    """
    probs = torch.softmax(logits.detach(), -1, dtype=torch.float32)
    index = _unimix_index(probs, unimix)
    if not (logits.requires_grad and torch.is_grad_enabled()):
        return one_hot_index(index, logits.shape[-1])
    return _StraightThrough.apply(logits, probs, index, unimix)


class UnimixCategorical(td.OneHotCategorical):
    """One-hot categorical mixed with ``unimix`` of the uniform distribution, straight-through ``rsample``.

    DreamerV3 section 4 ("1% unimix"): ``probs = (1 - unimix) * softmax(logits) + unimix / K``.

    Args:
        logits: ``(..., K)``.
        unimix: mixing weight of the uniform distribution (reference ``unimix: 0.01``).

    ``rsample()`` returns a one-hot ``(..., K)`` sample whose gradient is that of the probabilities
    (straight-through estimator, Bengio et al. 2013). ``mode`` is the one-hot argmax.
    """

    has_rsample = True

    def __init__(self, logits: torch.Tensor, unimix: float = 0.01):
        super().__init__(logits=unimix_logits(logits.float(), unimix), validate_args=False)

    @property
    def mode(self) -> torch.Tensor:
        return one_hot_index(self.logits.argmax(-1), self.logits.shape[-1], self.logits.dtype)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """One-hot sample (:func:`one_hot_sample`)."""
        return one_hot_sample(self.probs.expand(torch.Size(sample_shape) + self.probs.shape))

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        sample = self.sample(sample_shape)
        probs = self.probs.expand(sample.shape)
        return sample + (probs - probs.detach())  # exactly one-hot in value, gradient of probs


class BoundedNormal(td.Independent):
    """Diagonal normal with ``tanh`` mean and std squashed into ``[min_std, max_std]``.

    DreamerV3 (2023 reference, ``actor.dist: normal``, ``minstd 0.1``, ``maxstd 1.0``):
    ``mean = tanh(mean_raw)``, ``std = (max_std - min_std) * sigmoid(std_raw + 2) + min_std``.

    Args:
        mean_raw, std_raw: ``(..., A)``.

    Samples are unbounded; the env layer clips actions to ``[-1, 1]``. Event shape ``(A,)``.
    """

    def __init__(self, mean_raw: torch.Tensor, std_raw: torch.Tensor, min_std: float = 0.1, max_std: float = 1.0):
        mean = torch.tanh(mean_raw.float())
        std = (max_std - min_std) * torch.sigmoid(std_raw.float() + 2.0) + min_std
        super().__init__(td.Normal(mean, std), 1, validate_args=False)

    @property
    def mode(self) -> torch.Tensor:
        return self.base_dist.mean


class SymlogMSE(td.Distribution):
    """Vector decoder output: prediction in symlog space, ``log_prob(x) = -sum((pred - symlog(x))^2)``.

    DreamerV3 eq. 8 (symlog squared error). Args: ``pred`` ``(..., F)``. ``mode``/``mean``: ``symexp(pred)``.
    """

    arg_constraints: dict = {}

    def __init__(self, pred: torch.Tensor):
        self.pred = pred.float()
        super().__init__(batch_shape=pred.shape[:-1], event_shape=pred.shape[-1:], validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        return symexp(self.pred)

    @property
    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return -((self.pred - symlog(value)) ** 2).sum(-1)


class Bernoulli(td.Bernoulli):
    """Bernoulli continue head (DreamerV3 section 3). ``logits`` ``(...)``; ``mode`` is ``probs > 0.5``."""

    def __init__(self, logits: torch.Tensor):
        super().__init__(logits=logits.float(), validate_args=False)

    @property
    def mode(self) -> torch.Tensor:
        return (self.logits > 0).to(self.logits.dtype)


class FixedNormal(td.Distribution):
    """Normal with a learned mean and a fixed std, summed over the last ``event_dims`` dims (PlaNet decoders).

    PlaNet (Hafner et al. 2019, section 3; reference ``models``: ``tfd.Normal(mean, 1.0)`` for the image and
    reward heads). ``log_prob(x) = sum over the event of log N(x; mean, std)``, including the constant
    ``-log(std * sqrt(2 pi))`` per element.

    Args:
        mean: ``(..., *event)``.
        std: fixed standard deviation > 0 (``decoder_std``).
        event_dims: how many trailing dims form the event (0 for a scalar reward, 1 for a vector ``(F,)``).

    ``mean``/``mode``: the mean. ``sample()``: a draw ``mean + std * eps`` (no gradient).

    Raises:
        ValueError: ``std`` <= 0.
    """

    arg_constraints: dict = {}

    def __init__(self, mean: torch.Tensor, std: float = 1.0, event_dims: int = 1):
        if std <= 0:
            raise ValueError(f"FixedNormal: std must be > 0 (decoder_std), got {std}")
        self.loc = mean.float()
        self.scale = float(std)
        self.event_dims = int(event_dims)
        shape = self.loc.shape
        split = len(shape) - self.event_dims
        super().__init__(batch_shape=shape[:split], event_shape=shape[split:], validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            shape = torch.Size(sample_shape) + self.loc.shape
            return self.loc.expand(shape) + self.scale * torch.randn(shape, device=self.loc.device)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        z = (value.float() - self.loc) / self.scale
        logp = -0.5 * z**2 - math.log(self.scale * math.sqrt(2.0 * math.pi))
        return logp.sum(tuple(range(-self.event_dims, 0))) if self.event_dims else logp


class GaussianImage(ImageMSE):
    """Image decoder output with a fixed-std Gaussian likelihood over scaled pixels (PlaNet, ``decoder_std``).

    ``log_prob(x)``: ``x`` uint8 or float pixel values ``(..., C, H, W)`` in ``[0, 256)`` (e.g. bit-reduced
    and dequantised by :func:`reduce_bits`), scaled by :func:`reverie.models.conv.scale_image`, then
    ``sum over (C, H, W) of log N(scale_image(x); pred, std)`` -> ``(...)``. ``mean``/``mode`` as
    :class:`reverie.models.conv.ImageMSE` (``mode`` is uint8, ready to show).

    Raises:
        ValueError: ``std`` <= 0.
    """

    def __init__(self, pred: torch.Tensor, std: float = 1.0):
        if std <= 0:
            raise ValueError(f"GaussianImage: std must be > 0 (decoder_std), got {std}")
        super().__init__(pred)
        self.std = float(std)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        z = (self.pred - scale_image(value)) / self.std
        logp = -0.5 * z**2 - math.log(self.std * math.sqrt(2.0 * math.pi))
        return logp.sum((-3, -2, -1))


def reduce_bits(image: torch.Tensor, bits: int = 5, noise: bool = True) -> torch.Tensor:
    """Bit-depth reduction with dequantisation noise (PlaNet ``preprocess``: 5 bits, uniform noise).

    ``image``: uint8 (or integer-valued) pixels ``(..., C, H, W)`` in ``[0, 255]`` -> float32 pixel values in
    ``[0, 256)``: ``floor(x / 2^(8 - bits)) * 2^(8 - bits)`` plus ``U[0, 2^(8 - bits))`` noise (``noise=True``,
    training) or plus half a bin (``noise=False``: the noise's mean; acting and evaluation). ``bits == 8``
    without noise returns the pixels as float unchanged. Feed the result to the image encoder and the image
    likelihood, which scale pixel values themselves.

    Raises:
        ValueError: ``bits`` outside ``1..8``.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"reduce_bits: bits must be in 1..8 (image_bits), got {bits}")
    x = image.to(torch.float32)
    if bits == 8 and not noise:
        return x
    step = float(2 ** (8 - bits))
    x = torch.floor(x / step) * step
    return x + (torch.rand_like(x) * step if noise else step / 2.0)
