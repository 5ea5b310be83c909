"""Cross-entropy-method planning in a learned latent space (PlaNet, Hafner et al. 2019, section 3 and algorithm 2).

The planner only needs a :class:`PlanningModel`: ``step(state, action)``, ``reward(state)`` and optionally
``cont(state)``, ``value(state)`` and ``policy(state)``. :class:`WorldModelPlanning` adapts a world model with any
dynamics model (e.g. PlaNet's Gaussian RSSM or DreamerV3's categorical one), optionally with DreamerV3's critic as
a value bootstrap and its actor as the proposal policy; tests use toy models.
States are dicts of tensors with a leading batch dim ``M``.

Scoring a candidate action sequence ``a_0 .. a_{H-1}`` from state ``s_0`` (timing of :mod:`reverie.types`: the
reward head at ``s_{t+1}`` predicts the reward received on arriving there)::

    s_{t+1} = step(s_t, a_t);   return = sum_t gamma^t c_{<=t} r(s_{t+1}) + gamma^H c_{<=H} value(s_H)

where ``c_{<=t}`` is the product of predicted continue probabilities up to ``s_{t+1}`` (1 without a
continue head) and the value term is left out without a critic. ``gamma`` is the planner's ``gamma`` when given,
else the model's ``discount``: the critic's discount for :meth:`WorldModelPlanning.from_dreamer` (a value
trained at gamma 0.997 bootstraps a return discounted at 0.997), 1 otherwise (PlaNet's plain sum).

Two planners share this: :class:`GaussianCEM` for ``Box`` actions (PlaNet: horizon 12, 1000 candidates, top 100,
10 iterations; candidates clipped into the bounds) and :class:`CategoricalCEM` for ``Discrete`` actions
(one-hot sequences sampled from per-step categoricals, refit to the elites' frequencies). Both take two options:

- ``temperature``: MPPI-style refits as TD-MPC's planner (Hansen et al. 2022, section 3; its weights are
  ``exp(temperature * (R - max R))`` on raw returns): here the elites are weighted by
  ``exp((R - max R) / (temperature * (max R - min R)))`` instead of equally (CEM), so the refit leans to the
  best elites; the range normalisation makes it free of the reward scale (the worst elite weighs
  ``exp(-1 / temperature)`` of the best).
- ``policy_candidates``: ``P`` extra candidates per iteration rolled out by the model's own ``policy`` (e.g.
  DreamerV3's actor, TD-MPC's ``num_pi_trajs``): sampled once per plan, scored with the others every iteration.
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
    - ``policy(state) -> (M, A) or None`` (optional): proposals for the planners' ``policy_candidates``.
    """

    def step(self, state: State, action: torch.Tensor) -> State: ...

    def reward(self, state: State) -> torch.Tensor: ...

    def cont(self, state: State) -> torch.Tensor | None: ...

    def value(self, state: State) -> torch.Tensor | None: ...


class WorldModelPlanning:
    """:class:`PlanningModel` of a :class:`reverie.models.world_model.WorldModel` (any dynamics: it uses only the
    :class:`reverie.models.dynamics.Dynamics` protocol).

    Args:
        wm: the world model; its ``dynamics.img_step``, ``dynamics.features``, ``reward(feat).mean`` and
            ``cont(feat).mean`` are used.
        value_fn: optional ``features (M, F) -> (M,)`` value bootstrap (e.g. DreamerV3's critic mean); it gets
            what ``dynamics.features`` returns, which every reverie head accepts.
        sample: sample the latents of the open-loop prior (PlaNet's planner does) instead of taking their mode.
        use_cont: weight rewards by the predicted continue probabilities.
        discount: the discount planners use with this model unless given their own (1.0: a plain sum).
        policy_fn: optional ``features (M, F) -> action (M, A)`` proposals (``policy_candidates``), given as
            ``value_fn``.
    """

    def __init__(self, wm: Any, value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None, sample: bool = True,
                 use_cont: bool = True, discount: float = 1.0,
                 policy_fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.wm, self.value_fn, self.sample, self.use_cont = wm, value_fn, sample, use_cont
        self.discount, self.policy_fn = float(discount), policy_fn

    @classmethod
    def from_dreamer(cls, agent: Any, sample: bool = True) -> "WorldModelPlanning":
        """The planning model of a :class:`reverie.agents.DreamerV3` with its critic's mean as the value bootstrap, the
        critic's discount ``agent.gamma`` (``1 - 1/333``) as :attr:`discount`, so planned rewards and the bootstrap
        are discounted as the critic's lambda-returns are, and its actor's samples as proposals."""
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


class _SequencePlanner:
    """What both planners share: sizes, the discount, the policy's proposals and the elite selection.

    Raises:
        ValueError: a size below 1 (``policy_candidates`` below 0), ``top_k > candidates + policy_candidates``
            or a ``temperature <= 0``.
    """

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
        """``P = policy_candidates`` action sequences ``(N, P, H, A)`` rolled out by ``model.policy`` from each
        start state (None when ``P = 0``).

        Raises:
            ValueError: ``P > 0`` but the model has no policy.
        """
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
        """Score candidates ``(N, C, H, A)`` from ``starts`` ``(N*C, ...)``; returns the ``top_k`` best
        ``(N, K, H, A)`` and their refit weights ``(N, K)`` (equal for CEM, MPPI's with a temperature)."""
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
    """CEM over continuous action sequences inside the box ``[low, high]`` (PlaNet algorithm 2).

    Per env: a diagonal normal over ``(H, A)`` starts at the box centre with std half the box width; each
    iteration samples ``candidates`` sequences, clips them into the box, scores them (:func:`score`) and refits
    mean and std to the ``top_k`` best, weighted equally (CEM) or by MPPI's weights (``temperature``):
    ``std = sqrt(var + 1e-6)`` with the (weighted) population variance (google-research/planet
    ``control/planning.py:52-53``: ``tf.nn.moments``; a single elite gives std 1e-3, never NaN). The start is the box
    centre with std half its width: mean 0, std 1 in ``[-1, 1]``, as ``planning.py:56-57``.

    Args:
        low, high: ``(A,)`` action bounds (the agent acts in ``[-1, 1]``). horizon: ``H`` (12). candidates:
        1000. top_k: 100. iterations: 10. gamma: discount of the planned rewards; None (default): the model's
        ``discount`` (:func:`discount_of`: 1, PlaNet's plain sum, or the critic's with
        :meth:`WorldModelPlanning.from_dreamer`). temperature: None (CEM) or the MPPI temperature (module
        docstring). policy_candidates: proposals of the model's policy among the candidates (0).

    Raises:
        ValueError: bad sizes, or bounds with ``low > high`` or of different shapes.
    """

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
        """The final mean ``(N, H, A)`` (inside the box): the planned sequence, for start states ``(N, ...)``."""
        n = next(iter(start.values())).shape[0]
        device = next(iter(start.values())).device
        low, high = self.low.to(device), self.high.to(device)
        H, C, A, gamma = self.horizon, self.candidates, low.numel(), discount_of(model, self.gamma)
        mean = ((low + high) / 2).expand(n, H, A).clone()  # (N, H, A)
        std = ((high - low) / 2).expand(n, H, A).clone()
        proposals = self._proposals(model, start, n, A)  # (N, P, H, A) or None
        if proposals is not None:
            proposals = torch.maximum(torch.minimum(proposals, high), low)
        starts = _repeat(start, C + self.policy_candidates)  # (N*(C+P), ...)
        for _ in range(self.iterations):
            cand = mean[:, None] + std[:, None] * torch.randn(n, C, H, A, device=device)  # (N, C, H, A)
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
        """Action to execute ``(N, A)``: the plan, plus ``noise * N(0, 1)`` at ``mode="explore"`` (PlaNet action
        noise 0.3), clipped back into the box; no noise at ``"eval"``/``"sample"``."""
        action = self.plan(model, start)
        if mode == "explore" and noise > 0:
            low, high = self.low.to(action.device), self.high.to(action.device)
            action = torch.maximum(torch.minimum(action + noise * torch.randn_like(action), high), low)
        return action


class CategoricalCEM(_SequencePlanner):
    """CEM over sequences of one-hot actions for ``Discrete(A)`` spaces.

    Per env: independent categoricals over ``A`` at each of ``H`` steps start uniform; each iteration samples
    ``candidates`` one-hot sequences, scores them (:func:`score`) and sets the probabilities to the action
    frequencies among the ``top_k`` best, counted equally (CEM) or with MPPI's weights (``temperature``); a
    single elite gives a one-hot distribution, no NaN.

    Args:
        num_actions: ``A``. horizon, candidates, top_k, iterations, gamma, temperature, policy_candidates: as
        :class:`GaussianCEM`.

    Raises:
        ValueError: bad sizes or ``num_actions < 1``.
    """

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
        n = next(iter(start.values())).shape[0]
        device = next(iter(start.values())).device
        H, C, A, gamma = self.horizon, self.candidates, self.num_actions, discount_of(model, self.gamma)
        probs = torch.full((n, H, A), 1.0 / A, device=device)
        proposals = self._proposals(model, start, n, A)  # (N, P, H, A) one-hot, or None
        starts = _repeat(start, C + self.policy_candidates)
        for _ in range(self.iterations):
            cdf = probs.cumsum(-1)[:, None]  # (N, 1, H, A)
            u = torch.rand(n, C, H, 1, device=device) * cdf[..., -1:]
            cand = one_hot_index((cdf < u).sum(-1).clamp_(max=A - 1), A)  # inverse CDF -> (N, C, H, A) one-hot
            if proposals is not None:
                cand = torch.cat([cand, proposals], 1)  # (N, C+P, H, A)
            elites, weights = self._elites(model, starts, cand, gamma)
            probs = elites.mean(1) if self.temperature is None else (weights[:, :, None, None] * elites).sum(1)
        return probs

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
    go to the planner (horizon, candidates, top_k, iterations, gamma, temperature, policy_candidates).

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
