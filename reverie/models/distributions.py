"""Output distributions of the world model and the actor (DreamerV3, Hafner et al. 2023, section 3-4).

All are ``torch.distributions.Distribution`` subclasses, so ``log_prob``, ``entropy``, ``mode``,
``sample``/``rsample`` behave the same for every head. Leading dims are free: ``(T, B, ...)`` or ``(B, ...)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import distributions as td

from reverie.models import draws
from reverie.models.conv import ImageMSE, float32_or_wider, scale_image


class FastPaths:
    """The distributions' plug points for the hand-written kernels, filled from outside by
    :mod:`reverie.models.kernels` (importing it plugs them in; :func:`reverie.models.kernels.install` turns them on
    in an agent's modules). This file never imports the kernels: with every ``fast`` False, as with
    ``kernels=off``, none of these is read.

    - ``two_hot_log_prob(logits, index, weight, probs) -> (...)``: :meth:`TwoHotSymlog.log_prob_mix`'s sum
      ``sum_j weight[..., j] * log_softmax(logits)[..., index[..., j]]`` (``probs``: the given softmax or None).
    - ``count_below(cdf (..., K), target (..., 1), overwrite) -> (..., 1)``: classes with ``cdf < target``
      (``torch.searchsorted(cdf, target)``).
    - ``straight_through(logits, probs, index, unimix) -> (..., K)``: the one-hot of ``index`` with the gradient of
      the unimix probabilities (:func:`unimix_sample`'s readable graph).
    """

    two_hot_log_prob = None
    count_below = None
    straight_through = None

    @classmethod
    def get(cls, name: str):
        """The plugged-in function ``name``.

        Raises:
            RuntimeError: nothing plugged in (``fast=True`` without :mod:`reverie.models.kernels` imported).
        """
        fn = getattr(cls, name)
        if fn is None:
            raise RuntimeError(f"fast=True asks for the {name} kernel, but reverie.models.kernels was never imported "
                               f"to plug it in: build through an agent (it installs the kernels) or pass fast=False")
        return fn


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
        # a normal tensor even when first asked for under torch.inference_mode (acting, `reverie eval`): an
        # inference tensor in the cache would break every later update ("Inference tensors cannot be saved for
        # backward")
        with torch.inference_mode(False):
            bins = symlog_bins(num_bins)
            _BINS[key] = (symexp(bins) if space == "symexp" else bins).to(device)
    return _BINS[key]


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
        fast: ``log_prob`` through its kernel (:class:`FastPaths`; :mod:`reverie.models.kernels.two_hot`: the same
            values, a sparse backward); False: ``log_softmax`` gathered at the two bins, under autograd.

    Every quantity is computed in float32 at least (softmax and log_softmax take 16-bit logits with
    ``dtype=float32``; on CPU the op makes the float32 copy inside). ``mean``/``mode``: ``(...)`` in the original
    (symexp) space; exactly ``0`` for all-zero logits, which is why the reward and critic output layers are
    zero-initialised. ``log_prob(x)``: ``(...)``, the cross-entropy of the two-hot encoding of ``symlog(x)`` against
    the predicted probabilities, computed by gathering the two neighbouring bins (the same number as summing over a
    dense two-hot vector). ``log_prob_mix`` adds several targets in one pass.
    """

    arg_constraints: dict = {}
    has_rsample = False
    _space = "symlog"  # where the bins live and targets are two-hot encoded
    _squash = staticmethod(symlog)  # target value -> bin space
    _unsquash = staticmethod(symexp)  # expected bin -> value

    def __init__(self, logits: torch.Tensor, bins: torch.Tensor | None = None, probs: torch.Tensor | None = None,
                 fast: bool = False):
        self.fast, self.dtype = bool(fast), _at_least_float32(logits.dtype)
        default_bins = bins is None
        if default_bins:
            bins = _default_bins(logits.shape[-1], logits.device, self._space)
        bins = bins.to(device=logits.device, dtype=self.dtype)
        if bins.shape[-1] != logits.shape[-1]:
            raise ValueError(f"TwoHotSymlog: logits have {logits.shape[-1]} bins, bins tensor has {bins.shape[-1]}")
        self.logits = logits
        self.bins = bins
        k = bins.shape[-1]
        # the default bins are symmetric by construction (symlog_bins); only given bins are checked (a host sync)
        self._symmetric = k % 2 == 1 and (default_bins or bool(torch.equal(bins, -bins.flip(0))))
        self._logp: torch.Tensor | None = None
        if probs is not None and (probs.shape != logits.shape or probs.dtype != self.dtype or probs.requires_grad):
            raise ValueError(f"TwoHotSymlog: probs must be the {self.dtype} softmax of the logits, without autograd "
                             f"(shape {tuple(logits.shape)}); got shape {tuple(probs.shape)}, {probs.dtype}, "
                             f"requires_grad={probs.requires_grad}")
        self._given_probs = probs
        super().__init__(batch_shape=logits.shape[:-1], validate_args=False)

    @property
    def log_probs(self) -> torch.Tensor:
        """``log_softmax(logits)`` ``(..., K)`` (float32 at least), computed once and shared by ``mean``,
        ``entropy`` and ``log_prob``."""
        if self._logp is None:
            self._logp = F.log_softmax(self.logits, -1, dtype=self.dtype)
        return self._logp

    @property
    def probs(self) -> torch.Tensor:
        if self._given_probs is not None and not (self.logits.requires_grad and torch.is_grad_enabled()):
            return self._given_probs
        # softmax for a distribution only read by its mean (one exp); exp of the shared log_softmax otherwise
        if self._logp is None:
            return torch.softmax(self.logits, -1, dtype=self.dtype)
        return self._logp.exp()

    @property
    def mean(self) -> torch.Tensor:
        k = self.logits.shape[-1]
        rows, chunk = self.logits.numel() // k, max(1, _MEAN_CHUNK_ELEMENTS // k)
        if rows > chunk and self._given_probs is None and self._logp is None and \
                not (self.logits.requires_grad and torch.is_grad_enabled()):
            # no gradient and nothing to share: the probabilities chunk by chunk, each chunk's float32 temporaries
            # reused while in cache (at (15, 1024, 255) bf16 logits: 1.9 ms instead of 3.5, docs/changelog.md round 4)
            flat = self.logits.reshape(rows, k)
            out = torch.empty(rows, dtype=self.dtype, device=flat.device)
            for start in range(0, rows, chunk):
                out[start:start + chunk] = self._mean_of(torch.softmax(flat[start:start + chunk], -1,
                                                                       dtype=self.dtype))
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
            below, above, w_below, w_above = two_hot_indices(self._squash(value.to(self.dtype)), self.bins)
            index += [below, above]
            weight += [scale * w_below, scale * w_above]
        index, weight = torch.stack(index, -1), torch.stack(weight, -1)  # (..., 2 * len(values))
        if self.fast:
            return FastPaths.get("two_hot_log_prob")(self.logits, index, weight, self._given_probs)
        picked = self.log_probs.gather(-1, index)  # (..., 2 * len(values))
        # a zero weight contributes 0 even where its bin's log-probability is -inf (a -inf logit next to a target
        # that sits exactly on a bin): 0 * -inf would be NaN
        return torch.where(weight != 0, picked * weight, picked.new_zeros(())).sum(-1)

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
    the inverse CDF at one uniform draw per distribution (:func:`unimix_index` without a uniform part)."""
    return one_hot_index(unimix_index(probs, 0.0), probs.shape[-1], probs.dtype)


def unimix_index(probs: torch.Tensor, unimix: float, fast: bool = False, overwrite: bool = False) -> torch.Tensor:
    """Class index ``(...)`` int64 of one draw from ``(1 - unimix) * probs + unimix / K`` (``probs (..., K)``, rows
    summing to 1), drawn as the mixture it is: one uniform ``u`` per distribution; ``u < unimix`` picks class
    ``floor(u / unimix * K)`` (uniform), otherwise the inverse CDF of ``probs`` at ``(u - unimix) / (1 - unimix)``
    (uniform on ``[0, 1)`` given ``u >= unimix``). The CDF search is ``torch.searchsorted``, or with ``fast`` its
    kernel (:func:`reverie.models.kernels.sampling.count_below`, the same counts) which with ``overwrite=True``
    works in ``probs``' own memory (its values are lost)."""
    with torch.no_grad():
        if draws.source() is not None:  # the seam (reverie.models.draws): a replacement source draws
            return draws.source().categorical(probs, unimix)
        k = probs.shape[-1]
        u = torch.rand(probs.shape[:-1] + (1,), device=probs.device, dtype=torch.float32)  # (..., 1)
        cdf = probs.cumsum_(-1) if fast and overwrite else probs.cumsum(-1)  # (..., K); cdf[..., -1] ~ 1
        target = ((u - unimix) * (1.0 / (1.0 - unimix))).to(cdf.dtype)
        if fast:
            below = FastPaths.get("count_below")(cdf, target, True)  # (..., 1): classes with cdf < target
        else:
            below = torch.searchsorted(cdf, target)  # (..., 1): classes with cdf < target
        index = below.clamp_(max=k - 1).long()  # a target above the rounded cdf[..., -1] lands on class K-1
        if unimix > 0.0:
            index = torch.where(u < unimix, (u * (k / unimix)).long().clamp_(max=k - 1), index)
        return index.squeeze(-1)


def unimix_sample_index(logits: torch.Tensor, unimix: float = 0.01, fast: bool = False) -> torch.Tensor:
    """Class index ``(...)`` int64 of a sample of :class:`UnimixCategorical` ``(logits (..., K), unimix)``: the
    same draw :func:`unimix_sample` makes from the same random state, without the one-hot."""
    probs = torch.softmax(logits.detach(), -1, dtype=_at_least_float32(logits.dtype))
    return unimix_index(probs, unimix, fast, overwrite=True)


def unimix_sample(logits: torch.Tensor, unimix: float = 0.01, fast: bool = False) -> torch.Tensor:
    """Straight-through one-hot sample of :class:`UnimixCategorical` without building the distribution.

    ``logits (..., K)`` -> one-hot ``(..., K)`` (float32 at least) whose value is a sample and whose gradient is
    that of the unimix probabilities (Bengio et al. 2013; DreamerV3 section 3): ``one_hot + probs - sg(probs)``.
    Same law as ``UnimixCategorical(logits, unimix).rsample()``; the class is :func:`unimix_sample_index`'s draw.
    ``fast``: the draw's and the straight-through graph's kernels (:mod:`reverie.models.kernels.sampling`,
    :mod:`reverie.models.kernels.straight_through`; the same values and gradient).
    """
    dtype = _at_least_float32(logits.dtype)
    probs = torch.softmax(logits.detach(), -1, dtype=dtype)
    index = unimix_index(probs, unimix, fast)
    if not (logits.requires_grad and torch.is_grad_enabled()):
        return one_hot_index(index, logits.shape[-1], dtype)
    if fast:
        return FastPaths.get("straight_through")(logits, probs, index, unimix)
    mixed = unimix_probs(logits.to(dtype), unimix)  # (..., K), with the gradient
    return one_hot_index(index, logits.shape[-1], dtype) + (mixed - mixed.detach())


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs: distributions compute in float32 at least (16-bit logits under
    autocast are widened; the float64 tests stay float64)."""
    return torch.promote_types(dtype, torch.float32)


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
        super().__init__(logits=unimix_logits(float32_or_wider(logits), unimix), validate_args=False)

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
        mean = torch.tanh(float32_or_wider(mean_raw))
        std = (max_std - min_std) * torch.sigmoid(float32_or_wider(std_raw) + 2.0) + min_std
        super().__init__(td.Normal(mean, std), 1, validate_args=False)

    @property
    def mode(self) -> torch.Tensor:
        return self.base_dist.mean

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        if draws.source() is None:
            return super().sample(sample_shape)
        with torch.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """``mean + std * eps`` with the gradient of both; ``eps`` from torch's generator or the installed draw
        source (:mod:`reverie.models.draws`)."""
        if draws.source() is None:
            return super().rsample(sample_shape)
        mean, std = self.base_dist.loc, self.base_dist.scale
        if sample_shape:
            mean, std = (x.expand(torch.Size(sample_shape) + x.shape) for x in (mean, std))
        return mean + std * draws.normal_noise(mean, std)


class SymlogMSE(td.Distribution):
    """Vector decoder output: prediction in symlog space, ``log_prob(x) = -sum((pred - symlog(x))^2)``.

    DreamerV3 eq. 8 (symlog squared error). Args: ``pred`` ``(..., F)``. ``mode``/``mean``: ``symexp(pred)``.
    """

    arg_constraints: dict = {}

    def __init__(self, pred: torch.Tensor):
        self.pred = float32_or_wider(pred)
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
        super().__init__(logits=float32_or_wider(logits), validate_args=False)

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
        self.loc = float32_or_wider(mean)
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
        z = (value.to(self.loc.dtype) - self.loc) / self.scale
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

    ``image``: uint8 (or integer-valued) pixels ``(..., C, H, W)`` in ``[0, 255]`` -> float32 (float64 for float64
    input) pixel values ``v = (floor(x / 2^(8 - bits)) + u) * 2^(8 - bits) * 255 / 256`` in ``[0, 255)``, ``u ~
    U[0, 1)`` (``noise=True``, training) or ``u = 1/2`` (``noise=False``: the noise's mean; acting and evaluation).
    The image encoder and likelihood scale pixel values by ``v / 255 - 0.5``
    (:func:`reverie.models.conv.scale_image`), which makes that ``(floor(x / 2^(8 - bits)) + u) / 2^bits - 0.5``, the
    reference's ``tools/preprocess.py`` (bins of ``1 / 2^bits`` in ``[-0.5, 0.5)``). Feed the result to the image
    encoder and the image likelihood.

    Raises:
        ValueError: ``bits`` outside ``1..8``.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"reduce_bits: bits must be in 1..8 (image_bits), got {bits}")
    x = float32_or_wider(image)
    step = float(2 ** (8 - bits))
    x = torch.floor(x / step) + (torch.rand_like(x) if noise else 0.5)
    return x * (step * 255.0 / 256.0)
