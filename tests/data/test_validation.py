"""Every bad dataset gives its own error, naming the episode and the key, before anything is written."""

import re
import numpy as np
import pytest

from reverie.cli import main
from reverie.configs.compose import load_config
from reverie.data import DatasetError, load_dataset
from reverie.data.npz import write_npz
from reverie.data.record import record

CARTPOLE = ["exp=debug"]
PENDULUM = ["exp=debug", "env=pendulum"]


def recorded(tmp_path, overrides, episodes=3):
    """A good npz dataset (random policy) in tmp_path/good and its episodes."""
    env_cfg = load_config(overrides).env
    eps, _ = record(env_cfg, "random", episodes=episodes, seed=0)
    write_npz(tmp_path / "good", eps)
    return env_cfg, eps


def broken(tmp_path, episodes, index, change):
    """The episodes with episode ``index``'s rows changed by ``change(rows)``, written to tmp_path/bad."""
    for i, e in enumerate(episodes):
        rows = {k: v.copy() for k, v in e.rows.items()}
        if i == index:
            change(rows)
        write_npz(tmp_path / "bad", [type(e)(e.name, rows)])
    return tmp_path / "bad"


def drop(key):
    return lambda rows: rows.pop(key)


def setter(key, row, value):
    def change(rows):
        rows[key][row] = value
    return change


CASES = {  # name -> (env, change of episode 1, expected message)
    "missing key": (CARTPOLE, drop("reward"), "episode 'episode_000001.npz', key 'reward': missing"),
    "missing obs key": (CARTPOLE, drop("vector"), "episode 'episode_000001.npz', key 'vector': missing"),
    "lengths": (CARTPOLE, lambda r: r.update(action=r["action"][:-1]),
                "key 'action': has {short} rows but the episode has {T} steps"),
    "obs shape": (CARTPOLE, lambda r: r.update(vector=r["vector"][:, :3]),
                  "key 'vector': has rows of shape (3,), but the observation space of CartPole-v1 has (4,)"),
    "obs dtype": (CARTPOLE, lambda r: r.update(vector=r["vector"].astype("U8")), "key 'vector': has dtype <U8, not"),
    "nan obs": (CARTPOLE, setter("vector", 3, np.nan), "key 'vector': holds NaN at row 3"),
    "inf reward": (CARTPOLE, setter("reward", 2, np.inf), "key 'reward': holds an infinite value at row 2"),
    "nan action": (PENDULUM, setter("action", 4, np.nan), "key 'action': holds NaN at row 4"),
    "box action": (PENDULUM, setter("action", 5, 1.5), "key 'action': row 5 is [1.5], outside the action space "
                                                       "Box(-1, 1, (1,)) of Pendulum-v1"),
    "one-hot": (CARTPOLE, setter("action", 2, [1.0, 1.0]), "key 'action': row 2 is [1.0, 1.0], not a one-hot"),
    "index": (CARTPOLE, lambda r: r.update(action=np.full(len(r["reward"]), 2)),
              "key 'action': row 0 is index 2, outside Discrete(2) of CartPole-v1"),
    "action dim": (CARTPOLE, lambda r: r.update(action=np.zeros((len(r["reward"]), 3), np.float32)),
                   "key 'action': has rows of shape (3,), but the format needs (2,)"),
    "flag type": (CARTPOLE, lambda r: r.update(is_last=r["is_last"].astype(np.float32) * 2),
                  "key 'is_last': must hold booleans (or 0/1)"),
    "no is_first": (CARTPOLE, setter("is_first", 0, False), "key 'is_first': row 0 must be True"),
    "is_first inside": (CARTPOLE, setter("is_first", 4, True), "key 'is_first': is True at row 4"),
    "is_last inside": (CARTPOLE, setter("is_last", 6, True), "key 'is_last': is True at row 6, before the last row"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_dataset_names_its_episode_and_key(tmp_path, case):
    env, change, message = CASES[case]
    env_cfg, episodes = recorded(tmp_path, env)
    message = message.format(T=len(episodes[1]), short=len(episodes[1]) - 1)
    with pytest.raises(DatasetError, match=f"^dataset error: .*{re.escape(message)}"):
        load_dataset(broken(tmp_path, episodes, 1, change), env_cfg)


def test_integer_indices_and_zero_actions_on_last_rows_are_accepted(tmp_path):
    env_cfg, episodes = recorded(tmp_path, CARTPOLE)
    indices = broken(tmp_path, episodes, 0, lambda r: r.update(action=r["action"].argmax(1)))
    got = load_dataset(indices, env_cfg).episodes[0].rows["action"]
    np.testing.assert_array_equal(got[:-1], episodes[0].rows["action"][:-1])  # indices -> one-hot rows
    assert got.dtype == np.float32 and got[-1].sum() == 1.0  # index 0 on the last row is one-hot too


def test_a_dataset_of_another_env_and_an_empty_folder(tmp_path):
    recorded(tmp_path, PENDULUM)
    with pytest.raises(DatasetError, match="key 'vector': has rows of shape \\(3,\\), but the observation space of "
                                           "CartPole-v1 has \\(4,\\)"):
        load_dataset(tmp_path / "good", load_config(CARTPOLE).env)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="holds no dataset; pass a folder of episode .npz files"):
        load_dataset(tmp_path / "empty", load_config(CARTPOLE).env)
    with pytest.raises(DatasetError, match="'nowhere' does not exist"):
        load_dataset("nowhere", load_config(CARTPOLE).env)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "episode_000000.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="episode 'episode_000000.npz': is not a readable .npz archive") as err:
        load_dataset(tmp_path / "junk", load_config(CARTPOLE).env)
    assert (f"Drop the file ({tmp_path / 'junk' / 'episode_000000.npz'}; the other episodes load without it) or "
            f"record it again into that folder (`reverie record --out {tmp_path / 'junk'} ...` adds episodes)"
            ) in str(err.value)


def test_minari_spaces_and_actions_are_checked(tmp_path):
    pytest.importorskip("minari")
    from reverie.envs.convert import SpaceConverter
    from reverie.envs.minari_data import write_minari

    env_cfg, episodes = recorded(tmp_path, PENDULUM, episodes=2)
    converter = SpaceConverter(env_cfg)
    write_minari(episodes, converter, env_cfg, folder=tmp_path / "pendulum")
    with pytest.raises(DatasetError, match="Minari dataset 'reverie/pendulum-v0', key 'observations': its space "
                                           "Box.*differs from the env's own Box"):
        load_dataset(tmp_path / "pendulum", load_config(CARTPOLE).env)
    torque = converter.raw_actions  # the env's own actions are torques in [-2, 2]: write one of 3.0
    converter.raw_actions = lambda a: np.where(np.arange(len(a))[:, None] == 2, 3.0, torque(a)).astype(np.float32)
    write_minari(episodes, converter, env_cfg, folder=tmp_path / "too_strong")
    with pytest.raises(DatasetError, match="episode 'minari reverie/too_strong-v0 episode 0', key 'actions': row 2 "
                                           "holds 3.0 at index 0, outside Box\\(-2.0, 2.0"):
        load_dataset(tmp_path / "too_strong", env_cfg)


def test_pretrain_refuses_a_bad_dataset_before_writing_anything(tmp_path, capsys):
    env_cfg, episodes = recorded(tmp_path, CARTPOLE, episodes=4)
    bad = broken(tmp_path, episodes, 3, setter("vector", 1, np.nan))  # the last episode: the others are fine
    assert main(["pretrain", str(bad), *CARTPOLE, f"run_dir={tmp_path / 'run'}"]) == 2
    assert "dataset error: episode 'episode_000003.npz', key 'vector': holds NaN at row 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["pretrain", str(tmp_path / "good"), *CARTPOLE, "replay.capacity=16",
                 f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert f"the dataset has {sum(len(e) for e in episodes)} steps but replay.capacity=16 holds 4 rows per env column" \
           in err and "set replay.capacity >=" in err
    assert not (tmp_path / "run").exists()
