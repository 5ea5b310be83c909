"""Cross-entropy-method planning in a learned latent space (PlaNet, Hafner et al. 2019, section 3 and algorithm 2).

The planner only needs a :class:`PlanningModel`: ``step(state, action)``, ``reward(state)`` and optionally
``cont(state)`` and ``value(state)``. :class:`WorldModelPlanning` adapts a world model (with any dynamics model, e.g.
PlaNet's Gaussian RSSM or DreamerV3's categorical one, optionally with DreamerV3's critic as a value bootstrap);
tests use toy models. States are dicts of tensors with a leading batch dim ``M``.

Scoring a candidate action sequence ``a_0 .. a_{H-1}`` from state ``s_0`` (timing of :mod:`reverie.types`: the
reward head at ``s_{t+1}`` predicts the reward received on arriving there)::

    s_{t+1} = step(s_t, a_t);   return = sum_t gamma^t c_{<=t} r(s_{t+1}) + gamma^H c_{<=H} value(s_H)

where ``c_{<=t}`` is the product of predicted continue probabilities up to ``s_{t+1}`` (1 without a
continue head) and the value term is left out without a critic. ``gamma`` is the planner's ``gamma`` when given,
else the model's ``discount``: the critic's discount for :meth:`WorldModelPlanning.from_dreamer` (a value
trained at gamma 0.997 bootstraps a return discounted at 0.997), 1 otherwise (PlaNet's plain sum).

Two planners share this: :class:`GaussianCEM` for ``Box`` actions (PlaNet: horizon 12, 1000 candidates, top 100,
10 iterations; candidates clipped into the bounds) and :class:`CategoricalCEM` for ``Discrete`` actions
(one-hot sequences sampled from per-step categoricals, refit to the elites' frequencies).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from reverie.models.distributions import one_hot_index
from reverie.types import ActionSpec

State = dict[str, torch.Tensor]


class PlanningModel(Protocol):
    """What a planner needs from a model. All tensors have a leading batch dim ``M``.

    - ``step(state, action (M, A)) -> state``: one open-loop (prior) step.
    - ``reward(state) -> (M,)``: predicted reward received on arriving at ``state``.
    - ``cont(state) -> (M,) or None``: probability that the episode continues after ``state``.
    - ``value(state) -> (M,) or None``: value bootstrap at the last planned state.
    - ``discount`` (optional attribute, 1.0 when absent): the discount the planners use when not given one, the
      one the value was trained with.
    """

    def step(self, state: State, action: torch.Tensor) -> State: ...

    def reward(self, state: State) -> torch.Tensor: ...

    def cont(self, state: State) -> torch.Tensor | None: ...

    def value(self, state: State) -> torch.Tensor | None: ...


class WorldModelPlanning:
    """:class:`PlanningModel` of a :class:`reverie.models.world_model.WorldModel` (any dynamics).

    Args:
        wm: the world model; its ``dynamics.img_step``, ``dynamics.features``, ``reward(feat).mean`` and
            ``cont(feat).mean`` are used.
        value_fn: optional ``features (M, F) -> (M,)`` value bootstrap (e.g. DreamerV3's critic mean).
        sample: sample the latents of the open-loop prior (PlaNet's planner does) instead of taking their mode.
        use_cont: weight rewards by the predicted continue probabilities.
        discount: the discount planners use with these model unless given their own (1.0: a plain sum).
    """

    def __init__(self, wm: Any, value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None, sample: bool = True,
                 use_cont: bool = True, discount: float = 1.0):
        self.wm, self.value_fn, self.sample, self.use_cont = wm, value_fn, sample, use_cont
        self.discount = float(discount)

    @classmethod
    def from_dreamer(cls, agent: Any, sample: bool = True) -> "WorldModelPlanning":
        """PlanningModel of a :class:`reverie.agents.DreamerV3` with its critic's mean as the value bootstrap and the
        critic's discount ``agent.gamma`` (``1 - 1/333``) as :attr:`discount`, so planned rewards and the bootstrap
        are discounted as the critic's lambda-returns are."""
        from reverie.models.distributions import TwoHotSymlog

        return cls(agent.wm, value_fn=lambda feat: TwoHotSymlog(agent.critic(feat)).mean, sample=sample,
                   discount=agent.gamma)

    def step(self, state: State, action: torch.Tensor) -> State:
        return self.wm.dynamics.img_step(state, action, sample=self.sample)

    def reward(self, state: State) -> torch.Tensor:
        return self.wm.reward(self.wm.dynamics.features(state)).mean

    def cont(self, state: State) -> torch.Tensor | None:
        return self.wm.cont(self.wm.dynamics.features(state)).mean if self.use_cont else None

    def value(self, state: State) -> torch.Tensor | None:
        return None if self.value_fn is None else self.value_fn(self.wm.dynamics.features(state))


def discount_of(model: PlanningModel, gamma: float | None = None) -> float:
    """``gamma`` when given, else the model's ``discount`` attribute (1.0 when it has none)."""
    return float(getattr(model, "discount", 1.0)) if gamma is None else float(gamma)


def score(model: PlanningModel, start: State, actions: torch.Tensor, gamma: float | None = None) -> torch.Tensor:
    """Predicted return of action sequences ``actions (H, M, A)`` from ``start`` ``(M, ...)`` -> ``(M,)``.

    ``sum_t gamma^t c_{<=t} r(s_{t+1})`` plus ``gamma^H c_{<=H} value(s_H)`` when the model has a value;
    ``gamma`` None: :func:`discount_of` the model.
    """
    gamma = discount_of(model, gamma)
    state, total, weight = start, 0.0, 1.0
    for t in range(actions.shape[0]):
        state = model.step(state, actions[t])
        total = total + weight * model.reward(state).float()  # reward on arriving at s_{t+1}
        cont = model.cont(state)
        weight = weight * gamma * (1.0 if cont is None else cont.float())  # no reward after a predicted end
    value = model.value(state)
    return total + weight * value.float() if value is not None else total


_REFIT_VAR_EPS = 1e-6  # added to the elites' variance before the square root (reference planning.py:53)


def _repeat(state: State, k: int) -> State:
    """``(N, ...)`` -> ``(N*k, ...)``: each start state ``k`` times in a row (candidate ``c`` of env ``i`` at
    ``i*k + c``)."""
    return {key: v.repeat_interleave(k, 0) for key, v in state.items()}


def _check(horizon: int, candidates: int, top_k: int, iterations: int) -> None:
    if min(horizon, candidates, top_k, iterations) < 1 or top_k > candidates:
        raise ValueError(f"CEM needs horizon, candidates, top_k, iterations >= 1 and top_k <= candidates; got "
                         f"horizon={horizon} candidates={candidates} top_k={top_k} iterations={iterations}")


class GaussianCEM:
    """CEM over continuous action sequences inside the box ``[low, high]`` (PlaNet algorithm 2).

    Per env: a diagonal normal over ``(H, A)`` starts at the box centre with std half the box width; each
    iteration samples ``candidates`` sequences, clips them into the box, scores them (:func:`score`) and refits
    mean and std to the ``top_k`` best: ``std = sqrt(var + 1e-6)`` with the population variance (google-research/planet
    ``control/planning.py:52-53``: ``tf.nn.moments``; a single elite gives std 1e-3, never NaN). The start is the box
    centre with std half its width: mean 0, std 1 in ``[-1, 1]``, as ``planning.py:56-57``.

    Args:
        low, high: ``(A,)`` action bounds (the agent acts in ``[-1, 1]``). horizon: ``H`` (12). candidates:
        1000. top_k: 100. iterations: 10. gamma: discount of the planned rewards; None (default): the model'
        ``discount`` (:func:`discount_of`: 1, PlaNet's plain sum, or the critic's with
        :meth:`WorldModelPlanning.from_dreamer`).

    Raises:
        ValueError: bad sizes, or bounds with ``low > high`` or of different shapes.
    """

    discrete = False

    def __init__(self, low: Any, high: Any, horizon: int = 12, candidates: int = 1000, top_k: int = 100,
                 iterations: int = 10, gamma: float | None = None):
        _check(horizon, candidates, top_k, iterations)
        self.low = torch.as_tensor(low, dtype=torch.float32).reshape(-1)
        self.high = torch.as_tensor(high, dtype=torch.float32).reshape(-1)
        if self.low.shape != self.high.shape or bool((self.low > self.high).any()):
            raise ValueError(f"GaussianCEM: bounds must have one shape and low <= high; got {low} and {high}")
        self.horizon, self.candidates, self.top_k, self.iterations, self.gamma = horizon, candidates, top_k, iterations, gamma

    @torch.no_grad()
    def plan(self, model: PlanningModel, start: State) -> torch.Tensor:
        """Best first action ``(N, A)`` (the final mean, inside the box) for start states ``(N, ...)``."""
        n = next(iter(start.values())).shape[0]
        device = next(iter(start.values())).device
        low, high = self.low.to(device), self.high.to(device)
        H, C, K, A = self.horizon, self.candidates, self.top_k, low.numel()
        mean = ((low + high) / 2).expand(n, H, A).clone()  # (N, H, A)
        std = ((high - low) / 2).expand(n, H, A).clone()
        starts = _repeat(start, C)  # (N*C, ...)
        for _ in range(self.iterations):
            cand = mean[:, None] + std[:, None] * torch.randn(n, C, H, A, device=device)  # (N, C, H, A)
            cand = torch.maximum(torch.minimum(cand, high), low)
            returns = score(model, starts, cand.permute(2, 0, 1, 3).reshape(H, n * C, A), self.gamma)
            # (N, C, H, A) -> (H, N, C, A) -> (H, N*C, A); returns (N*C,) -> (N, C)
            elite = returns.view(n, C).topk(K, dim=1).indices  # (N, K)
            elites = cand.gather(1, elite[:, :, None, None].expand(n, K, H, A))  # (N, K, H, A)
            mean, std = elites.mean(1), (elites.var(1, unbiased=False) + _REFIT_VAR_EPS).sqrt()
        return torch.maximum(torch.minimum(mean[:, 0], high), low)

    def act(self, model: PlanningModel, start: State, mode: str = "eval", noise: float = 0.3) -> torch.Tensor:
        """Action to execute ``(N, A)``: the plan, plus ``noise * N(0, 1)`` at ``mode="explore"`` (PlaNet action
        noise 0.3), clipped back into the box; no noise at ``"eval"``/``"sample"``."""
        action = self.plan(model, start)
        if mode == "explore" and noise > 0:
            low, high = self.low.to(action.device), self.high.to(action.device)
            action = torch.maximum(torch.minimum(action + noise * torch.randn_like(action), high), low)
        return action


class CategoricalCEM:
    """CEM over sequences of one-hot actions for ``Discrete(A)`` spaces.

    Per env: independent categoricals over ``A`` at each of ``H`` steps start uniform; each iteration samples
    ``candidates`` one-hot sequences, scores them (:func:`score`) and sets the probabilities to the action
    frequencies among the ``top_k`` best (a single elite gives a one-hot distribution, no NaN).

    Args:
        num_actions: ``A``. horizon, candidates, top_k, iterations, gamma: as :class:`GaussianCEM`.

    Raises:
        ValueError: bad sizes or ``num_actions < 1``.
    """

    discrete = True

    def __init__(self, num_actions: int, horizon: int = 12, candidates: int = 1000, top_k: int = 100,
                 iterations: int = 10, gamma: float | None = None):
        _check(horizon, candidates, top_k, iterations)
        if num_actions < 1:
            raise ValueError(f"CategoricalCEM: num_actions must be >= 1, got {num_actions}")
        self.num_actions = int(num_actions)
        self.horizon, self.candidates, self.top_k, self.iterations, self.gamma = horizon, candidates, top_k, iterations, gamma

    @torch.no_grad()
    def plan(self, model: PlanningModel, start: State) -> torch.Tensor:
        """Probabilities of the first action ``(N, A)`` after the last refit, for start states ``(N, ...)``."""
        n = next(iter(start.values())).shape[0]
        device = next(iter(start.values())).device
        H, C, K, A = self.horizon, self.candidates, self.top_k, self.num_actions
        probs = torch.full((n, H, A), 1.0 / A, device=device)
        starts = _repeat(start, C)
        for _ in range(self.iterations):
            cdf = probs.cumsum(-1)[:, None]  # (N, 1, H, A)
            u = torch.rand(n, C, H, 1, device=device) * cdf[..., -1:]
            cand = one_hot_index((cdf < u).sum(-1).clamp_(max=A - 1), A)  # inverse CDF -> (N, C, H, A) one-hot
            returns = score(model, starts, cand.permute(2, 0, 1, 3).reshape(H, n * C, A), self.gamma)
            elite = returns.view(n, C).topk(K, dim=1).indices  # (N, K)
            probs = cand.gather(1, elite[:, :, None, None].expand(n, K, H, A)).mean(1)  # (N, H, A)
        return probs[:, 0]

    def act(self, model: PlanningModel, start: State, mode: str = "eval", noise: float = 0.0) -> torch.Tensor:
        """One-hot action ``(N, A)``: the most frequent elite first action (``"eval"``), a draw from the elite
        frequencies (``"sample"``), or at ``"explore"`` the argmax replaced by a uniform action with
        probability ``noise`` (epsilon-greedy)."""
        probs = self.plan(model, start)
        if mode == "sample":
            index = torch.multinomial(probs, 1).squeeze(-1)
        else:
            index = probs.argmax(-1)
            if mode == "explore" and noise > 0:
                swap = torch.rand(index.shape, device=index.device) < noise
                index = torch.where(swap, torch.randint_like(index, self.num_actions), index)
        return one_hot_index(index, self.num_actions)


def make_planner(spec: ActionSpec, kind: str = "auto", low: Any = -1.0, high: Any = 1.0,
                 **kwargs: Any) -> GaussianCEM | CategoricalCEM:
    """The CEM for an action space: ``kind`` ``"auto"`` (categorical for Discrete, Gaussian for Box),
    ``"gaussian"`` or ``"categorical"``; ``low``/``high`` scalars or ``(A,)`` for the Gaussian one; ``kwargs``
    go to the planner (horizon, candidates, top_k, iterations, gamma).

    Raises:
        ValueError: ``kind="gaussian"`` for a Discrete space (no box to sample in), ``kind="categorical"`` for
            a Box space, or an unknown ``kind``.
    """
    if kind not in ("auto", "gaussian", "categorical"):
        raise ValueError(f"planner must be 'auto', 'gaussian' or 'categorical', got {kind!r}")
    if kind == "gaussian" and spec.discrete:
        raise ValueError(f"the Gaussian CEM plans continuous actions in a box, but this env has Discrete({spec.dim}) "
                         f"actions; use planner=categorical (or auto)")
    if kind == "categorical" and not spec.discrete:
        raise ValueError(f"the categorical CEM plans Discrete actions, but this env has a Box of {spec.dim} "
                         f"dims; use planner=gaussian (or auto)")
    if spec.discrete:
        return CategoricalCEM(spec.dim, **kwargs)
    bounds = [torch.broadcast_to(torch.as_tensor(b, dtype=torch.float32), (spec.dim,)) for b in (low, high)]
    return GaussianCEM(*bounds, **kwargs)
