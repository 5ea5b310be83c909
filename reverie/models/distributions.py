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


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * log(1 + |x|)`` (DreamerV3 eq. 9). Any shape."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`symlog`: ``sign(x) * (exp(|x|) - 1)`` (DreamerV3 eq. 9). Any shape."""
    return torch.sign(x) * torch.expm1(torch.abs(x))


def symlog_bins(num_bins: int = 255, low: float = -20.0, high: float = 20.0) -> torch.Tensor:
    """Bin centres ``(num_bins,)`` in symlog space (reference ``bins: 255`` over ``[-20, 20]``); for odd
    ``num_bins`` and ``low == -high``, ``bins[i] == -bins[-1 - i]`` bit for bit (uniform probabilities: mean 0)."""
    if num_bins % 2 == 1 and low == -high:
        half = torch.linspace(0.0, high, (num_bins + 1) // 2)
        return torch.cat([-half.flip(0)[:-1], half])
    return torch.linspace(low, high, num_bins)


_BINS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _default_bins(num_bins: int, device: torch.device, space: str = "symlog") -> torch.Tensor:
    """Cached read-only :func:`symlog_bins` ``(K,)`` float32 on ``device`` (``space="symexp"``: their symexp)."""
    key = (num_bins, device, space)
    if key not in _BINS:
        # an inference tensor in the cache would break every later backward
        with torch.inference_mode(False):
            bins = symlog_bins(num_bins)
            _BINS[key] = (symexp(bins) if space == "symexp" else bins).to(device)
    return _BINS[key]


_MEAN_CHUNK_ELEMENTS = 1 << 19  # logits per chunk of TwoHotSymlog.mean without autograd: 2,048 rows of 255 bins


class TwoHotSymlog(td.Distribution):
    """Categorical over fixed bins in symlog space, trained with two-hot targets (DreamerV3 eq. 10-11).

    ``logits`` ``(..., K)`` (any float dtype; computed in float32 at least); ``bins`` ``(K,)``, default
    :func:`symlog_bins`; ``probs``: the float32 ``softmax(logits)`` without autograd where the caller has it
    (reused by ``mean``).
    ``mean``/``mode`` ``(...)`` in symexp space, exactly 0 for all-zero logits (hence zero-initialised heads).
    ``log_prob(x)`` ``(...)``: cross-entropy of the two-hot encoding of ``symlog(x)``. ValueError: ``bins`` or
    ``probs`` not matching ``logits``.
    """

    arg_constraints: dict = {}
    has_rsample = False
    _space = "symlog"  # where the bins live and targets are two-hot encoded
    _squash = staticmethod(symlog)  # target value -> bin space
    _unsquash = staticmethod(symexp)  # expected bin -> value

    def __init__(self, logits: torch.Tensor, bins: torch.Tensor | None = None, probs: torch.Tensor | None = None):
        self.dtype = _at_least_float32(logits.dtype)
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
        """``log_softmax(logits)`` ``(..., K)``, computed once."""
        if self._logp is None:
            self._logp = F.log_softmax(self.logits, -1, dtype=self.dtype)
        return self._logp

    @property
    def probs(self) -> torch.Tensor:
        if self._given_probs is not None and not (self.logits.requires_grad and torch.is_grad_enabled()):
            return self._given_probs
        if self._logp is None:
            return torch.softmax(self.logits, -1, dtype=self.dtype)
        return self._logp.exp()

    @property
    def mean(self) -> torch.Tensor:
        k = self.logits.shape[-1]
        rows, chunk = self.logits.numel() // k, max(1, _MEAN_CHUNK_ELEMENTS // k)
        if rows > chunk and self._given_probs is None and self._logp is None and \
                not (self.logits.requires_grad and torch.is_grad_enabled()):
            # chunked so each chunk's float32 temporaries stay in cache (docs/changelog.md round 4)
            flat = self.logits.reshape(rows, k)
            out = torch.empty(rows, dtype=self.dtype, device=flat.device)
            for start in range(0, rows, chunk):
                out[start:start + chunk] = self._mean_of(torch.softmax(flat[start:start + chunk], -1,
                                                                       dtype=self.dtype))
            return out.view(self.logits.shape[:-1])
        return self._mean_of(self.probs)

    def _mean_of(self, probs: torch.Tensor) -> torch.Tensor:
        # autocast off: a bf16 product would round the expected bin (symlog(100) = 4.6 to 1/32, the value by ~1.5)
        with torch.autocast(probs.device.type, enabled=False):
            if self._symmetric:
                # pair the mirrored halves, so equal probabilities cancel exactly (mean 0 at 0 logits)
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
        """``sum_i scales[i] * log_prob(values[i])`` ``(...)`` in one pass over the bins."""
        index, weight = [], []
        for value, scale in zip(values, scales):
            below, above, w_below, w_above = two_hot_indices(self._squash(value.to(self.dtype)), self.bins)
            index += [below, above]
            weight += [scale * w_below, scale * w_above]
        index, weight = torch.stack(index, -1), torch.stack(weight, -1)  # (..., 2 * len(values))
        picked = self.log_probs.gather(-1, index)  # (..., 2 * len(values))
        # 0 * -inf would be NaN (a -inf logit next to a target exactly on a bin)
        return torch.where(weight != 0, picked * weight, picked.new_zeros(())).sum(-1)

    def entropy(self) -> torch.Tensor:
        logp = self.log_probs
        return -(logp.exp() * logp).sum(-1)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class TwoHotSymexp(TwoHotSymlog):
    """:class:`TwoHotSymlog` over bins ``symexp(symlog_bins(K))`` with two-hot targets of ``x`` itself and
    ``mean = sum(probs * bins)``: the current DreamerV3 reward and value heads (``embodied/jax/heads.py``
    ``symexp_twohot``, ``outs.py`` ``TwoHot``; danijar/dreamerv3 at e3f0224)."""

    _space = "symexp"
    _squash = staticmethod(_identity)  # values are encoded as they are
    _unsquash = staticmethod(_identity)


def two_hot_indices(x: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(below, above, w_below, w_above)``, each ``(...)``: the two-hot encoding of ``x`` ``(...)`` over sorted
    ``bins`` (values outside the range put all weight on the closest end bin)."""
    x = x.detach()
    k = bins.shape[-1]
    above = torch.searchsorted(bins, x.contiguous(), right=True).clamp(1, k - 1)  # index of first bin > x
    below = above - 1
    lo, hi = bins[below], bins[above]
    w_above = ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
    return below, above, 1.0 - w_above, w_above


def two_hot(x: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Two-hot encoding of ``x`` ``(...)`` over sorted ``bins`` ``(K,)`` -> ``(..., K)`` (DreamerV3 eq. 11)."""
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
    """One-hot sample ``(..., K)`` of categorical ``probs`` ``(..., K)``, in ``probs``' dtype."""
    return one_hot_index(unimix_index(probs, 0.0), probs.shape[-1], probs.dtype)


def unimix_index(probs: torch.Tensor, unimix: float) -> torch.Tensor:
    """Class index ``(...)`` int64 of one draw from ``(1 - unimix) * probs + unimix / K`` (``probs (..., K)``):
    one uniform ``u``; ``u < unimix`` picks a uniform class, otherwise the inverse CDF of ``probs``."""
    with torch.no_grad():
        if draws.source() is not None:
            return draws.source().categorical(probs, unimix)
        k = probs.shape[-1]
        u = torch.rand(probs.shape[:-1] + (1,), device=probs.device, dtype=torch.float32)  # (..., 1)
        cdf = probs.cumsum(-1)  # (..., K); cdf[..., -1] ~ 1
        target = ((u - unimix) * (1.0 / (1.0 - unimix))).to(cdf.dtype)
        below = torch.searchsorted(cdf, target)  # (..., 1): classes with cdf < target
        index = below.clamp_(max=k - 1).long()  # a target above the rounded cdf[..., -1] lands on class K-1
        if unimix > 0.0:
            index = torch.where(u < unimix, (u * (k / unimix)).long().clamp_(max=k - 1), index)
        return index.squeeze(-1)


def unimix_sample(logits: torch.Tensor, unimix: float = 0.01) -> torch.Tensor:
    """Straight-through one-hot sample ``(..., K)`` of ``UnimixCategorical(logits (..., K), unimix)``:
    ``one_hot + probs - sg(probs)`` (Bengio et al. 2013; DreamerV3 section 3)."""
    dtype = _at_least_float32(logits.dtype)
    probs = torch.softmax(logits.detach(), -1, dtype=dtype)
    index = unimix_index(probs, unimix)
    if not (logits.requires_grad and torch.is_grad_enabled()):
        return one_hot_index(index, logits.shape[-1], dtype)
    mixed = unimix_probs(logits.to(dtype), unimix)  # (..., K), with the gradient
    return one_hot_index(index, logits.shape[-1], dtype) + (mixed - mixed.detach())


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class UnimixCategorical(td.OneHotCategorical):
    """One-hot categorical over ``logits`` ``(..., K)`` with ``probs = (1 - unimix) * softmax(logits) + unimix / K``
    (DreamerV3 section 4, reference ``unimix: 0.01``); ``rsample`` is straight-through (Bengio et al. 2013)."""

    has_rsample = True

    def __init__(self, logits: torch.Tensor, unimix: float = 0.01):
        super().__init__(logits=unimix_logits(float32_or_wider(logits), unimix), validate_args=False)

    @property
    def mode(self) -> torch.Tensor:
        return one_hot_index(self.logits.argmax(-1), self.logits.shape[-1], self.logits.dtype)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        """One-hot sample ``(*sample_shape, ..., K)``."""
        return one_hot_sample(self.probs.expand(torch.Size(sample_shape) + self.probs.shape))

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        sample = self.sample(sample_shape)
        probs = self.probs.expand(sample.shape)
        return sample + (probs - probs.detach())  # exactly one-hot in value, gradient of probs


class BoundedNormal(td.Independent):
    """Diagonal normal, event ``(A,)``, from ``mean_raw, std_raw`` ``(..., A)``: ``mean = tanh(mean_raw)``,
    ``std = (max_std - min_std) * sigmoid(std_raw + 2) + min_std`` (DreamerV3 2023 ``actor.dist: normal``,
    ``minstd 0.1``, ``maxstd 1.0``). Samples are unbounded; the env layer clips actions to ``[-1, 1]``."""

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
        """``mean + std * eps``; ``eps`` from torch or the installed draw source (:mod:`reverie.models.draws`)."""
        if draws.source() is None:
            return super().rsample(sample_shape)
        mean, std = self.base_dist.loc, self.base_dist.scale
        if sample_shape:
            mean, std = (x.expand(torch.Size(sample_shape) + x.shape) for x in (mean, std))
        return mean + std * draws.normal_noise(mean, std)


class SymlogMSE(td.Distribution):
    """``pred`` ``(..., F)`` in symlog space: ``log_prob(x) = -sum((pred - symlog(x))^2)`` (DreamerV3 eq. 8)."""

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
    """Normal ``N(mean, std)`` with ``mean`` ``(..., *event)``, fixed ``std`` and ``log_prob`` summed over the last
    ``event_dims`` dims (PlaNet section 3; reference ``models``: ``tfd.Normal(mean, 1.0)``). ValueError: ``std <= 0``.
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
    """Image likelihood (PlaNet, ``decoder_std``): ``log_prob(x (..., C, H, W))`` ``(...)`` sums
    ``log N(scale_image(x); pred, std)`` over ``(C, H, W)``, ``x`` in ``[0, 256)``. ValueError: ``std <= 0``."""

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
    """Bit-depth reduction with dequantisation noise (PlaNet ``tools/preprocess.py``: 5 bits, uniform noise).

    ``image`` ``(..., C, H, W)`` in ``[0, 255]`` -> float32 ``(floor(x / 2^(8 - bits)) + u) * 2^(8 - bits) * 255 /
    256`` in ``[0, 255)``, ``u ~ U[0, 1)`` (``noise=True``) or ``1/2``; after ``scale_image`` that is the reference's
    ``(floor(x / 2^(8 - bits)) + u) / 2^bits - 0.5``. ValueError: ``bits`` outside ``1..8``.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"reduce_bits: bits must be in 1..8 (image_bits), got {bits}")
    x = float32_or_wider(image)
    step = float(2 ** (8 - bits))
    x = torch.floor(x / step) + (torch.rand_like(x) if noise else 0.5)
    return x * (step * 255.0 / 256.0)
