"""Planner settings (`agent.module.plan`, `--plan`, `load_run(plan=...)`) are checked by name, type and range
before anything acts, with one message naming every bad setting; PlaNet's own `planner` key explains itself."""

import pytest
from helpers.agents import dreamer, planet

from reverie.agents.dreamer import DreamerV3
from reverie.agents.dreamer_planning import PLAN_DEFAULTS, check_plan
from reverie.types import ActionSpec


@pytest.mark.parametrize("plan, message", [
    ({"horizon": -1}, "horizon=-1 must be >= 1"),
    ({"horizon": 0}, "horizon=0 must be >= 1"),
    ({"horizon": 2.5}, "horizon=2.5 must be an integer >= 1"),
    ({"horizon": "abc"}, "horizon='abc' is not a number: must be an integer >= 1"),
    ({"candidates": 0}, "candidates=0 must be >= 1"),
    ({"top_k": 0}, "top_k=0 must be >= 1"),
    ({"iterations": 0}, "iterations=0 must be >= 1"),
    ({"policy_candidates": -1}, "policy_candidates=-1 must be >= 0"),
    ({"temperature": 0}, "temperature=0 must be > 0"),
    ({"temperature": -1.0}, "temperature=-1.0 must be > 0"),
    ({"noise": -0.1}, "noise=-0.1 must be >= 0"),
    ({"sample": "maybe"}, "sample='maybe' must be true or false"),
    ({"value": 1}, "value=1 must be true or false"),
    ({"horizon": None}, "horizon=null: needs a value"),
    ({"top_k": 200}, r"top_k=200 is more than candidates \+ policy_candidates = 128"),
    ({"horizont": 3}, r"unknown planner setting\(s\) \['horizont'\]"),
])
def test_bad_settings_are_named_with_their_range(plan, message):
    with pytest.raises(ValueError, match=r"^(unknown )?planner setting"):
        check_plan(plan)
    with pytest.raises(ValueError, match=message):
        check_plan(plan)


def test_every_bad_setting_is_named_at_once_and_good_ones_pass():
    with pytest.raises(ValueError, match=r"horizon=0 must be >= 1.*; noise=-1 must be >= 0"):
        check_plan({"horizon": 0, "noise": -1})
    assert check_plan(None) == PLAN_DEFAULTS
    assert check_plan({"top_k": 130, "policy_candidates": 2, "temperature": 0.1, "value": False}) == {
        **PLAN_DEFAULTS, "top_k": 130, "policy_candidates": 2, "temperature": 0.1, "value": False}


def test_dreamer_checks_its_plan_settings_even_when_the_actor_acts():
    """They are saved with the run and used by `reverie eval --planner`: a bad one stops `reverie train` at once."""
    with pytest.raises(ValueError, match="horizon=-1 must be >= 1"):
        DreamerV3({"vector": (3,)}, ActionSpec(True, 2), **dreamer(deter=16, units=16, plan={"horizon": -1}))


def test_planet_explains_that_cem_and_mppi_are_dreamers_planner_choices():
    from reverie.agents.planet import PlaNet

    with pytest.raises(ValueError, match="PlaNet always plans with CEM.*auto, gaussian or categorical.*DreamerV3"):
        PlaNet({"vector": (3,)}, ActionSpec(True, 2), **planet(planner="cem"))


@pytest.mark.parametrize("override, message", [
    ("agent.module.plan.horizon=-1", "agent error: planner setting(s): horizon=-1 must be >= 1"),
    ("agent.module.plan.sample=maybe", "agent error: planner setting(s): sample='maybe' must be true or false"),
    ("agent=planet agent.module.planner=cem", "agent error: PlaNet always plans with CEM"),
])
def test_reverie_train_refuses_bad_planner_settings_before_writing(tmp_path, capsys, override, message):
    from reverie.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", *override.split()]) == 2
    assert capsys.readouterr().err.startswith(message) and not run_dir.exists()


def test_load_run_says_which_dreamerv3_plans():
    from omegaconf import OmegaConf

    from reverie.state.saved_run import RunError, set_planner

    with pytest.raises(RunError, match=r"agent is 'dreamerv3_2025' \(the 2023 agent, agent=dreamerv3; the 2024-25 one "
                                       r"acts with its actor only\)"):
        set_planner(OmegaConf.create({"name": "dreamerv3_2025", "module": {}}), "cem", None)
