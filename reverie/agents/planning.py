"""Cross-entropy-method planning in a learned latent space (PlaNet, Hafner et al. 2019, section 3 and algorithm 2).

A candidate ``a_0 .. a_{H-1}`` from ``s_0`` (states: dicts of ``(M, ...)`` tensors) scores, with ``c_{<=t}`` the
product of predicted continue probabilities (timing of :mod:`reverie.types`)::

    s_{t+1} = step(s_t, a_t);   return = sum_t gamma^t c_{<=t} r(s_{t+1}) + gamma^H c_{<=H} value(s_H)

:class:`GaussianCEM` plans ``Box`` actions, :class:`CategoricalCEM` ``Discrete`` ones; ``temperature`` gives MPPI
refits (TD-MPC, Hansen et al. 2022, section 3; range-normalised here, docs/planning.md) and ``policy_candidates``
adds rollouts of the model's policy."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from reverie.models.distributions import one_hot_index
from reverie.types import ActionSpec

State = dict[str, torch.Tensor]


class PlanningModel(Protocol):
    """What a planner needs from a model (leading batch dim ``M``): ``step(state, action (M, A))``, ``reward(state)
    (M,)`` received on arriving at ``state``, ``cont(state)`` and ``value(state)`` ``(M,)`` or None; optionally the
    attribute ``discount`` (default 1.0, the value's) and ``policy(state) -> (M, A)`` for ``policy_candidates``."""

    def step(self, state: State, action: torch.Tensor) -> State: ...

    def reward(self, state: State) -> torch.Tensor: ...

    def cont(self, state: State) -> torch.Tensor | None: ...

    def value(self, state: State) -> torch.Tensor | None: ...


class WorldModelPlanning:
    """:class:`PlanningModel` of a world model through the :class:`reverie.models.dynamics.Dynamics` protocol.
    ``value_fn``, ``policy_fn``: optional ``features (M, F) -> (M,)`` bootstrap and ``-> (M, A)`` proposals; ``sample``:
    sample the prior latents (as PlaNet); ``use_cont``: weight rewards by continue probabilities."""

    def __init__(self, wm: Any, value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None, sample: bool = True,
                 use_cont: bool = True, discount: float = 1.0,
                 policy_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.wm, self.value_fn, self.sample, self.use_cont = wm, value_fn, sample, use_cont
        self.discount, self.policy_fn = float(discount), policy_fn

    @classmethod
    def from_dreamer(cls, agent: Any, sample: bool = True) -> "WorldModelPlanning":
        """The planning model of a :class:`reverie.agents.DreamerV3`: its critic's mean as the value, ``agent.gamma``
        as :attr:`discount` (as the critic's lambda-returns), its actor's samples as proposals."""
        from reverie.models.distributions import TwoHotSymlog

        def policy(feat: torch.Tensor) -> torch.Tensor:
            action = agent.actor(feat).sample()
            return action if agent.spec.discrete else action.clamp(-1.0, 1.0)

        return cls(agent.wm, value_fn=lambda feat: TwoHotSymlog(agent.critic(feat)).mean, sample=sample,
                   discount=agent.gamma, policy_fn=policy)

    def step(self, state: State, action: torch.Tensor) -> State:
        return self.wm.dynamics.img_step(state, action, sample=self.sample)

    def reward(self, state: State) -> torch.Tensor:
        return self.wm.reward(self.wm.dynamics.features(state)).mean

    def cont(self, state: State) -> torch.Tensor | None:
        return self.wm.cont(self.wm.dynamics.features(state)).mean if self.use_cont else None

    def value(self, state: State) -> torch.Tensor | None:
        return None if self.value_fn is None else self.value_fn(self.wm.dynamics.features(state))

    def policy(self, state: State) -> torch.Tensor | None:
        return None if self.policy_fn is None else self.policy_fn(self.wm.dynamics.features(state))


def discount_of(model: PlanningModel, gamma: float | None = None) -> float:
    """``gamma`` when given, else the model's ``discount`` attribute (1.0 when it has none)."""
    return float(getattr(model, "discount", 1.0)) if gamma is None else float(gamma)


def score(model: PlanningModel, start: State, actions: torch.Tensor, gamma: float | None = None) -> torch.Tensor:
    """Predicted return ``(M,)`` of ``actions (H, M, A)`` from ``start (M, ...)`` (module docstring's formula)."""
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
    """``(N, ...)`` -> ``(N*k, ...)``: candidate ``c`` of env ``i`` at ``i*k + c``."""
    return {key: v.repeat_interleave(k, 0) for key, v in state.items()}


class _SequencePlanner:
    """What both planners share: sizes, the discount, the policy's proposals and the elite selection.
    Raises ValueError for a size below 1, ``top_k > candidates + policy_candidates`` or ``temperature <= 0``."""

    discrete: bool

    def __init__(self, horizon: int, candidates: int, top_k: int, iterations: int, gamma: float | None,
                 temperature: float | None, policy_candidates: int):
        name = type(self).__name__
        if min(horizon, candidates, top_k, iterations) < 1 or policy_candidates < 0 or \
                top_k > candidates + policy_candidates:
            raise ValueError(f"{name} needs horizon, candidates, top_k, iterations >= 1, policy_candidates >= 0 and "
                             f"top_k <= candidates + policy_candidates; got horizon={horizon} candidates={candidates} "
                             f"top_k={top_k} iterations={iterations} policy_candidates={policy_candidates}")
        if temperature is not None and not temperature > 0:
            raise ValueError(f"{name}: temperature must be > 0 (MPPI weights) or None (CEM), got {temperature}")
        self.horizon, self.candidates, self.top_k, self.iterations = horizon, candidates, top_k, iterations
        self.gamma, self.temperature, self.policy_candidates = gamma, temperature, int(policy_candidates)

    def _proposals(self, model: PlanningModel, start: State, n: int, dim: int) -> torch.Tensor | None:
        """``P`` sequences ``(N, P, H, A)`` from ``model.policy``; None if ``P = 0``; ValueError without one."""
        P, H = self.policy_candidates, self.horizon
        if P == 0:
            return None
        policy = getattr(model, "policy", None)
        state, actions = _repeat(start, P), []
        for _ in range(H):
            action = policy(state) if policy is not None else None
            if action is None:
                raise ValueError(f"policy_candidates={P} needs a planning model with a policy (e.g. "
                                 f"WorldModelPlanning.from_dreamer); set policy_candidates=0")
            actions.append(action.float())
            state = model.step(state, action)
        return torch.stack(actions).view(H, n, P, dim).permute(1, 2, 0, 3)  # (H, N*P, A) -> (N, P, H, A)

    def _elites(self, model: PlanningModel, starts: State, cand: torch.Tensor,
                gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``top_k`` best of ``cand (N, C, H, A)`` ``(N, K, H, A)`` and their refit weights ``(N, K)``."""
        n, C, H, A = cand.shape
        returns = score(model, starts, cand.permute(2, 0, 1, 3).reshape(H, n * C, A), gamma).view(n, C)
        # (N, C, H, A) -> (H, N, C, A) -> (H, N*C, A); returns (N*C,) -> (N, C)
        top = returns.topk(self.top_k, dim=1)  # values sorted, best first: (N, K)
        elites = cand.gather(1, top.indices[:, :, None, None].expand(n, self.top_k, H, A))  # (N, K, H, A)
        if self.temperature is None:
            return elites, torch.full_like(top.values, 1.0 / self.top_k)
        spread = (top.values[:, :1] - top.values[:, -1:]).clamp_min(1e-8)  # (N, 1): best minus worst elite
        return elites, torch.softmax((top.values - top.values[:, :1]) / (self.temperature * spread), 1)


class GaussianCEM(_SequencePlanner):
    """CEM over continuous action sequences in the box ``[low, high]`` (PlaNet algorithm 2): a diagonal normal over
    ``(H, A)`` from the box centre, std half its width (``planning.py:56-57``), refit to the (weighted) ``top_k`` with
    ``std = sqrt(var + 1e-6)`` (google-research/planet ``control/planning.py:52-53``). Defaults are PlaNet's;
    ``gamma`` None: :func:`discount_of`. Raises ValueError for bad sizes or bounds."""

    discrete = False

    def __init__(self, low: Any, high: Any, horizon: int = 12, candidates: int = 1000, top_k: int = 100,
                 iterations: int = 10, gamma: float | None = None, temperature: float | None = None,
                 policy_candidates: int = 0):
        super().__init__(horizon, candidates, top_k, iterations, gamma, temperature, policy_candidates)
        self.low = torch.as_tensor(low, dtype=torch.float32).reshape(-1)
        self.high = torch.as_tensor(high, dtype=torch.float32).reshape(-1)
        if self.low.shape != self.high.shape or bool((self.low > self.high).any()):
            raise ValueError(f"GaussianCEM: bounds must have one shape and low <= high; got {low} and {high}")

    def plan(self, model: PlanningModel, start: State) -> torch.Tensor:
        """Best first action ``(N, A)`` (the final mean, inside the box) for start states ``(N, ...)``."""
        return self.plan_sequence(model, start)[:, 0]

    @torch.no_grad()
    def plan_sequence(self, model: PlanningModel, start: State) -> torch.Tensor:
        """The final mean ``(N, H, A)``, inside the box, for start states ``(N, ...)``."""
        n, device, dtype = _batch_device_dtype(start)
        low, high = self.low.to(device, dtype), self.high.to(device, dtype)
        H, C, A, gamma = self.horizon, self.candidates, low.numel(), discount_of(model, self.gamma)
        mean = ((low + high) / 2).expand(n, H, A).clone()  # (N, H, A)
        std = ((high - low) / 2).expand(n, H, A).clone()
        proposals = self._proposals(model, start, n, A)  # (N, P, H, A) or None
        if proposals is not None:
            proposals = torch.maximum(torch.minimum(proposals, high), low)
        starts = _repeat(start, C + self.policy_candidates)  # (N*(C+P), ...)
        for _ in range(self.iterations):
            cand = mean[:, None] + std[:, None] * torch.randn(n, C, H, A, device=device, dtype=dtype)  # (N, C, H, A)
            cand = torch.maximum(torch.minimum(cand, high), low)
            if proposals is not None:
                cand = torch.cat([cand, proposals], 1)  # (N, C+P, H, A)
            elites, weights = self._elites(model, starts, cand, gamma)
            if self.temperature is None:
                mean, var = elites.mean(1), elites.var(1, unbiased=False)
            else:
                w = weights[:, :, None, None]  # (N, K) -> (N, K, 1, 1)
                mean = (w * elites).sum(1)
                var = (w * (elites - mean[:, None]) ** 2).sum(1)
            std = (var + _REFIT_VAR_EPS).sqrt()
        return torch.maximum(torch.minimum(mean, high), low)

    def act(self, model: PlanningModel, start: State, mode: str = "eval", noise: float = 0.3) -> torch.Tensor:
        """The plan ``(N, A)``, plus ``noise * N(0, 1)`` at ``"explore"`` (PlaNet 0.3), clipped into the box."""
        action = self.plan(model, start)
        if mode == "explore" and noise > 0:
            low, high = self.low.to(action.device, action.dtype), self.high.to(action.device, action.dtype)
            action = torch.maximum(torch.minimum(action + noise * torch.randn_like(action), high), low)
        return action


class CategoricalCEM(_SequencePlanner):
    """CEM over one-hot action sequences for ``Discrete(A)``: per-step categoricals from uniform, refit to the
    (weighted) action frequencies of the ``top_k``. Arguments as :class:`GaussianCEM`; ValueError for bad sizes."""

    discrete = True

    def __init__(self, num_actions: int, horizon: int = 12, candidates: int = 1000, top_k: int = 100,
                 iterations: int = 10, gamma: float | None = None, temperature: float | None = None,
                 policy_candidates: int = 0):
        super().__init__(horizon, candidates, top_k, iterations, gamma, temperature, policy_candidates)
        if num_actions < 1:
            raise ValueError(f"CategoricalCEM: num_actions must be >= 1, got {num_actions}")
        self.num_actions = int(num_actions)

    def plan(self, model: PlanningModel, start: State) -> torch.Tensor:
        """Probabilities of the first action ``(N, A)`` after the last refit, for start states ``(N, ...)``."""
        return self.plan_sequence(model, start)[:, 0]

    @torch.no_grad()
    def plan_sequence(self, model: PlanningModel, start: State) -> torch.Tensor:
        """Per-step action probabilities ``(N, H, A)`` after the last refit, for start states ``(N, ...)``."""
        n, device, dtype = _batch_device_dtype(start)
        H, C, A, gamma = self.horizon, self.candidates, self.num_actions, discount_of(model, self.gamma)
        probs = torch.full((n, H, A), 1.0 / A, device=device, dtype=dtype)
        proposals = self._proposals(model, start, n, A)  # (N, P, H, A) one-hot, or None
        starts = _repeat(start, C + self.policy_candidates)
        for _ in range(self.iterations):
            cdf = probs.cumsum(-1)[:, None]  # (N, 1, H, A)
            u = torch.rand(n, C, H, 1, device=device, dtype=dtype) * cdf[..., -1:]
            cand = one_hot_index((cdf < u).sum(-1).clamp_(max=A - 1), A, dtype)  # inverse CDF -> (N, C, H, A)
            if proposals is not None:
                cand = torch.cat([cand, proposals], 1)  # (N, C+P, H, A)
            elites, weights = self._elites(model, starts, cand, gamma)
            probs = elites.mean(1) if self.temperature is None else (weights[:, :, None, None] * elites).sum(1)
        return probs

    def act(self, model: PlanningModel, start: State, mode: str = "eval", noise: float = 0.0) -> torch.Tensor:
        """One-hot ``(N, A)``: the most frequent first action (``"eval"``), a draw (``"sample"``), or epsilon-greedy
        with ``noise`` (``"explore"``)."""
        probs = self.plan(model, start)
        if mode == "sample":
            index = torch.multinomial(probs, 1).squeeze(-1)
        else:
            index = probs.argmax(-1)
            if mode == "explore" and noise > 0:
                swap = torch.rand(index.shape, device=index.device) < noise
                index = torch.where(swap, torch.randint_like(index, self.num_actions), index)
        return one_hot_index(index, self.num_actions, probs.dtype)


def _batch_device_dtype(start: State) -> tuple[int, torch.device, torch.dtype]:
    """``(N, device, dtype)`` of start states ``(N, ...)``: the planners draw their candidates in the states'
    floating dtype (float32, or float64 for a float64 agent)."""
    first = next(iter(start.values()))
    dtype = next((v.dtype for v in start.values() if v.is_floating_point()), torch.float32)
    return first.shape[0], first.device, dtype


def make_planner(spec: ActionSpec, kind: str = "auto", low: Any = -1.0, high: Any = 1.0,
                 **kwargs: Any) -> GaussianCEM | CategoricalCEM:
    """The CEM for an action space: ``kind`` ``"auto"``, ``"gaussian"`` or ``"categorical"``, ``kwargs`` to the planner.
    Raises ValueError for a kind that does not fit the space or an unknown ``kind``."""
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
