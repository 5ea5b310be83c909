"""DreamerV3 acting by planning (MPC): CEM or MPPI over its world model, its critic as the value bootstrap.

``DreamerV3(..., planner="cem")`` (``agent.module.planner``, ``reverie eval RUN --planner cem``) plans from every
posterior state with :func:`reverie.agents.planning.score` at the critic's discount and executes the first action of
the best sequence, wherever the agent acts; the actor can seed the search (``policy_candidates``); training does not
change. docs/planning.md has the settings and measurements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from reverie.agents.planning import WorldModelPlanning, make_planner
from reverie.types import ActionSpec

#: How a DreamerV3 agent acts: its actor (the reference), or a planner over its world model and critic.
PLANNERS = ("actor", "cem", "mppi")

#: Planner settings (``agent.module.plan``): CEM sized for a CPU (docs/planning.md), DreamerV3's imagination horizon
PLAN_DEFAULTS: dict[str, Any] = {"horizon": 15, "candidates": 128, "top_k": 16, "iterations": 3,
                                 "policy_candidates": 0, "temperature": 0.5, "noise": 0.3, "sample": True,
                                 "value": True}

#: (lowest value, lowest included?, integer?, null allowed?, what) as :data:`reverie.configs.ranges.RANGES`; None: bool
PLAN_RANGES: dict[str, tuple[float, bool, bool, bool, str] | None] = {
    "horizon": (1, True, True, False, "planned steps H"),
    "candidates": (1, True, True, False, "sequences sampled per iteration"),
    "top_k": (1, True, True, False, "elites refit to"),
    "iterations": (1, True, True, False, "refits"),
    "policy_candidates": (0, True, True, False, "actor rollouts added to the candidates"),
    "temperature": (0, False, False, False, "mppi's sharpness of the elite weights"),
    "noise": (0, True, False, False, "exploration noise: Gaussian std (Box) or epsilon (Discrete)"),
    "sample": None,
    "value": None,
}


def check_plan(plan: Mapping | None) -> dict[str, Any]:
    """``{**PLAN_DEFAULTS, **plan}`` once every key is known and every value fits :data:`PLAN_RANGES`; else ValueError
    ``"planner setting(s): ..."`` naming every problem (``top_k`` above the sequences it picks from among them)."""
    from reverie.configs.ranges import value_problem

    plan = dict(plan or {})
    unknown = sorted(set(plan) - set(PLAN_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown planner setting(s) {unknown}; known: {', '.join(PLAN_DEFAULTS)}")
    settings = {**PLAN_DEFAULTS, **plan}
    errors = []
    for key, rule in PLAN_RANGES.items():
        value = settings[key]
        if rule is None:
            if not isinstance(value, bool):
                errors.append(f"{key}={value!r} must be true or false")
        elif (problem := value_problem(key, value, rule)) is not None:
            errors.append(problem)
    if not errors and settings["top_k"] > settings["candidates"] + settings["policy_candidates"]:
        errors.append(f"top_k={settings['top_k']} is more than candidates + policy_candidates = "
                      f"{settings['candidates'] + settings['policy_candidates']}, the sequences the elites come from")
    if errors:
        raise ValueError("planner setting(s): " + "; ".join(errors) + " (docs/planning.md lists the settings)")
    return settings


class DreamerPlanner:
    """Plans DreamerV3's actions from posterior states: a CEM for ``spec`` (Discrete or Box in ``[-1, 1]``), ``kind``
    ``"cem"`` or ``"mppi"`` (elites weighted by ``temperature``), ``plan`` the settings of :data:`PLAN_DEFAULTS`.
    Raises ValueError for an unknown ``kind`` or bad settings (:func:`check_plan`)."""

    def __init__(self, spec: ActionSpec, kind: str = "cem", plan: dict | None = None):
        if kind not in PLANNERS[1:]:
            raise ValueError(f"planner must be one of {', '.join(PLANNERS)}, got {kind!r}")
        self.kind, self.settings = kind, check_plan(plan)
        s = self.settings
        self.planner = make_planner(spec, "auto", -1.0, 1.0, horizon=int(s["horizon"]),
                                    candidates=int(s["candidates"]), top_k=int(s["top_k"]),
                                    iterations=int(s["iterations"]), policy_candidates=int(s["policy_candidates"]),
                                    temperature=float(s["temperature"]) if kind == "mppi" else None)

    def model(self, agent: Any) -> WorldModelPlanning:
        """The agent's world model with its critic (unless ``value=False``), actor and discount."""
        model = WorldModelPlanning.from_dreamer(agent, sample=bool(self.settings["sample"]))
        if not self.settings["value"]:
            model.value_fn = None
        return model

    def act(self, agent: Any, post: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
        """Action ``(N, A)`` float32 for posterior states ``(N, ...)``: one-hot (Discrete) or in ``[-1, 1]``."""
        return self.planner.act(self.model(agent), post, mode, float(self.settings["noise"])).float()


def make_dreamer_planner(spec: ActionSpec, planner: str = "actor", plan: dict | None = None) -> DreamerPlanner | None:
    """None for ``planner="actor"``, else a :class:`DreamerPlanner`; ValueError for an unknown ``planner`` or bad
    ``plan`` settings (checked for the actor too)."""
    if planner == "actor":
        check_plan(plan)  # also with the actor: the settings are saved with the run for `reverie eval --planner`
        return None
    return DreamerPlanner(spec, planner, plan)  # checks the planner's name, then the settings
