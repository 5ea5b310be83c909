"""Official DreamerV3 checkpoints in reverie (issue 40 item 2): ``reverie import-official`` loads a checkpoint written
by the official code's own checkpoint code (tests/goldens/data/checkpoints, made by ``bench/goldens.py
--checkpoint`` at the goldens' tiny size, after their update 2) into the matching reverie agent; ``reverie eval``
then runs it. The parameters arrive unchanged up to the map's layout changes (checked against the official arrays
through the map), errors name the problem before anything is written, and the reader runs no pickled code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from reverie.agents.official import (_ArraysOnly, dmc_layout, load_official, read_official_checkpoint,
                                     to_reverie)
from reverie.cli import main
from reverie.configs.compose import ConfigError
from reverie.state.official_run import import_official
from reverie.state.saved_run import load_run

pytest.importorskip("dm_control")

CHECKPOINTS = Path(__file__).parent / "data" / "checkpoints"
SIZES = {  # the goldens' official flags as reverie overrides (bench/goldens.py FLAGS, FLAGS_2023)
    "2025": ["agent=dreamerv3_2025", "agent.module.dynamics.deter=16", "agent.module.dynamics.hidden=8",
             "agent.module.dynamics.stoch=4", "agent.module.dynamics.classes=4", "agent.module.dynamics.blocks=2",
             "agent.module.units=8"],
    "2023": ["agent=dreamerv3", "agent.module.dynamics.deter=16", "agent.module.dynamics.units=8",
             "agent.module.dynamics.stoch=4", "agent.module.dynamics.classes=4", "agent.module.units=8",
             "agent.module.layers=2", "agent.module.mlp_units=8", "agent.module.mlp_layers=2"],
}
ENV = ["env=dmc_proprio", "env.task=cartpole_swingup", "env.num_envs=1"]  # position (3,), velocity (2,), 1 action


@pytest.fixture(autouse=True)
def _headless(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))


@pytest.mark.parametrize("version", ["2025", "2023"])
def test_an_official_checkpoint_imports_and_evaluates(version, tmp_path):
    checkpoint = CHECKPOINTS / f"official{version}"
    run_dir = import_official(checkpoint, [*SIZES[version], *ENV, f"run_dir={tmp_path / 'run'}"])
    run = load_run(run_dir)
    _, params = read_official_checkpoint(checkpoint)
    layout = {"vector": [("position", 3), ("velocity", 2)]}  # reverie's DMC vector: dm_control's order
    expected = to_reverie(run.agent, params, layout)
    state = dict(run.agent.named_parameters()) | dict(run.agent.named_buffers())
    assert set(expected) == set(state)  # every reverie parameter and buffer comes from the checkpoint
    for key, value in expected.items():
        assert torch.equal(state[key], torch.as_tensor(value.copy())), key
    # an official parameter after its update 2 (the goldens' param2) is the reverie parameter
    name = "dyn/dynin0/kernel" if version == "2025" else "agent/wm/rssm/gru/kernel"
    assert np.array_equal(params[name], np.load(Path(__file__).parent / "data" /
                                                 f"official{version}_vector_continuous.npz")[f"param2/{name}"])
    assert main(["eval", str(run_dir), "--episodes", "1", "--no-video", "--out", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "eval" / "returns.json").is_file()
    # init_from (with init.keep_data=false: an import holds no replay) loads the same weights into a new agent
    from reverie.configs.compose import check_init, check_setup, load_config

    cfg = load_config([*SIZES[version], *ENV, f"init_from={run_dir}", "init.keep_data=false"])
    setup = check_setup(cfg)
    assert check_init(cfg, setup, 1) is None
    fresh = dict(setup[0].named_parameters())
    for key, value in expected.items():
        if key in fresh:
            assert torch.equal(fresh[key].detach(), torch.as_tensor(value.copy())), key


def test_a_checkpoint_of_the_other_version_or_size_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="2023 official code, whose reverie agent is agent=dreamerv3;"):
        import_official(CHECKPOINTS / "official2023", [*SIZES["2025"], *ENV, f"run_dir={tmp_path / 'a'}"])
    with pytest.raises(ConfigError, match="has no place in this DreamerV3_2025|becomes|has shape"):
        import_official(CHECKPOINTS / "official2025", ["agent=dreamerv3_2025", *ENV, f"run_dir={tmp_path / 'b'}"])
    with pytest.raises(ConfigError, match="no official DreamerV3 checkpoint"):
        import_official(tmp_path, [*SIZES["2025"], *ENV, f"run_dir={tmp_path / 'c'}"])
    assert not any((tmp_path / d).exists() for d in "abc")


def test_the_dmc_layout_reorders_sorted_official_keys_into_dm_control_order():
    """walker's dm_control order is orientations (14), height (1), velocity (9); the 2025 encoder sorts its keys
    (height, orientations, velocity). Each official input row holds its own index, so the reverie weight's
    columns must read 1..14, 0, 15..23."""
    from reverie.agents import DreamerV3_2025
    from reverie.types import ActionSpec

    agent = DreamerV3_2025({"vector": (24,)}, ActionSpec(False, 6), units=8,
                           dynamics=dict(deter=16, hidden=8, stoch=4, classes=4, blocks=2), kernels="off",
                           precision="float32")
    widths = {"orientations": 14, "height": 1, "velocity": 9}
    params = {f"dec/vec/{k}/pred/bias": np.zeros(w, np.float32) for k, w in widths.items()}
    layout = dmc_layout(params, ["orientations", "height", "velocity"])
    assert layout == {"vector": [("orientations", 14), ("height", 1), ("velocity", 9)]}
    kernel = np.repeat(np.arange(24, dtype=np.float32)[:, None], 8, 1)  # official rows: height, orientations, ...
    weight = to_reverie(agent, {"enc/mlp0/kernel": kernel}, layout)["wm.encoder.hidden.0.0.weight"]
    assert weight[0].tolist() == [*range(1, 15), 0, *range(15, 24)]
    with pytest.raises(KeyError, match="no decoder output for 'orientations'"):
        dmc_layout({}, ["orientations"])
    with pytest.raises(KeyError, match="has no place"):
        load_official(agent, {"enc/unknown/kernel": kernel})


class _Exploit:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_the_checkpoint_reader_runs_no_pickled_code(tmp_path):
    blob = pickle.dumps({"agent": {"w": np.ones(2, np.float32)}, "x": _Exploit(tmp_path / "pwned")})
    data = _ArraysOnly(__import__("io").BytesIO(blob)).load()
    assert not (tmp_path / "pwned").exists()
    assert np.array_equal(data["agent"]["w"], np.ones(2, np.float32))
