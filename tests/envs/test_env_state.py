"""Issue 27: checkpoints hold the envs' compact state (DMC, Atari), not the pickled simulators, and resume exactly.

Each test steps a vector env, saves :meth:`VectorStepper.state_dict` through ``torch.save``/``torch.load`` (what a
checkpoint does), loads it into a fresh stepper built with another seed, and checks that both continue with
bit-identical rows (observations, rewards, flags) and episode stats, across episode ends.
"""

import io
import pickle

import cloudpickle
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from reverie.envs import make_vector_env
from reverie.envs.stepper import VectorStepper, dumps_envs

CONFIGS = "reverie/configs/env"


def env_config(name, **overrides):
    return OmegaConf.merge(OmegaConf.load(f"{CONFIGS}/{name}.yaml"), overrides)


def actions(stepper, rng):
    return rng.uniform(-1, 1, (stepper.num_envs, stepper.action_spec.dim)).astype(np.float32)


def through_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)


def continue_together(a, b, steps, rng):
    """Step both with the same actions; assert equal rows and episodes; return how many episodes ended."""
    ended = 0
    for _ in range(steps):
        action = actions(a, rng)
        (row_a, ep_a), (row_b, ep_b) = a.step(action), b.step(action)
        assert ep_a == ep_b
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            np.testing.assert_array_equal(row_a[key], row_b[key], err_msg=key)
        ended += len(ep_a)
    return ended


def saved_and_restored(cfg, warmup, rng):
    a = VectorStepper(make_vector_env(cfg, 0))
    a.reset()
    for _ in range(warmup):
        a.step(actions(a, rng))
    state = through_checkpoint(a.state_dict())
    b = VectorStepper(make_vector_env(cfg, 5))  # another seed: everything must come from the state
    b.reset()
    assert b.load_state_dict(state) is True
    return a, b, state


@pytest.fixture(scope="module")
def gl():
    pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")
    from reverie.envs import dmc

    try:
        return dmc.select_gl(required=True)
    except dmc.GLUnavailableError as err:
        pytest.skip(f"no headless OpenGL for DMC pixels here: {err}")


def test_dmc_proprio_resumes_bit_exactly_from_a_few_kib_per_env():
    """reacher_easy draws its target into the model (``geom_pos``) at each reset: the state carries that field, and
    the rows match across the 20-step episode ends (time_limit) that draw new targets from the task's RandomState."""
    pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")
    cfg = env_config("dmc_proprio", task="reacher_easy", num_envs=2, time_limit=20)
    rng = np.random.default_rng(0)
    a, b, state = saved_and_restored(cfg, 27, rng)
    assert len(state["env"]) < 40_000  # was about 12 MB per env (the model's textures), 2 envs here
    inner = pickle.loads(state["env"]).envs[0].unwrapped.__getstate__()["_dmc"]
    assert "geom_pos" in inner["model"] and "tex_data" not in inner["model"]
    # calls 28..67: each copy ends an episode at calls 41 and 62 (20 steps, then the reset row), new targets drawn
    assert continue_together(a, b, 40, rng) == 2 * 2
    a.close()
    b.close()


def test_dmc_vision_resumes_bit_exactly(gl):
    """Pixels: nothing but the physics state is needed, the frames are rendered from it."""
    cfg = env_config("dmc_vision", num_envs=1, time_limit=6)
    rng = np.random.default_rng(1)
    a, b, state = saved_and_restored(cfg, 4, rng)
    assert len(state["env"]) < 60_000  # the last frame twice (the vector env's buffers) + a few KiB of state
    assert continue_together(a, b, 8, rng) == 1
    a.close()
    b.close()


def test_dmc_state_from_before_the_compact_format_still_resumes():
    """A checkpoint written before issue 27 holds the DMC envs pickled whole (the model and data of each): it still
    loads and continues exactly, and saving it again writes it whole (its load arguments are not known)."""
    pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")
    from reverie.envs.dmc import DMCEnv

    cfg = env_config("dmc_proprio", task="cartpole_swingup", num_envs=1, time_limit=15)
    rng = np.random.default_rng(2)
    a = VectorStepper(make_vector_env(cfg, 0))
    a.reset()
    for _ in range(4):
        a.step(actions(a, rng))
    old_style = a.state_dict()
    original = DMCEnv.__getstate__
    try:  # the old format: the default pickling of every attribute, without the load arguments
        DMCEnv.__getstate__ = lambda self: {k: v for k, v in self.__dict__.items()
                                            if k not in ("_load_kwargs", "_model_digests")}
        old_style["env"] = cloudpickle.dumps(a.env)
    finally:
        DMCEnv.__getstate__ = original
    assert len(old_style["env"]) > 5_000_000  # the model's textures
    b = VectorStepper(make_vector_env(cfg, 5))
    b.reset()
    assert b.load_state_dict(through_checkpoint(old_style)) is True
    assert continue_together(a, b, 20, rng) == 1
    assert len(dumps_envs(b.env)) > 5_000_000  # saved whole again, as before
    a.close()
    b.close()


def test_dmc_state_from_another_simulator_version_restarts_the_episodes():
    pytest.importorskip("dm_control", reason="DMC tests need dm_control and mujoco<4: pip install -e '.[dmc]'")
    cfg = env_config("dmc_proprio", task="cartpole_swingup", num_envs=1)
    a = VectorStepper(make_vector_env(cfg, 0))
    a.reset()
    state = a.state_dict()
    vec = pickle.loads(state["env"])  # change the recorded mujoco version inside the pickled env
    env = vec.envs[0].unwrapped
    patched = env.__getstate__()
    patched["_dmc"]["versions"] = {**patched["_dmc"]["versions"], "mujoco": "0.0.1"}
    env.__getstate__ = lambda: patched
    state["env"] = dumps_envs(vec)
    b = VectorStepper(make_vector_env(cfg, 5))
    b.reset()
    with pytest.warns(RuntimeWarning, match=r"saved with .*0\.0\.1.*episodes in flight restart"):
        assert b.load_state_dict(state) is False
    a.close()
    b.close()


def atari_config(**overrides):
    pytest.importorskip("ale_py", reason="Atari tests need ale-py: pip install -e '.[atari]'")
    return env_config("atari100k", **overrides)


def test_atari_resumes_bit_exactly_with_the_emulator_state():
    """Before issue 27 the pickled Atari env looked restorable but ale-py's pickling (EzPickle) rebuilt a fresh,
    randomly seeded game: the first row after resume already differed. Now the emulator state (RNG included) and
    the env's no-op generator are saved: the rows match across episode ends (time_limit) and no-op resets."""
    cfg = atari_config(task="breakout", num_envs=1, time_limit=12, life_loss="terminal")
    rng = np.random.default_rng(3)
    a, b, state = saved_and_restored(cfg, 5, rng)
    assert len(state["env"]) < 60_000  # the two 210x160x3 frame buffers (200 KB) are not saved
    assert continue_together(a, b, 22, rng) == 2  # episode ends at calls 12 and 25
    a.close()
    b.close()


def test_atari_with_sticky_actions_resumes_bit_exactly():
    """Issue 47: env=atari's sticky actions (0.25) are applied by reverie's StickyActions wrapper, whose last action
    and generator travel with the env: the rows after a restore equal the uninterrupted ones, across an episode end
    (time_limit 12) and a lost life."""
    cfg = atari_config(task="breakout", num_envs=1, sticky=0.25, time_limit=12, life_loss="terminal")
    rng = np.random.default_rng(4)
    a, b, state = saved_and_restored(cfg, 5, rng)
    assert state["env"] is not None and not state.get("env_error")
    assert continue_together(a, b, 22, rng) == 2
    a.close()
    b.close()


def test_ales_own_sticky_actions_are_still_refused_for_saving():
    """An ALE env made with ALE's repeat_action_probability (outside make_atari) cannot be saved exactly: the
    state says why and holds no envs (the episodes restart)."""
    import gymnasium as gym

    from reverie.envs.atari import reduce_atari_env

    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.25)
    with pytest.raises(NotImplementedError, match="sticky actions"):
        reduce_atari_env(env.unwrapped)
    env.close()


def test_uniform_box_bounds_are_pickled_once():
    from gymnasium import spaces

    image = spaces.Box(0, 255, (64, 64, 3), np.uint8)
    image.seed(4)
    vector = spaces.Box(np.array([-1.0, -2.0], np.float32), np.array([1.0, np.inf], np.float32))
    assert len(dumps_envs(image)) < 2_000 < len(cloudpickle.dumps(image))
    for space in (image, vector):
        back = pickle.loads(dumps_envs(space))
        assert back == space and back.dtype == space.dtype
        for key in ("low", "high", "bounded_below", "bounded_above"):
            np.testing.assert_array_equal(getattr(back, key), getattr(space, key))
            assert getattr(back, key).dtype == getattr(space, key).dtype
    np.testing.assert_array_equal(pickle.loads(dumps_envs(image)).sample(), image.sample())  # same RNG state
