"""DMC-Subtle (reverie.envs.dmc_subtle): each task is its suite task with one object drawn smaller by its scale."""

import numpy as np
import pytest

pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")

from reverie.envs import dmc, dmc_subtle, make_env  # noqa: E402


def _suite():
    """dm_control's suite, imported only after select_gl: importing it first (at collection, as this module once did)
    fixes dm_control's backend to glfw in this worker, and every later pixel test there fails headless."""
    dmc.select_gl(required=False)
    from dm_control import suite

    return suite

# (subtle task, suite domain and task it scales, geoms (finger: the site) scaled, scale)
CASES = [("reacher_subtle", "reacher", "hard", ["target"], 1 / 3),
         ("finger_turn_subtle", "finger", "turn_hard", ["target"], 1 / 2),
         ("point_mass_subtle", "point_mass", "easy", ["target", "pointmass"], 1 / 6),
         ("ball_in_cup_catch_subtle", "ball_in_cup", "catch", ["ball"], 1 / 12),
         ("cartpole_swingup_subtle", "cartpole", "swingup", ["pole_1"], 1 / 20)]


@pytest.mark.parametrize("name, domain, task, geoms, scale", CASES)
def test_each_subtle_task_is_its_suite_task_with_the_object_scaled(name, domain, task, geoms, scale):
    subtle = dmc_subtle.load(name, {"random": 0})
    plain = _suite().load(domain, task, task_kwargs={"random": 0})
    subtle.reset(), plain.reset()  # reacher and finger size their targets at each reset
    for geom in geoms:  # finger's target is a site, the others are geoms
        sizes = "site_size" if name == "finger_turn_subtle" else "geom_size"
        ours, theirs = getattr(subtle.physics.named.model, sizes)[geom], getattr(plain.physics.named.model, sizes)[geom]
        np.testing.assert_allclose(ours[0], theirs[0] * scale, rtol=1e-12, err_msg=geom)  # the radius
    if name == "ball_in_cup_catch_subtle":
        np.testing.assert_allclose(subtle.physics.named.model.tendon_width["string"],
                                   plain.physics.named.model.tendon_width["string"] * scale)
    assert subtle.action_spec().shape == plain.action_spec().shape
    assert subtle.control_timestep() == plain.control_timestep()
    assert subtle._step_limit == plain._step_limit  # the suite's time limit


def test_the_env_config_takes_the_subtle_names_and_refuses_unknown_ones():
    env = make_env({"suite": "dmc", "task": "point_mass_subtle", "image": False, "proprio": True}, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs["vector"].shape == (4,) and env.action_space.shape == (2,)
    with pytest.raises(ValueError, match="DMC-Subtle: reacher_subtle, finger_turn_subtle"):
        make_env({"suite": "dmc", "task": "reacher_subtel", "image": False, "proprio": True}, seed=0)
    with pytest.raises(ValueError, match="only task_kwargs.random"):
        dmc_subtle.load("reacher_subtle", {"time_limit": 5})
