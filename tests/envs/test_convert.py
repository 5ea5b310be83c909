"""SpaceConverter: the env's own observations and actions <-> contract rows, the contract wrappers' rules."""

import numpy as np
from gymnasium import spaces

from reverie.configs.compose import load_config
from reverie.envs import make_env
from reverie.envs.convert import SpaceConverter


def test_pendulum_torques_rescale_both_ways_as_the_env_layer_does():
    converter = SpaceConverter(load_config(["env=pendulum"]).env)
    assert converter.raw_action_space == spaces.Box(-2.0, 2.0, (1,), np.float32)
    torque = np.array([[-2.0], [-1.0], [0.0], [0.5], [2.0]], np.float32)
    model = converter.actions(torque)
    np.testing.assert_array_equal(model, [[-1.0], [-0.5], [0.0], [0.25], [1.0]])
    np.testing.assert_array_equal(converter.raw_actions(model), torque)
    assert converter.action_error(torque) is None
    assert converter.action_error(np.array([[0.1], [2.5]])) == ("row 1 holds 2.5 at index 0, outside Box(-2.0, 2.0, "
                                                                "(1,), float32) (bounds [-2.0, 2.0])")
    obs = np.array([[1.0, 0.0, -3.0], [0.0, 1.0, 8.0]], np.float32)
    np.testing.assert_array_equal(converter.observations(obs)["vector"], obs)
    np.testing.assert_array_equal(converter.raw_observations(converter.observations(obs)), obs)


def test_discrete_with_a_start_and_images_and_dict_observations():
    cfg = load_config(["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv", "+env.kwargs.size=4",
                       "+env.kwargs.dict_obs=true"]).env
    converter = SpaceConverter(cfg)
    assert set(converter.observation_space.spaces) == {"image", "vector"}
    raw = {"image": np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3),
           "vector": np.array([[1.0], [2.0]], np.float32)}
    contract = converter.observations(raw)
    assert contract["image"].shape == (2, 3, 4, 4) and contract["image"][1, 2, 3, 1] == raw["image"][1, 3, 1, 2]
    back = converter.raw_observations(contract)
    for key in raw:
        np.testing.assert_array_equal(back[key], raw[key])
    converter.raw_action_space = spaces.Discrete(3, start=-1)  # as a Discrete(3, start=-1) env would have it
    np.testing.assert_array_equal(converter.actions(np.array([-1, 1, 0])), np.eye(3)[[0, 2, 1]])
    np.testing.assert_array_equal(converter.raw_actions(np.eye(3)[[0, 2, 1]]), [-1, 1, 0])
    assert converter.action_error(np.array([0, 2])) == ("row 1 is 2, outside Discrete(3, start=-1) (integers -1..1)")


def test_raw_actions_are_what_the_env_layer_sends():
    """The env (under reverie's RescaleAction) receives exactly converter.raw_actions of the model action."""
    cfg = load_config(["env=pendulum", "+env.wrappers=[{_target_: reverie.envs.testing.RecordActions}]"]).env
    converter = SpaceConverter(cfg)
    env = make_env(cfg, seed=0)
    env.reset()
    model = np.array([[-1.0], [-0.3], [0.0], [0.7], [1.0], [0.123456]], np.float32)
    for a in model:
        env.step(a)
    received = np.stack(env.get_wrapper_attr("recorded_actions"))
    np.testing.assert_array_equal(converter.raw_actions(model), received.astype(np.float32))
    np.testing.assert_allclose(converter.actions(received), model, rtol=0, atol=1e-7)
