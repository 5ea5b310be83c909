"""Returns, imagination weights and the return normaliser (pure functions; DreamerV3 section 4).

Layout (see :mod:`reverie.types`): ``reward[t]`` is received on arriving at state ``t``, ``cont[t] = 1 -
is_terminal[t]``, ``value[t]`` estimates the return from state ``t``. All inputs are time-first ``(T, ...)``.
"""

from __future__ import annotations

import torch
from torch import nn


def lambda_return(reward: torch.Tensor, value: torch.Tensor, cont: torch.Tensor, gamma: float, lam: float,
                  is_last: torch.Tensor | None = None) -> torch.Tensor:
    """TD(lambda) returns ``R_t`` for ``t = 0 .. T-2`` (DreamerV3 eq. 7; Sutton and Barto 12.1).

    Recursion, bootstrapped with ``R_{T-1} = value_{T-1}``::

        R_t = reward_{t+1} + gamma * cont_{t+1} * ((1 - lam_{t+1}) * value_{t+1} + lam_{t+1} * R_{t+1})

    where ``lam_{t+1} = 0`` if ``is_last_{t+1}`` (the episode ended there, e.g. at a time limit: bootstrap from
    its value and never look past it into the next episode). A row that is itself ``is_last`` gets
    ``R_t = cont_t * value_t``, so nothing of the following episode leaks into it.

    Args:
        reward, value, cont: ``(T, ...)`` float.
        gamma: discount (reference ``horizon: 333`` -> ``gamma = 1 - 1/333``). lam: lambda (0.95).
        is_last: optional ``(T, ...)`` bool; imagined trajectories have none (the continue head covers ends).

    Returns:
        ``(T-1, ...)`` returns.

    Raises:
        ValueError: if the shapes differ or ``T < 2``.
    """
    if not (reward.shape == value.shape == cont.shape) or reward.shape[0] < 2:
        raise ValueError(f"lambda_return: need equal shapes (T>=2, ...); got reward {tuple(reward.shape)}, "
                         f"value {tuple(value.shape)}, cont {tuple(cont.shape)}")
    lam_t = torch.full_like(value, lam)
    if is_last is not None:
        last = is_last.to(value.dtype)
        lam_t = lam_t * (1.0 - last)
    returns = [value[-1]]
    for t in range(reward.shape[0] - 2, -1, -1):
        nxt = reward[t + 1] + gamma * cont[t + 1] * ((1.0 - lam_t[t + 1]) * value[t + 1] + lam_t[t + 1] * returns[-1])
        if is_last is not None:
            nxt = torch.where(is_last[t], cont[t] * value[t], nxt)
        returns.append(nxt)
    return torch.stack(returns[1:][::-1])  # (T-1, ...)


def imagination_weights(cont: torch.Tensor, gamma: float) -> torch.Tensor:
    """Loss weights of imagined steps: ``w_t = prod_{i<=t} (gamma * cont_i) / gamma`` (reference ``agent.py``).

    ``cont (H+1, N)`` with ``cont[0] = 1 - is_terminal`` of the start state; returns ``(H+1, N)``, detached. A
    step after a predicted terminal gets weight ~0.
    """
    return (torch.cumprod(gamma * cont, 0) / gamma).detach()


class ReturnNormalizer(nn.Module):
    """Percentile return scale (DreamerV3 section 4, eq. 8): ``S = max(limit, EMA(P95) - EMA(P5))``.

    Args:
        decay: EMA decay of the percentiles (reference ``retnorm.decay: 0.99``).
        limit: floor of the scale (reference: 1, so small returns are not scaled up).
        low, high: percentiles (5 and 95).

    ``update(returns)`` folds the batch percentiles in; ``scale()`` gives ``S``. State lives in buffers, so it is
    saved with ``state_dict()``. The EMAs start at 0, as in the reference.
    """

    def __init__(self, decay: float = 0.99, limit: float = 1.0, low: float = 0.05, high: float = 0.95):
        super().__init__()
        self.decay, self.limit, self.low_q, self.high_q = decay, limit, low, high
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))

    @torch.no_grad()
    def next(self, returns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The percentile EMAs ``(low, high)`` after folding ``returns`` (any shape) in, not stored: the agent's
        guarded step stores them (:meth:`commit`) when it is taken, so a skipped step leaves the normaliser
        as it was."""
        low, high = self._quantiles(returns.detach().flatten().to(self.low.dtype))  # float32 (float64 in tests)
        return self.low * self.decay + (1.0 - self.decay) * low, self.high * self.decay + (1.0 - self.decay) * high

    def _quantiles(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``low`` and ``high`` percentiles of the flat returns ``x`` (``torch.quantile``, interpolated)."""
        quantiles = torch.quantile(x, torch.tensor([self.low_q, self.high_q], device=x.device, dtype=x.dtype))
        return quantiles[0], quantiles[1]

    @torch.no_grad()
    def commit(self, stats: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Store ``(low, high)`` from :meth:`next`."""
        self.low.copy_(stats[0])
        self.high.copy_(stats[1])

    def update(self, returns: torch.Tensor) -> None:
        """:meth:`next` and :meth:`commit` at once."""
        self.commit(self.next(returns))

    def scale(self, stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``S = max(limit, high - low)`` of ``stats`` (default: the stored EMAs)."""
        low, high = stats if stats is not None else (self.low, self.high)
        return torch.clamp(high - low, min=self.limit)
