"""Atari protocols through ale-py + Gymnasium's AtariPreprocessing: frames, screens, flags, settings, names.

Pong and Breakout are deterministic here with sticky actions off and no no-ops, so exact numbers are stable.
"""

import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("ale_py", reason="Atari tests need ale-py: pip install -e '.[atari]'")
cv2 = pytest.importorskip("cv2", reason="Atari tests need OpenCV: pip install -e '.[atari]'")

from reverie.configs.compose import load_config  # noqa: E402
from reverie.envs import VectorStepper, make_env, make_vector_env  # noqa: E402
from reverie.envs.atari import StickyActions, ale_id  # noqa: E402

CONFIGS = "reverie/configs/env"
UP = 2  # Pong minimal set: NOOP FIRE RIGHT LEFT RIGHTFIRE LEFTFIRE (RIGHT moves the paddle up)
UP_ROW = np.eye(6, dtype=np.float32)[[UP]]  # (N=1, A=6) one-hot, what VectorStepper takes


def atari(**settings):
    """A deterministic Atari env config: sticky off, no no-ops, minimal actions (override with ``settings``)."""
    return {"suite": "atari", "task": "pong", "sticky": 0.0, "noops": 0, "actions": "minimal", **settings}


def ale_of(env):
    return env.unwrapped.ale


def screen_obs(env):
    """The current ALE screen as the env would return it without pooling: (3, 64, 64) uint8."""
    rgb = ale_of(env).getScreenRGB()
    return np.transpose(cv2.resize(rgb, (64, 64), interpolation=cv2.INTER_AREA), (2, 0, 1))


def test_100_agent_steps_advance_the_ale_frame_counter_by_exactly_400():
    cfg = OmegaConf.load(f"{CONFIGS}/atari100k.yaml")  # 30 no-ops, minimal actions, repeat 4
    env = make_env(cfg, seed=0)
    obs, _ = env.reset()
    start = ale_of(env).getFrameNumber()
    assert 1 <= ale_of(env).getEpisodeFrameNumber() <= 30  # the reset no-ops
    for _ in range(100):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not (terminated or truncated)
    assert ale_of(env).getFrameNumber() - start == 400
    assert obs["image"].dtype == np.uint8 and obs["image"].shape == (3, 64, 64)
    assert env.observation_space["image"].shape == (3, 64, 64)


def test_reset_observation_is_the_freshly_reset_screen():
    env = make_env(atari(max_frames=40), seed=0)
    first, _ = env.reset()
    np.testing.assert_array_equal(first["image"], screen_obs(env))
    assert first["image"].mean() > 50  # Pong's field, not a black buffer
    last = None
    for _ in range(10):
        last, *_ = env.step(UP)
    again, _ = env.reset()
    assert ale_of(env).getEpisodeFrameNumber() == 0
    np.testing.assert_array_equal(again["image"], first["image"])  # deterministic start screen again
    assert not np.array_equal(again["image"], last["image"])  # not the previous episode's last frame


def test_frame_cap_truncates_with_the_true_final_observation():
    """max_frames=80 ends step 20 as a truncation; its image equals step 20 of an uncapped twin (Gymnasium 1.4's
    AtariPreprocessing alone would return step 19's image; from step 14 on the ball moves every step)."""
    capped = VectorStepper(make_vector_env(atari(max_frames=80), seed=0, num_envs=1))
    twin = VectorStepper(make_vector_env(atari(), seed=0, num_envs=1))
    capped.reset(), twin.reset()
    for step in range(1, 21):
        row, episodes = capped.step(UP_ROW)
        twin_row, _ = twin.step(UP_ROW)
        assert bool(row["is_last"][0]) == (step == 20)
        assert not row["is_terminal"][0]
        if step == 19:
            previous = row["image"].copy()
    assert episodes == [{"env": 0, "return": 0.0, "length": 20}]
    np.testing.assert_array_equal(row["image"], twin_row["image"])
    assert not np.array_equal(row["image"], previous)
    row, _ = capped.step(UP_ROW)  # NEXT_STEP: the reset row
    assert row["is_first"][0] and not row["is_last"][0]


def sticky_of(env):
    """The StickyActions wrapper's probability (None without one) and ALE's own (always 0)."""
    while not isinstance(env, StickyActions) and hasattr(env, "env"):
        env = env.env
    p = env.p if isinstance(env, StickyActions) else None
    return p, env.unwrapped.ale.getFloat("repeat_action_probability")


def test_sticky_actions_setting_reaches_the_wrapper_and_changes_dynamics():
    assert sticky_of(make_env(OmegaConf.load(f"{CONFIGS}/atari.yaml"), seed=0)) == (0.25, 0.0)
    assert sticky_of(make_env(OmegaConf.load(f"{CONFIGS}/atari100k.yaml"), seed=0)) == (None, 0.0)
    images = []
    for sticky in (0.0, 0.0, 0.9):
        env = make_env(atari(sticky=sticky), seed=0)
        env.reset()
        for t in range(20):
            obs, *_ = env.step(2 + t % 2)  # alternate up/down: with sticky actions the paddle lags
        images.append(obs["image"])
    np.testing.assert_array_equal(images[0], images[1])
    assert not np.array_equal(images[0], images[2])


def test_noops_setting():
    env = make_env(atari(noops=0), seed=0)
    env.reset()
    assert ale_of(env).getEpisodeFrameNumber() == 0
    counts = []
    for seed in range(6):
        env = make_env(atari(noops=30), seed=seed)
        env.reset()
        counts.append(ale_of(env).getEpisodeFrameNumber())
    assert all(1 <= c <= 30 for c in counts) and len(set(counts)) > 1


@pytest.mark.parametrize("task, actions, n", [("pong", "minimal", 6), ("pong", "full", 18), ("breakout", "minimal", 4)])
def test_action_sets(task, actions, n):
    assert make_env(atari(task=task, actions=actions), seed=0).action_space.n == n


def breakout_rows(life_loss, steps=26):
    """Breakout, always FIRE (ball launched, paddle still): the first life is lost on agent step 25."""
    stepper = VectorStepper(make_vector_env(atari(task="breakout", life_loss=life_loss), seed=0, num_envs=1))
    fire = np.eye(4, dtype=np.float32)[[1]]
    rows = [stepper.reset()]
    for _ in range(steps):
        rows.append(stepper.step(fire)[0])
    lives = stepper.env.envs[0].unwrapped.ale.lives()
    return rows, lives, stepper.env.envs[0]


def flags(rows, key):
    return [i for i, row in enumerate(rows) if row[key][0]]


def test_life_loss_ignore():
    rows, lives, _ = breakout_rows("ignore")
    assert lives == 4  # a life was lost on the way ...
    assert flags(rows, "is_terminal") == [] and flags(rows, "is_last") == []  # ... and nothing was flagged


def test_life_loss_terminal_sets_is_terminal_and_the_episode_goes_on():
    rows, lives, env = breakout_rows("terminal")
    assert flags(rows, "is_terminal") == [25]
    assert flags(rows, "is_last") == [] and flags(rows, "is_first") == [0]
    assert lives == 4 and env.unwrapped.ale.getEpisodeFrameNumber() > 100  # same game, one life fewer


def test_life_loss_reset_ends_the_episode_and_restarts_the_game():
    rows, lives, env = breakout_rows("reset")
    assert flags(rows, "is_terminal") == [25] and flags(rows, "is_last") == [25]
    assert flags(rows, "is_first") == [0, 26]
    assert lives == 5 and env.unwrapped.ale.getEpisodeFrameNumber() == 0  # a new game


@pytest.mark.parametrize("name", ["pong", "Pong", "ALE/Pong-v5", "atari_pong", "PongNoFrameskip-v4"])
def test_task_spellings(name):
    assert ale_id(name) == "ALE/Pong-v5"


def test_task_names_with_words():
    assert ale_id("ms_pacman") == "ALE/MsPacman-v5" and ale_id("james_bond") == "ALE/Jamesbond-v5"


def test_bad_task_name_says_how_names_map():
    with pytest.raises(ValueError, match=r"env.task='pongg' is not an Atari game.*pong -> ALE/Pong-v5.*"
                                         r"Close names: pong\b"):
        make_env(atari(task="pongg"), seed=0)


@pytest.mark.parametrize("key, value, message", [
    ("life_loss", "discount", r"env.life_loss must be one of \('ignore', 'terminal', 'reset'\)"),
    ("actions", "all", r"env.actions must be one of \('minimal', 'full'\)"),
    ("sticky", 1.5, r"env.sticky .* must be in \[0, 1\]"),
    ("noops", -1, r"env.noops must be an int >= 0"),
    ("backend", "gpu", r"env.backend must be one of \('ale', 'envpool'\)"),
])
def test_bad_settings_raise_naming_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        make_env(atari(**{key: value}), seed=0)


def test_presets_compose():
    cfg = load_config(["exp=atari100k", "env.task=breakout"])
    assert (cfg.env.suite, cfg.env.task, cfg.env.sticky, cfg.env.noops, cfg.env.actions) == (
        "atari", "breakout", 0.0, 30, "minimal")
    assert (cfg.env.action_repeat, cfg.env.max_frames, cfg.env.size, cfg.env.life_loss) == (4, 108000, 64, "ignore")
    assert (cfg.agent.train_ratio, cfg.train.steps, cfg.train.eval_episodes, cfg.train.eval_mode) == (
        1024, 100000, 100, "sample")
    assert cfg.size.deter == 512  # size s
    cfg = load_config(["env=atari"])
    assert (cfg.env.sticky, cfg.env.noops, cfg.env.actions, cfg.env.action_repeat) == (0.25, 0, "full", 4)


# --- envpool backend (optional) ------------------------------------------------------------------------------


def test_envpool_and_ale_backends_agree_on_the_protocol():
    """Same frames per agent step, pooling and resize (identical pixels), shapes, dtypes, rewards and flags.

    noops=1: envpool always plays >= 1 reset NOOP, so both play exactly one. max_frames=401 = 1 noop + 100 x 4:
    both truncate at agent step 100 (envpool counts 401 // 4 = 100 agent steps).
    """
    pytest.importorskip("envpool", reason="envpool is optional: pip install envpool")
    cfg = atari(noops=1, max_frames=401)
    ale = VectorStepper(make_vector_env({**cfg, "backend": "ale"}, seed=0, num_envs=2))
    pool = VectorStepper(make_vector_env({**cfg, "backend": "envpool"}, seed=0, num_envs=2))
    assert type(pool.env).__name__ == "EnvpoolAtari"
    assert pool.env.single_observation_space == ale.env.single_observation_space
    assert pool.action_spec == ale.action_spec
    rows = [(ale.reset(), pool.reset())]
    rng = np.random.default_rng(0)
    for _ in range(102):
        action = np.eye(6, dtype=np.float32)[rng.integers(6, size=2)]
        rows.append((ale.step(action)[0], pool.step(action)[0]))
    for a, p in rows:
        assert set(a) == set(p)
        for key in a:
            assert a[key].dtype == p[key].dtype and a[key].shape == p[key].shape, key
            np.testing.assert_array_equal(a[key], p[key], err_msg=key)
    assert [i for i, (a, _) in enumerate(rows) if a["is_last"].all()] == [100]
    assert [i for i, (a, _) in enumerate(rows) if a["is_first"].all()] == [0, 101]
    frames = pool.env.call("render")
    assert len(frames) == 2 and frames[0].shape == (64, 64, 3)
    ale.close(), pool.close()


def test_envpool_refuses_life_loss_reset_and_wrappers_at_start_up():
    """Checked by the settings, so ``make_env`` (what ``reverie train`` builds first) fails too, envpool or not."""
    with pytest.raises(ValueError, match="does not offer env.life_loss=reset"):
        make_env(atari(backend="envpool", life_loss="reset"), seed=0)
    wrappers = [{"_target_": "gymnasium.wrappers.ClipReward", "max_reward": 1.0}]
    with pytest.raises(ValueError, match="cannot wrap envpool's batched env"):
        make_env(atari(backend="envpool", wrappers=wrappers), seed=0)


class FrameLog:
    """A stand-in for ALE's env under StickyActions: records the action each frame executes."""

    def __init__(self):
        self.executed = []
        self.observation_space = self.action_space = None
        self.metadata, self.render_mode, self.spec = {}, None, None

    def reset(self, seed=None, options=None):
        return None, {}

    def step(self, action):
        self.executed.append(action)
        return None, 0.0, False, False, {}


def test_sticky_actions_follow_ales_rule_and_statistics():
    """ALE's rule per frame: with probability p the previous frame's executed action again, NOOP after a reset.
    Asking a new action every frame (1, 2, 3, ...), the action a frame executes is the one asked k frames earlier
    with probability p^k (1 - p): k = 0, 1, 2 at 0.75, 0.1875, 0.046875 for p = 0.25, each within 4 sigma over
    20,000 frames."""
    log = FrameLog()
    env = StickyActions.__new__(StickyActions)
    env.env, env.p, env.last, env.rng = log, 0.25, StickyActions.NOOP, np.random.default_rng()
    env.reset(seed=0)
    frames = 20_000
    for t in range(frames):
        env.step(t + 1)
    executed = np.array(log.executed)
    lag = np.arange(1, frames + 1) - executed  # 0: the asked action; k: the one asked k frames earlier
    assert executed[0] in (0, 1)  # the first frame after a reset can only repeat NOOP
    for k in range(3):
        expected = 0.25 ** k * 0.75
        assert abs((lag[1:] == k).mean() - expected) < 4 * np.sqrt(expected * (1 - expected) / frames), k
    env.reset()
    env.step(7)
    assert log.executed[-1] in (0, 7)  # after a reset the previous action is NOOP again
    zero = StickyActions.__new__(StickyActions)
    zero.env, zero.p, zero.last, zero.rng = FrameLog(), 0.0, 0, np.random.default_rng(0)
    for t in range(100):
        zero.step(t + 1)
    assert zero.env.executed == list(range(1, 101))  # p = 0: ALE without sticky actions
