"""make_env / action_spec / to_env_action: contract spaces, rescaling, seeding, wrappers and errors."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from omegaconf import OmegaConf

from reverie.envs import UnsupportedSpaceError, action_spec, make_env, to_env_action
from reverie.envs.wrappers import derive_seed
from reverie.types import ActionSpec

COUNTING = "reverie.envs.testing.CountingEnv"


def test_cartpole_gives_vector_dict_and_discrete_spec():
    env = make_env(OmegaConf.create({"id": "CartPole-v1", "kwargs": {}, "wrappers": []}), seed=0)
    obs, _ = env.reset()
    assert list(obs) == ["vector"]
    assert obs["vector"].dtype == np.float32 and obs["vector"].shape == (4,)
    assert env.observation_space["vector"].shape == (4,)
    assert action_spec(env.action_space) == ActionSpec(discrete=True, dim=2)


def test_pendulum_actions_rescaled_from_unit_box():
    cfg = {"id": "Pendulum-v1", "wrappers": [{"_target_": "reverie.envs.testing.RecordActions"}]}
    env = make_env(cfg, seed=0)
    assert env.action_space == spaces.Box(-1.0, 1.0, (1,), np.float32)
    assert action_spec(env.action_space) == ActionSpec(discrete=False, dim=1)
    env.reset()
    for a in (1.0, -1.0, 0.0):
        env.step(np.array([a], np.float32))
    recorded = env.get_wrapper_attr("recorded_actions")
    assert [float(x[0]) for x in recorded] == [2.0, -2.0, 0.0]


def test_unit_box_actions_pass_through_unchanged():
    cfg = {"id": COUNTING, "kwargs": {"discrete": False},
           "wrappers": [{"_target_": "reverie.envs.testing.RecordActions"}]}
    env = make_env(cfg, seed=0)
    env.reset()
    env.step(np.array([0.3], np.float32))
    assert env.get_wrapper_attr("recorded_actions")[0][0] == np.float32(0.3)


def test_discrete_start_is_shifted():
    cfg = {
        "id": "reverie.envs.testing.SpaceEnv",
        "kwargs": {"observation_space": spaces.Box(-1, 1, (2,)), "action_space": spaces.Discrete(3, start=-1)},
        "wrappers": [{"_target_": "reverie.envs.testing.RecordActions"}],
    }
    env = make_env(cfg, seed=0)
    assert env.action_space == spaces.Discrete(3)
    env.reset()
    env.step(0)
    env.step(2)
    assert [int(a) for a in env.get_wrapper_attr("recorded_actions")] == [-1, 1]


@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "no_such_pkg.MyRobotEnv", "reverie.envs.testing.NoSuchEnv"])
def test_unknown_id_raises_naming_it(env_id):
    with pytest.raises(ValueError, match=f"env.id='{env_id}' is neither a registered Gymnasium id nor an importable"):
        make_env({"id": env_id}, seed=0)


def test_unknown_id_suggests_close_registered_id():
    with pytest.raises(ValueError, match="Close registered ids: CartPole-v1"):
        make_env({"id": "CartPole-v9"}, seed=0)


def test_missing_id_raises():
    with pytest.raises(ValueError, match="has no 'id'"):
        make_env({"kwargs": {}}, seed=0)


def test_discrete_observation_unsupported():
    with pytest.raises(UnsupportedSpaceError, match=r"Discrete\(16\).*supported observation spaces: Box vectors"):
        make_env({"id": "FrozenLake-v1"}, seed=0)


VEC = spaces.Box(-1, 1, (2,), np.float32)


@pytest.mark.parametrize(
    "obs_space, act_space, named",
    [
        (VEC, spaces.MultiDiscrete([2, 3]), "MultiDiscrete"),
        (spaces.Tuple((VEC, VEC)), spaces.Discrete(2), "Tuple"),
        (spaces.Text(5), spaces.Discrete(2), "Text"),
        (spaces.Box(0, 1, (8, 8, 3), np.float32), spaces.Discrete(2), "Box(0.0, 1.0, (8, 8, 3), float32)"),
        (spaces.Box(0, 255, (8, 8, 1), np.uint8), spaces.Discrete(2), "Box(0, 255, (8, 8, 1), uint8)"),
        (spaces.Box(0, 255, (3, 8, 8), np.uint8), spaces.Discrete(2), "Box(0, 255, (3, 8, 8), uint8)"),
        (spaces.Dict({"x": spaces.Discrete(3)}), spaces.Discrete(2), "Discrete(3)"),
        (VEC, spaces.Box(-np.inf, np.inf, (2,), np.float32), "Box(-inf, inf, (2,), float32)"),
        (VEC, spaces.Box(-1, 1, (2, 2), np.float32), "Box(-1.0, 1.0, (2, 2), float32)"),
    ],
)
def test_unsupported_spaces_raise_naming_the_space(obs_space, act_space, named):
    cfg = {"id": "reverie.envs.testing.SpaceEnv", "kwargs": {"observation_space": obs_space, "action_space": act_space}}
    with pytest.raises(UnsupportedSpaceError) as info:
        make_env(cfg, seed=0)
    assert isinstance(info.value, ValueError)
    assert named in str(info.value) and "supported action spaces: Discrete(n)" in str(info.value)


def test_dotted_path_with_kwargs():
    env = make_env({"id": COUNTING, "kwargs": {"length": 2, "obs_dim": 3}}, seed=0)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs["vector"], [0.0, 0.0, 0.0])
    obs, reward, terminated, truncated, _ = env.step(0)
    assert (obs["vector"][0], reward, terminated, truncated) == (1.0, 1.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(0)
    assert (obs["vector"][0], reward, terminated, truncated) == (2.0, 2.0, True, False)
    obs, _ = env.reset()
    assert obs["vector"][0] == 1000.0


@pytest.mark.parametrize("terminate", [True, False])
def test_action_repeat_sums_rewards_and_stops_at_episode_end(terminate):
    env = make_env({"id": COUNTING, "kwargs": {"length": 5, "terminate": terminate}, "action_repeat": 2}, seed=0)
    env.reset()
    got = [env.step(0) for _ in range(3)]
    assert [(o["vector"][0], r, term, trunc) for o, r, term, trunc, _ in got] == [
        (2.0, 3.0, False, False),
        (4.0, 7.0, False, False),
        (5.0, 5.0, terminate, not terminate),
    ]


def test_time_limit_counts_agent_steps_and_truncates():
    env = make_env({"id": COUNTING, "kwargs": {"length": 100}, "action_repeat": 2, "time_limit": 3}, seed=0)
    env.reset()
    results = [env.step(0)[1:4] for _ in range(3)]
    assert results == [(3.0, False, False), (7.0, False, False), (11.0, False, True)]


def test_bad_action_repeat_and_time_limit_raise():
    with pytest.raises(ValueError, match="action_repeat must be an int >= 1, got 0"):
        make_env({"id": COUNTING, "action_repeat": 0}, seed=0)
    with pytest.raises(ValueError, match="env.time_limit must be null or an int >= 1"):
        make_env({"id": COUNTING, "time_limit": 0}, seed=0)


def test_seeds_distinct_per_index_and_reproducible():
    first = [make_env({"id": "CartPole-v1"}, seed=7, index=i).reset()[0]["vector"] for i in (0, 1, 0)]
    assert not np.array_equal(first[0], first[1])
    np.testing.assert_array_equal(first[0], first[2])
    expected, _ = gym.make("CartPole-v1").reset(seed=derive_seed(7, 1))
    np.testing.assert_array_equal(first[1], expected)
    assert derive_seed(7, 1) == int(np.random.SeedSequence(7).spawn(2)[1].generate_state(1)[0])


def test_action_space_is_seeded_per_index():
    samples = [make_env({"id": "Pendulum-v1"}, seed=3, index=i).action_space.sample() for i in (0, 1, 0)]
    assert samples[0] != samples[1] and samples[0] == samples[2]


def test_explicit_reset_seed_wins():
    env = make_env({"id": "CartPole-v1"}, seed=7, index=0)
    obs, _ = env.reset(seed=123)
    expected, _ = gym.make("CartPole-v1").reset(seed=123)
    np.testing.assert_array_equal(obs["vector"], expected)


def test_user_wrappers_from_yaml_applied_in_order():
    cfg = OmegaConf.create(
        f"""
        id: {COUNTING}
        kwargs: {{length: 4}}
        wrappers:
          - {{_target_: gymnasium.wrappers.ClipReward, max_reward: 2.0}}
        """
    )
    env = make_env(cfg, seed=0)
    env.reset()
    assert [env.step(0)[1] for _ in range(4)] == [1.0, 2.0, 2.0, 2.0]


def test_user_wrapper_without_target_raises():
    with pytest.raises(ValueError, match="needs a _target_"):
        make_env({"id": COUNTING, "wrappers": [{"max_reward": 1.0}]}, seed=0)


def test_image_obs_become_chw_uint8():
    env = make_env({"id": "reverie.envs.testing.ImageCountingEnv", "kwargs": {"length": 3, "size": 64}}, seed=0)
    assert env.observation_space["image"] == spaces.Box(0, 255, (3, 64, 64), np.uint8)
    env.reset()
    env.reset()  # episode 1
    obs, *_ = env.step(0)
    image = obs["image"]
    assert list(obs) == ["image"] and image.dtype == np.uint8 and image.shape == (3, 64, 64)
    assert (image[0] == 1).all() and (image[1] == 1).all() and (image[2] == 0).all()
    env.step(0)
    obs, *_ = env.step(0)
    assert (obs["image"][0] == 3).all()


def test_dict_obs_keep_keys_and_convert_each():
    env = make_env({"id": "reverie.envs.testing.ImageCountingEnv", "kwargs": {"size": 8, "dict_obs": True}}, seed=0)
    obs, _ = env.reset()
    assert sorted(obs) == ["image", "vector"]
    assert obs["image"].shape == (3, 8, 8) and obs["image"].dtype == np.uint8
    assert obs["vector"].shape == (1,) and obs["vector"].dtype == np.float32


def test_non_float_box_obs_flattened_to_float32():
    cfg = {
        "id": "reverie.envs.testing.SpaceEnv",
        "kwargs": {"observation_space": spaces.Box(0, 9, (2, 3), np.int64), "action_space": spaces.Discrete(2)},
    }
    env = make_env(cfg, seed=0)
    obs, _ = env.reset()
    assert env.observation_space["vector"].shape == (6,)
    assert obs["vector"].dtype == np.float32 and obs["vector"].shape == (6,)


def test_action_spec_rejects_other_spaces():
    assert action_spec(spaces.Discrete(4)) == ActionSpec(True, 4)
    assert action_spec(spaces.Box(-1, 1, (3,))) == ActionSpec(False, 3)
    with pytest.raises(UnsupportedSpaceError, match="MultiBinary"):
        action_spec(spaces.MultiBinary(3))


def test_to_env_action_exact():
    discrete = to_env_action(np.array([[0.1, 0.7, 0.2], [1.0, 0.0, 0.0]], np.float32), ActionSpec(True, 3))
    assert discrete.dtype == np.int64 and discrete.tolist() == [1, 0]
    cont = to_env_action(np.array([[1.5, -0.25], [-3.0, 1.0]], np.float32), ActionSpec(False, 2))
    assert cont.dtype == np.float32 and cont.tolist() == [[1.0, -0.25], [-1.0, 1.0]]
    with pytest.raises(ValueError, match=r"shape \(N, 2\), got \(2,\)"):
        to_env_action(np.zeros(2, np.float32), ActionSpec(False, 2))
