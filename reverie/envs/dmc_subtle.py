"""DMC-Subtle (R2-Dreamer, Morihira et al. 2025): five dm_control suite tasks whose task-relevant object is drawn
smaller, so that a pixel reconstruction loss can ignore it: reacher hard's target 1/3, finger turn_hard's target 1/2,
point_mass easy's target and point mass 1/6 (gains not randomised), ball_in_cup's ball and string width 1/12,
cartpole swingup's pole radius 1/20 (the scales of NM512/r2dreamer ``envs/dmc_subtle.py``). Physics, task, time limit
and control timestep are the suite's; the model XML is edited with ``xml.etree``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Callable

from reverie.envs.gl import select_gl

SCALES = {"reacher_subtle": 1 / 3, "finger_turn_subtle": 1 / 2, "point_mass_subtle": 1 / 6,
          "ball_in_cup_catch_subtle": 1 / 12, "cartpole_swingup_subtle": 1 / 20}
TASKS = tuple(SCALES)


def _scaled(xml: bytes | str, path: str, attribute: str, scale: float) -> bytes:
    """``xml`` with the size ``attribute`` (one or more numbers) of the element at ``path`` times ``scale``;
    ValueError when either is missing (another dm_control version's model)."""
    root = ET.fromstring(xml)
    element = root.find(path)
    if element is None or element.get(attribute) is None:
        raise ValueError(f"DMC-Subtle: no {attribute!r} at {path!r} in the model XML (dm_control changed?)")
    values = [float(v) * scale for v in element.get(attribute).split()]
    element.set(attribute, " ".join(repr(v) for v in values))
    return ET.tostring(root)


def _environment(physics: Any, task: Any, module: Any, environment_kwargs: dict | None) -> Any:
    from dm_control.rl import control

    kwargs = dict(environment_kwargs or {})
    if hasattr(module, "_CONTROL_TIMESTEP"):
        kwargs.setdefault("control_timestep", module._CONTROL_TIMESTEP)
    return control.Environment(physics, task, time_limit=module._DEFAULT_TIME_LIMIT, **kwargs)


def _reacher(random, environment_kwargs):
    from dm_control.suite import reacher

    physics = reacher.Physics.from_xml_string(*reacher.get_model_and_assets())
    task = reacher.Reacher(target_size=reacher._SMALL_TARGET * SCALES["reacher_subtle"], random=random)
    return _environment(physics, task, reacher, environment_kwargs)


def _finger(random, environment_kwargs):
    from dm_control.suite import finger

    physics = finger.Physics.from_xml_string(*finger.get_model_and_assets())
    task = finger.Turn(target_radius=finger._HARD_TARGET_SIZE * SCALES["finger_turn_subtle"], random=random)
    return _environment(physics, task, finger, environment_kwargs)


def _point_mass(random, environment_kwargs):
    from dm_control.suite import point_mass

    xml, assets = point_mass.get_model_and_assets()
    scale = SCALES["point_mass_subtle"]
    xml = _scaled(xml, ".//geom[@name='target']", "size", scale)
    xml = _scaled(xml, ".//geom[@name='pointmass']", "size", scale)
    task = point_mass.PointMass(randomize_gains=False, random=random)
    return _environment(point_mass.Physics.from_xml_string(xml, assets), task, point_mass, environment_kwargs)


def _ball_in_cup(random, environment_kwargs):
    from dm_control.suite import ball_in_cup

    xml, assets = ball_in_cup.get_model_and_assets()
    scale = SCALES["ball_in_cup_catch_subtle"]
    xml = _scaled(xml, ".//geom[@name='ball']", "size", scale)
    xml = _scaled(xml, ".//tendon/spatial[@name='string']", "width", scale)
    task = ball_in_cup.BallInCup(random=random)
    return _environment(ball_in_cup.Physics.from_xml_string(xml, assets), task, ball_in_cup, environment_kwargs)


def _cartpole(random, environment_kwargs):
    from dm_control.suite import cartpole

    xml, assets = cartpole.get_model_and_assets()
    xml = _scaled(xml, ".//default/default[@class='pole']/geom", "size", SCALES["cartpole_swingup_subtle"])
    task = cartpole.Balance(swing_up=True, sparse=False, random=random)
    return _environment(cartpole.Physics.from_xml_string(xml, assets), task, cartpole, environment_kwargs)


BUILDERS: dict[str, Callable[..., Any]] = {"reacher_subtle": _reacher, "finger_turn_subtle": _finger,
                                           "point_mass_subtle": _point_mass,
                                           "ball_in_cup_catch_subtle": _ball_in_cup,
                                           "cartpole_swingup_subtle": _cartpole}


def load(name: str, task_kwargs: dict | None = None, environment_kwargs: dict | None = None) -> Any:
    """The dm_control ``Environment`` of DMC-Subtle task ``name`` (``task_kwargs``: only ``random``, as
    ``suite.load``); ValueError for an unknown name or another task argument."""
    if name not in BUILDERS:
        raise ValueError(f"{name!r} is not a DMC-Subtle task: {', '.join(TASKS)}")
    extra = sorted(set(task_kwargs or {}) - {"random"})
    if extra:
        raise ValueError(f"DMC-Subtle tasks take only task_kwargs.random, got {extra}")
    select_gl(required=False)  # dm_control fixes its OpenGL backend at import: choose it first (glfw fails headless)
    return BUILDERS[name]((task_kwargs or {}).get("random"), environment_kwargs)
