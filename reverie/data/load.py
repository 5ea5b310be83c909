"""``load_dataset(source, env_cfg)``: read any supported dataset and validate every episode against an env config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reverie.data.episodes import Dataset, DatasetError, Episode, validate
from reverie.data.npz import is_npz_folder, read_npz
from reverie.data.runs import is_run, read_run

SOURCES = ("a folder of episode .npz files, a Minari dataset folder, minari:<dataset id> (installed locally) or a "
           "run directory of `reverie train` / `reverie pretrain`")


def load_dataset(source: str | Path, env_cfg: Mapping) -> Dataset:
    """Read ``source`` (an npz folder, a Minari dataset folder, ``minari:<id>`` or a bare installed id, or a run
    directory) and validate every episode against ``env_cfg``'s contract spaces before returning any: a
    :class:`Dataset` in canonical dtypes. DatasetError: nothing readable, or what :func:`validate` names;
    UnsupportedSpaceError: the env config's own spaces."""
    from reverie.envs.convert import SpaceConverter
    from reverie.replay import Replay

    converter = SpaceConverter(env_cfg)
    spec = Replay.spec_for(converter.observation_space, converter.action_spec.dim)
    episodes = read_source(source, converter)
    return Dataset(str(source), validate(episodes, spec, converter.action_spec.discrete, env=converter.env_id))


def read_source(source: str | Path, converter) -> list[Episode]:
    """The episodes at ``source`` as read (not validated); see :func:`load_dataset`."""
    text = str(source)
    path = Path(text)
    if path.exists() and is_run(path):
        return read_run(path)
    if path.exists() and is_npz_folder(path):
        return read_npz(path)
    from reverie.envs import minari_data

    if text.startswith(minari_data.PREFIX) or minari_data.data_folder(path) is not None:
        return minari_data.read_minari(text, converter)
    if not path.exists():
        try:  # a bare id of a locally installed Minari dataset
            return minari_data.read_minari(text, converter)
        except DatasetError as err:
            raise DatasetError(f"dataset error: {text!r} does not exist; pass {SOURCES}.\n({err})") from err
    raise DatasetError(f"dataset error: {text!r} holds no dataset; pass {SOURCES}")
