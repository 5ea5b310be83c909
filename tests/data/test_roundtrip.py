"""Round trips of the dataset formats: record -> npz / Minari / a run's replay -> load -> fill -> sample: identical
rows."""

import numpy as np
import pytest

from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.data import load_dataset
from reverie.data.fill import fill_replay
from reverie.data.npz import read_npz, write_npz
from reverie.data.record import record
from reverie.envs.convert import SpaceConverter
from reverie.replay import Replay
from reverie.state.checkpoint import load_checkpoint

COUNTING = ["env=gym", "env.id=reverie.envs.testing.CountingEnv", "+env.kwargs.length=5", "+env.kwargs.obs_dim=2",
            "+env.kwargs.echo_action=true", "env.num_envs=2"]


def env_config(*overrides):
    return load_config(["exp=debug", *overrides]).env


def stream(episodes):
    """All rows of the episodes, joined in order: key -> (steps, ...)."""
    return {k: np.concatenate([e.rows[k] for e in episodes]) for k in episodes[0].rows}


def replay_of(dataset, env_cfg):
    converter = SpaceConverter(env_cfg)
    replay = Replay(dataset.steps, 1, Replay.spec_for(converter.observation_space, converter.action_spec.dim), seed=3)
    fill_replay(replay, dataset.episodes)
    return replay


def assert_same_rows(a, b, exact_action=True):
    assert a.keys() == b.keys()
    for key in a:
        if key == "action" and not exact_action:  # Minari stores the env's torque: rescaled twice in float64
            np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
            assert a[key].dtype == b[key].dtype, key


def assert_windows_are_rows(replay, rows, batch=16, length=4):
    """Every sampled window is a run of consecutive rows of the stream, prev_action the row before's (0 at
    is_first)."""
    sample = replay.sample(batch, length)
    total = len(rows["reward"])
    for b in range(batch):
        starts = [p for p in range(total - length + 1)
                  if all(np.array_equal(sample[k][:, b], rows[k][p:p + length]) for k in rows)]
        assert starts, f"window {b} is not a run of the dataset's rows"
        p = starts[0]
        prev = np.concatenate([rows["action"][p - 1:p] if p else np.zeros_like(rows["action"][:1]),
                               rows["action"][p:p + length - 1]])
        prev[rows["is_first"][p:p + length]] = 0.0
        np.testing.assert_array_equal(sample["prev_action"][:, b], prev)


def test_recorded_rows_keep_the_replay_timing():
    """CountingEnv echoes the action it received into obs[1]: row t's action is what produced row t+1."""
    episodes, description = record(env_config(*COUNTING), "random", episodes=6, seed=1)
    assert len(episodes) == 6 and description == "random, seed 1"
    for e in episodes:
        r = e.rows
        assert len(e) == 6  # the reset row and 5 steps
        np.testing.assert_array_equal(r["vector"][:, 0] % 1000, np.arange(6))  # obs[0] = episode * 1000 + step
        np.testing.assert_array_equal(r["reward"], np.arange(6, dtype=np.float32))  # step s rewards s; reset 0
        assert r["is_first"].tolist() == [True] + [False] * 5
        assert r["is_last"].tolist() == r["is_terminal"].tolist() == [False] * 5 + [True]
        np.testing.assert_array_equal(r["action"][:-1].argmax(1), r["vector"][1:, 1])  # the action the env got
        assert (r["action"][-1] == 0).all()  # the is_last row's action is never used: stored as zeros


@pytest.mark.parametrize("env", [COUNTING, ["env=pendulum"]])
def test_npz_round_trip_gives_identical_rows(tmp_path, env):
    env_cfg = env_config(*env)
    episodes, _ = record(env_cfg, "random", episodes=3, seed=0, epsilon=0.5)
    write_npz(tmp_path / "d", episodes[:2])
    write_npz(tmp_path / "d", episodes[2:])  # appends: numbered after the files there
    assert [p.name for p in sorted((tmp_path / "d").glob("*.npz"))] == [f"episode_00000{i}.npz" for i in range(3)]
    dataset = load_dataset(tmp_path / "d", env_cfg)
    assert [e.name for e in dataset.episodes] == [f"episode_00000{i}.npz" for i in range(3)]
    for got, want in zip(dataset.episodes, episodes):
        assert_same_rows(got.rows, want.rows)
    replay = replay_of(dataset, env_cfg)
    rows = stream(episodes)
    assert_same_rows({k: replay.arrays[k][:, 0] for k in rows}, rows)  # one column: the rows exactly
    assert_windows_are_rows(replay, rows)


@pytest.mark.parametrize("env, exact", [(COUNTING, True), (["env=pendulum"], False),
                                        (["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv",
                                          "+env.kwargs.size=8", "+env.kwargs.length=4", "env.num_envs=1"], True)])
def test_minari_round_trip_gives_identical_rows(tmp_path, env, exact):
    minari = pytest.importorskip("minari")
    from reverie.envs.minari_data import write_minari

    env_cfg = env_config(*env)
    episodes, _ = record(env_cfg, "random", episodes=3, seed=0)
    converter = SpaceConverter(env_cfg)
    folder = write_minari(episodes, converter, env_cfg, folder=tmp_path / "m")
    theirs = minari.MinariDataset(str(folder))  # a plain Minari dataset, in the env's own spaces
    assert theirs.total_episodes == 3 and theirs.total_steps == sum(len(e) - 1 for e in episodes)
    assert theirs.observation_space == converter.raw_observation_space
    dataset = load_dataset(tmp_path / "m", env_cfg)
    for got, want in zip(dataset.episodes, episodes):
        assert_same_rows(got.rows, want.rows, exact_action=exact)
    assert_windows_are_rows(replay_of(dataset, env_cfg), stream(dataset.episodes))


def test_minari_dataset_installed_under_an_id(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    from reverie.data import DatasetError

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "root"))
    assert main(["record", "--format", "minari", "--minari-id", "reverie/counting-v0", "--episodes", "2",
                 "exp=debug", *COUNTING]) == 0
    env_cfg = env_config(*COUNTING)
    by_prefix, bare = load_dataset("minari:reverie/counting-v0", env_cfg), load_dataset("reverie/counting-v0", env_cfg)
    assert len(by_prefix.episodes) == len(bare.episodes) == 2
    assert_same_rows(stream(by_prefix.episodes), stream(bare.episodes))
    with pytest.raises(DatasetError, match="no Minari dataset 'reverie/other-v0'.*installed: reverie/counting-v0"):
        load_dataset("minari:reverie/other-v0", env_cfg)


def test_a_run_replay_reads_back_as_its_rows(tmp_path):
    """One env column and no wrap: the episodes read back from a run hold exactly its replay's rows."""
    run_dir = tmp_path / "run"
    assert main(["train", "exp=debug", *COUNTING, "env.num_envs=1", f"run_dir={run_dir}", "train.steps=40",
                 "train.eval_episodes=1"]) == 0
    episodes = load_dataset(run_dir, env_config(*COUNTING, "env.num_envs=1")).episodes
    folder = load_checkpoint(run_dir)["replay_dir"]
    rows = stream(episodes)
    for key in rows:
        np.testing.assert_array_equal(rows[key], np.load(f"{folder}/{key}.npy")[:40, 0], err_msg=key)
    assert [len(e) for e in episodes] == [6] * 6 + [4]  # the last episode is in flight


def test_fill_splits_the_stream_over_the_columns():
    """10 + 7 rows over 3 columns: 5 rows each, the stream cut in order, each column starting with is_first, and
    17 - 15 = 2 rows left out."""
    from reverie.data import Episode

    def episode(start, length):
        flags = np.zeros(length, bool)
        first, last = flags.copy(), flags.copy()
        first[0], last[-1] = True, True
        return Episode(f"e{start}", {"vector": np.arange(start, start + length, dtype=np.float32)[:, None],
                                     "action": np.zeros((length, 1), np.float32),
                                     "reward": np.ones(length, np.float32), "is_first": first, "is_last": last,
                                     "is_terminal": flags.copy()})

    spec = {"vector": ((1,), np.float32), "action": ((1,), np.float32), "reward": ((), np.float32),
            "is_first": ((), bool), "is_last": ((), bool), "is_terminal": ((), bool)}
    replay = Replay(30, 3, spec)
    assert fill_replay(replay, [episode(0, 10), episode(100, 7)]) == {"rows_per_column": 5, "steps": 15,
                                                                      "left_out": 2}
    assert replay.num_rows == 5 and not replay.wrapped
    np.testing.assert_array_equal(replay.arrays["vector"][:5, :, 0].T, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9],
                                                                       [100, 101, 102, 103, 104]])
    np.testing.assert_array_equal(replay.arrays["is_first"][:5].T, [[1, 0, 0, 0, 0]] * 3)  # column 1 marked
    np.testing.assert_array_equal(replay.arrays["is_last"][:5].T, [[0] * 5, [0, 0, 0, 0, 1], [0] * 5])


def test_epsilon_actions_reach_the_agents_filtering_state():
    """With --epsilon, a world-model agent's next filtering step gets the action the env really took."""
    import torch

    from reverie.data.record import _executed

    latent, mine = {"deter": torch.zeros(2, 3)}, torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    taken = np.array([[0.0, 1.0], [0.0, 1.0]], np.float32)
    state = _executed((latent, mine), taken)
    assert state[0] is latent and torch.equal(state[1], torch.as_tensor(taken))
    assert _executed(None, taken) is None and _executed(("a", "b"), taken) == ("a", "b")
