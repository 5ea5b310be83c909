"""Minari datasets (Farama's offline RL format) <-> reverie episodes; the only module importing ``minari``
(``pip install 'reverie[minari]'``). Nothing is downloaded: datasets come from a folder or Minari's local root.

A Minari episode of ``T`` steps (``T + 1`` observations) becomes rows (:mod:`reverie.data.episodes`): row 0
``obs_0``, reward 0, ``is_first``; row ``t >= 1`` ``obs_t``, ``rewards[t-1]``, ``is_terminal = terminations[t-1]``,
``is_last`` = that or ``truncations[t-1]``; ``action_t = actions[t]``, zeros at row ``T``. Spaces are the env's own,
converted by :class:`reverie.envs.convert.SpaceConverter`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from reverie.data.episodes import DatasetError, Episode, fail
from reverie.envs.convert import SpaceConverter

PREFIX = "minari:"  # `reverie pretrain minari:<dataset id>`: a dataset installed in Minari's local root
INSTALL = "pip install 'reverie[minari]' (Minari with its HDF5 storage)"


def _minari():
    try:
        import minari
    except ImportError as err:
        raise DatasetError(f"dataset error: reading or writing Minari datasets needs minari: {INSTALL}") from err
    return minari


def data_folder(path: str | Path) -> Path | None:
    """The Minari ``data/`` folder of a dataset folder (or that folder itself), or None when ``path`` is none."""
    path = Path(path)
    for folder in (path / "data", path):
        meta = folder / "metadata.json"
        if meta.is_file():
            try:
                if "data_format" in json.loads(meta.read_text()):
                    return folder
            except ValueError:
                return None
    return None


def installed_folder(dataset_id: str) -> Path | None:
    """The ``data/`` folder of ``dataset_id`` in Minari's local datasets root, or None (nothing is downloaded)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    folder = Path(get_dataset_path(dataset_id)) / "data"
    return folder if folder.is_dir() else None


def open_dataset(source: str | Path):
    """A ``minari.MinariDataset`` from a dataset folder, its ``data/`` folder, ``minari:<id>`` or an installed id.
    DatasetError: minari is not installed, or the id is not installed locally."""
    minari = _minari()
    text = str(source)
    folder = data_folder(text) if not text.startswith(PREFIX) else None
    if folder is None:
        dataset_id = text[len(PREFIX):] if text.startswith(PREFIX) else text
        folder = installed_folder(dataset_id)
        if folder is None:
            known = ", ".join(sorted(minari.list_local_datasets())) or "none"
            raise DatasetError(f"dataset error: no Minari dataset {dataset_id!r} in the local datasets root "
                               f"(installed: {known}); nothing is downloaded: pass a dataset folder, or install it "
                               f"first (`reverie record ... --format minari --minari-id {dataset_id}`, or minari's "
                               f"own tools)")
    return minari.MinariDataset(str(folder))


def read_minari(source: str | Path, converter: SpaceConverter) -> list[Episode]:
    """Every episode of a Minari dataset as replay rows for ``converter``'s env config. DatasetError: spaces not the
    env's own, lengths that do not fit (``T + 1`` observations for ``T`` actions), actions outside the space."""
    dataset = open_dataset(source)
    name = dataset.spec.dataset_id
    for key, theirs, ours in (("observations", dataset.observation_space, converter.raw_observation_space),
                              ("actions", dataset.action_space, converter.raw_action_space)):
        if theirs != ours:
            raise DatasetError(f"dataset error: Minari dataset {name!r}, key {key!r}: its space {theirs} differs from "
                               f"the env's own {ours} (env {converter.env_id}); pretrain with the env config the "
                               f"data was recorded in (env=..., env.wrappers, env.action_repeat)")
    return [_episode(f"minari {name} episode {ep.id}", ep, converter) for ep in dataset.iterate_episodes()]


def _episode(name: str, ep: Any, converter: SpaceConverter) -> Episode:
    steps = len(ep.rewards)
    obs_rows = len(next(iter(ep.observations.values()))) if isinstance(ep.observations, Mapping) else \
        len(ep.observations)
    for key, rows, want in (("observations", obs_rows, steps + 1), ("actions", len(ep.actions), steps),
                            ("terminations", len(ep.terminations), steps), ("truncations", len(ep.truncations), steps)):
        if rows != want:
            raise fail(name, key, f"has {rows} rows but the episode has {steps} rewards; Minari episodes hold T + 1 "
                                  f"observations and T actions, terminations and truncations")
    problem = converter.action_error(ep.actions)
    if problem is not None:
        raise fail(name, "actions", problem)
    actions = converter.actions(ep.actions)  # (T, A)
    terminal = np.asarray(ep.terminations, bool)
    last = terminal | np.asarray(ep.truncations, bool)
    no = np.zeros(1, bool)
    rows = converter.observations(ep.observations)  # (T + 1, ...) per key
    rows |= {"action": np.concatenate([actions, np.zeros_like(actions[:1])]),
             "reward": np.concatenate([np.zeros(1, np.float32), np.asarray(ep.rewards, np.float32)]),
             "is_first": np.concatenate([~no, np.zeros(steps, bool)]),
             "is_last": np.concatenate([no, last]), "is_terminal": np.concatenate([no, terminal])}
    return Episode(name, rows)


def write_minari(episodes: Iterable[Episode], converter: SpaceConverter, env_cfg: Mapping, *,
                 folder: str | Path | None = None, dataset_id: str | None = None,
                 description: str = "", algorithm: str = "reverie record") -> Path:
    """Write validated episodes as a Minari dataset (HDF5, images lossless) in the env's own spaces; returns its
    ``data/`` folder. Exactly one of ``folder`` (``folder/data/``; id ``reverie/<folder name>-v0``) and ``dataset_id``
    (installed in Minari's local root: ``reverie pretrain minari:<id>``). ``gym.spec(env.id)`` is recorded when the
    raw env is exactly ``gym.make(env.id)``. DatasetError: neither or both targets, an existing target or a malformed
    id."""
    minari = _minari()
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.dataset.minari_storage import MinariStorage
    from minari.storage.datasets_root_dir import get_dataset_path

    if (folder is None) == (dataset_id is None):
        raise DatasetError("dataset error: write a Minari dataset either to a folder or under a dataset id")
    if dataset_id is None:
        dataset_id = f"reverie/{re.sub(r'[^-_A-Za-z0-9]', '_', Path(folder).name) or 'dataset'}-v0"
        target = Path(folder) / "data"
    else:
        target = Path(get_dataset_path(dataset_id)) / "data"
    try:
        parse_dataset_id(dataset_id)
    except ValueError as err:
        raise DatasetError(f"dataset error: {err}") from err
    if target.exists():
        raise DatasetError(f"dataset error: a Minari dataset exists already at {target.parent}; choose another "
                           f"--out or --minari-id (Minari datasets are written once)")
    target.parent.mkdir(parents=True, exist_ok=True)
    storage = MinariStorage.new(target, observation_space=converter.raw_observation_space,
                                action_space=converter.raw_action_space, env_spec=_env_spec(env_cfg),
                                data_format="hdf5", jpeg_encoding=False)
    storage.update_metadata({"dataset_id": dataset_id, "minari_version": minari.__version__,
                             "algorithm_name": algorithm, "description": description})
    buffers = []
    for index, episode in enumerate(episodes):
        rows = episode.rows
        obs = converter.raw_observations({k: rows[k] for k in converter.observation_space.spaces})  # (T + 1, ...)
        terminal, last = rows["is_terminal"][1:], rows["is_last"][1:]
        buffers.append(EpisodeBuffer(id=index, observations=obs, actions=converter.raw_actions(rows["action"][:-1]),
                                     rewards=rows["reward"][1:].tolist(), terminations=terminal.tolist(),
                                     truncations=(last & ~terminal).tolist()))
    storage.update_episodes(buffers)
    return target


def _env_spec(env_cfg: Mapping):
    """``gym.spec(env.id)`` when the env's own env is exactly ``gym.make(env.id)``, else None."""
    import gymnasium as gym

    from reverie.envs.factory import _plain

    cfg = _plain(env_cfg)
    plain = ((cfg.get("suite") or "gym") == "gym" and not cfg.get("kwargs") and not cfg.get("wrappers")
             and int(cfg.get("action_repeat", 1) or 1) == 1)
    return gym.spec(cfg["id"]) if plain and cfg.get("id") in gym.registry else None
