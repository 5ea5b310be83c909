"""Returns, imagination weights and the return normaliser (pure functions; DreamerV3 section 4). Inputs are
time-first ``(T, ...)``: ``reward[t]`` received on arriving at state ``t``, ``cont[t] = 1 - is_terminal[t]``."""

from __future__ import annotations

import torch
from torch import nn


def lambda_return(reward: torch.Tensor, value: torch.Tensor, cont: torch.Tensor, gamma: float, lam: float,
                  is_last: torch.Tensor | None = None) -> torch.Tensor:
    """TD(lambda) returns ``(T-1, ...)`` of ``(T, ...)`` inputs (DreamerV3 eq. 7; Sutton and Barto 12.1): ``R_{T-1} =
    value_{T-1}``, ``R_t = reward_{t+1} + gamma cont_{t+1} ((1 - lam_{t+1}) value_{t+1} + lam_{t+1} R_{t+1})`` with
    ``lam_{t+1} = 0`` where ``is_last_{t+1}``, and ``R_t = cont_t value_t`` on ``is_last`` rows (nothing of the next
    episode leaks in). Raises ValueError for unequal shapes or ``T < 2``."""
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
    """Detached loss weights ``w_t = prod_{i<=t} (gamma cont_i) / gamma`` ``(H+1, N)`` of ``cont (H+1, N)``,
    whose row 0 is the start state's ``1 - is_terminal`` (reference ``agent.py``)."""
    return (torch.cumprod(gamma * cont, 0) / gamma).detach()


class ReturnNormalizer(nn.Module):
    """Percentile return scale (DreamerV3 section 4, eq. 8): ``S = max(limit, EMA(P95) - EMA(P5))``; the EMAs
    (reference ``retnorm.decay: 0.99``) start at 0 and live in buffers."""

    def __init__(self, decay: float = 0.99, limit: float = 1.0, low: float = 0.05, high: float = 0.95):
        super().__init__()
        self.decay, self.limit, self.low_q, self.high_q = decay, limit, low, high
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))

    @torch.no_grad()
    def next(self, returns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The EMAs ``(low, high)`` after folding ``returns`` in, not stored (:meth:`commit` stores them once the
        guarded step is taken)."""
        low, high = self._quantiles(returns.detach().flatten().to(self.low.dtype))  # float32 (float64 in tests)
        return self.low * self.decay + (1.0 - self.decay) * low, self.high * self.decay + (1.0 - self.decay) * high

    def _quantiles(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
