"""DeepMind Control Suite through dm_control: proprio vectors, action repeat, time limit, pixels, GL choice, names."""

import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")

from reverie.envs import dmc, make_env  # noqa: E402
from reverie.envs import gl as gl_backend  # noqa: E402

CONFIGS = "reverie/configs/env"


def proprio(task="cartpole_swingup", **settings):
    return {"suite": "dmc", "task": task, "image": False, "proprio": True, **settings}


@pytest.fixture(scope="module")
def gl():
    """Skips pixel tests (with the reason) when no headless OpenGL backend works on this machine."""
    try:
        return dmc.select_gl(required=True)
    except dmc.GLUnavailableError as err:
        pytest.skip(f"no headless OpenGL for DMC pixels here: {err}")


@pytest.mark.parametrize("task, width", [("cartpole_swingup", 5), ("walker_walk", 24), ("cup_catch", 8)])
def test_proprio_vector_shapes(task, width):
    env = make_env(proprio(task), seed=0)
    obs, _ = env.reset()
    assert list(obs) == ["vector"] and obs["vector"].dtype == np.float32 and obs["vector"].shape == (width,)
    assert env.action_space.low.min() == -1 and env.action_space.high.max() == 1


def test_proprio_split_gives_each_dm_control_entry_its_own_key():
    """walker's entries orientations (14), height (1), velocity (9): split, each is its own key; the values are the
    vector's, cut in dm_control's order; the same seed and actions give the same values both ways."""
    joined, split = make_env(proprio("walker_walk"), seed=0), make_env(proprio("walker_walk", proprio_split=True), 0)
    assert {k: s.shape for k, s in split.observation_space.spaces.items()} == \
        {"orientations": (14,), "height": (1,), "velocity": (9,)}
    a, _ = joined.reset(seed=3)
    b, _ = split.reset(seed=3)
    for _ in range(3):
        assert np.array_equal(a["vector"], np.concatenate([b["orientations"], b["height"], b["velocity"]]))
        action = np.full(joined.action_space.shape, 0.3, np.float32)
        a, b = joined.step(action)[0], split.step(action)[0]
    assert dmc.DMCEnv.entry_key("reward") == "obs_reward" and dmc.DMCEnv.entry_key("height") == "height"


def test_reference_dmc_proprio_splits_the_entries_for_the_current_official_agent():
    """The official DMC envs give separate keys, so the 2025 decoder's AGC clips each key's output layer alone."""
    from reverie.configs.compose import load_config

    assert load_config(["agent=dreamerv3_2025", "exp=reference", "env=dmc_proprio"]).env.proprio_split is True
    assert load_config(["agent=dreamerv3", "exp=reference", "env=dmc_proprio"]).env.proprio_split is False
    assert load_config(["env=dmc_proprio"]).env.proprio_split is False


def test_action_repeat_2_sums_rewards_over_two_physics_steps():
    """Against dm_control itself, seeded the same way: one agent step == two control steps, rewards summed."""
    dmc.select_gl(required=False)  # before dm_control's first import: it fixes its GL backend then (glfw headless
    from dm_control import suite  # crashed a later pixel test in the same xdist worker)

    seed = 123
    env = make_env(proprio(), seed=0)
    obs, _ = env.reset(seed=seed)
    raw = suite.load("cartpole", "swingup", task_kwargs={"random": seed})
    first = raw.reset()
    np.testing.assert_array_equal(obs["vector"], np.concatenate([first.observation["position"],
                                                                 first.observation["velocity"]]).astype(np.float32))
    rng = np.random.default_rng(0)
    for _ in range(5):
        action = rng.uniform(-1, 1, size=(1,)).astype(np.float32)
        obs, reward, terminated, truncated, _ = env.step(action)
        expected = 0.0
        for _ in range(2):
            ts = raw.step(action.astype(np.float64))
            expected += ts.reward
        assert reward == expected and not terminated and not truncated
        np.testing.assert_array_equal(obs["vector"], np.concatenate(
            [ts.observation["position"], ts.observation["velocity"]]).astype(np.float32))


def test_time_limit_is_a_truncation_after_500_agent_steps():
    env = make_env(proprio(), seed=0)
    env.reset()
    ends = []
    for step in range(1, 501):
        _, _, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
        if terminated or truncated:
            ends.append((step, terminated, truncated))
    assert ends == [(500, False, True)]


def test_presets_compose():
    from reverie.configs.compose import load_config

    cfg = load_config(["env=dmc_vision"])
    assert (cfg.env.suite, cfg.env.task, cfg.env.action_repeat, cfg.env.image, cfg.env.proprio, cfg.env.size) == (
        "dmc", "cartpole_swingup", 2, True, False, 64)
    cfg = load_config(["env=dmc_proprio", "env.task=cheetah_run"])
    assert (cfg.env.task, cfg.env.action_repeat, cfg.env.image, cfg.env.proprio) == ("cheetah_run", 2, False, True)


def test_vision_observation(gl):
    env = make_env(OmegaConf.load(f"{CONFIGS}/dmc_vision.yaml"), seed=0)  # cartpole_swingup, 64x64, camera 0
    obs, _ = env.reset()
    assert list(obs) == ["image"] and obs["image"].dtype == np.uint8 and obs["image"].shape == (3, 64, 64)
    obs, *_ = env.step(np.ones(1, np.float32))
    physics = env.unwrapped._env.physics
    np.testing.assert_array_equal(obs["image"], np.transpose(physics.render(64, 64, camera_id=0), (2, 0, 1)))
    assert obs["image"].std() > 5  # a rendered scene, not a blank buffer


def test_vision_and_proprio_together_and_reference_cameras(gl):
    env = make_env({"suite": "dmc", "task": "cartpole_swingup", "image": True, "proprio": True, "size": 32}, seed=0)
    obs, _ = env.reset()
    assert obs["image"].shape == (3, 32, 32) and obs["vector"].shape == (5,)
    assert dmc.metadata({"task": "quadruped_run"})["camera"] == 2
    assert dmc.metadata({"task": "walker_walk"})["camera"] == 0


def test_bad_task_name_lists_close_names():
    with pytest.raises(ValueError, match=r"env.task='cartpole_swingupp' is not a DeepMind Control Suite task\. "
                                         r"Names are <domain>_<task>.*Close names: cartpole_swingup"):
        make_env(proprio("cartpole_swingupp"), seed=0)


def test_no_observation_is_an_error():
    with pytest.raises(ValueError, match="needs env.image=true and/or env.proprio=true"):
        make_env(proprio(proprio=False), seed=0)


class _Done:
    def __init__(self, returncode, stderr=""):
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture
def fresh_gl(monkeypatch):
    """select_gl as in a new process: no MUJOCO_GL, dm_control's renderer not imported, nothing probed yet."""
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delitem(sys.modules, "dm_control._render", raising=False)
    monkeypatch.setattr(gl_backend, "_gl_failures", {})


def test_gl_prefers_egl_then_osmesa(fresh_gl, monkeypatch):
    tried = []

    def run(cmd, **kwargs):
        tried.append(cmd[-1])
        return _Done(0 if cmd[-1] == "osmesa" else 1, "EGL: no display")

    monkeypatch.setattr(gl_backend.subprocess, "run", run)
    assert gl_backend.select_gl() == "osmesa" and tried == ["egl", "osmesa"]
    import os

    assert os.environ["MUJOCO_GL"] == "osmesa"


def test_gl_error_names_the_debian_packages(fresh_gl, monkeypatch):
    monkeypatch.setattr(gl_backend.subprocess, "run", lambda cmd, **kwargs: _Done(1, "ImportError: cannot load library"))
    with pytest.raises(gl_backend.GLUnavailableError,
                       match=r"apt-get install -y libegl1 libgl1.*apt-get install -y libosmesa6"):
        gl_backend.select_gl(required=True)
    with pytest.raises(gl_backend.GLUnavailableError, match="MUJOCO_GL=egl: ImportError: cannot load library"):
        gl_backend.select_gl(required=True)  # remembered: no second probe, same clear error
    assert gl_backend.select_gl(required=False) == "disable"  # proprio-only runs go on without GL


def test_suggestions_are_real_task_names():
    """Issue 20: the examples and close names are tasks dm_control knows (cup_catch is only an alias)."""
    tasks = [("ball_in_cup", "catch"), ("cartpole", "swingup"), ("walker", "walk")]
    with pytest.raises(ValueError) as caught:
        dmc.dmc_task("cup_cach", tasks)
    message = str(caught.value)
    assert "(cartpole_swingup, walker_walk, ball_in_cup_catch). Close names: ball_in_cup_catch." in message
    assert dmc.dmc_task("cup_catch", tasks) == ("ball_in_cup", "catch")


def test_the_vector_entries_have_names():
    env = make_env(proprio("walker_walk"), seed=0)
    names = env.unwrapped.feature_names["vector"]
    assert names[:2] == ["orientations[0]", "orientations[1]"] and names[14] == "height"
    assert names[15:] == [f"velocity[{i}]" for i in range(9)] and len(names) == 24
    assert make_env(proprio("walker_walk", proprio_split=True), seed=0).unwrapped.feature_names == {}
