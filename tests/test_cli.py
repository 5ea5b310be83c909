"""`reverie train --cfg [--diff]`: the resolved config, or only the keys a preset changes against the reference."""

import re

import pytest

from reverie.cli import main
from reverie.configs.compose import config_diff, load_config


def test_diff_lists_only_the_keys_a_preset_changes():
    lines = config_diff(load_config(["exp=debug"]))
    assert lines[0].startswith("# keys that differ from `reverie train agent=dreamerv3 exp=reference`")
    changes = dict(line.split(": ", 1) for line in lines[1:])
    assert changes["agent.train_ratio"] == "512 -> 64" and changes["agent.batch_size"] == "16 -> 4"
    assert changes["agent.module.dynamics.deter"] == "512 -> 32"  # size=debug, through the dynamics block
    assert changes["agent.module.mlp_units"] == "1024 -> 32"  # the reference's 5 x 1024 vector encoder/decoder
    assert "agent.module.gamma" not in changes and "agent.module.kernels" not in changes  # unchanged keys stay out
    assert config_diff(load_config(["exp=reference"])) == lines[:1]  # the reference against itself: nothing
    planet = dict(line.split(": ", 1) for line in config_diff(load_config(["agent=planet", "exp=debug"]))[1:])
    assert planet["agent.module.dynamics.deter"] == "200 -> 16"
    assert planet["agent.train_ratio"] == "(absent) -> 64"  # exp=debug sets it; PlaNet counts episodes instead


def test_cfg_diff_prints_it_and_diff_alone_is_refused(capsys):
    assert main(["train", "exp=classic", "--cfg", "--diff"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "agent.train_ratio: 512 -> 128" in out and "agent.module.model_lr: 0.0001 -> 0.0003" in out
    # the header and what exp=classic changes for DreamerV3: the world model's and critic's learning rates (the
    # actor's is the reference's 3e-5), the imagined continue's reading, train_ratio, run length, and size xs (with
    # the vector encoder/decoder sized by it) against the reference's size s and 5 x 1024 MLPs
    assert "agent.module.critic_lr: 3e-05 -> 0.001" in out and "agent.module.imag_cont: mode -> prob" in out
    assert sorted(line.split(":")[0] for line in out[1:]) == [
        "agent.module.cnn_depth", "agent.module.critic_lr", "agent.module.dynamics.deter",
        "agent.module.dynamics.units", "agent.module.imag_cont", "agent.module.layers", "agent.module.mlp_layers",
        "agent.module.mlp_units", "agent.module.model_lr", "agent.module.units", "agent.train_ratio", "exp_name",
        "size.cnn_depth", "size.deter", "size.layers", "size.units", "train.eval_every", "train.steps",
        "train.stop_confirm", "train.stop_return"]  # the last three: exp_suite/classic_cartpole.yaml
    assert main(["train", "--diff"]) == 2 and "--diff goes with --cfg" in capsys.readouterr().err



@pytest.mark.parametrize("overrides, name", [  # issue 27: every run was <date>_<time>_debug, whatever ran
    ([], "classic_dreamerv3_CartPole-v1"),
    (["exp=debug", "env=gym", "env.id=Acrobot-v1"], "debug_dreamerv3_Acrobot-v1"),
    (["exp=debug", "env=pendulum"], "debug_dreamerv3_Pendulum-v1"),
    (["exp=debug", "env=dmc_vision", "env.task=walker_walk"], "debug_dreamerv3_dmc_vision-walker_walk"),
    (["exp=dmc_cpu", "env.task=reacher_easy"], "dmc_cpu_dreamerv3_dmc_proprio-reacher_easy"),
    (["exp=atari100k", "env.task=pong"], "atari100k_dreamerv3_atari-pong"),
    (["agent=planet", "exp=debug"], "debug_planet_CartPole-v1"),
    (["agent=dreamerv3_2025", "exp=debug"], "debug_dreamerv3_2025_CartPole-v1"),
    (["env=gym", "env.id=reverie.envs.testing.ImageCountingEnv"], "classic_dreamerv3_ImageCountingEnv"),
    (["env=gym", "env.id=ALE/Pong-v5"], "classic_dreamerv3_ALE-Pong-v5"),  # no folder separator in the name
])
def test_run_folders_name_the_preset_agent_and_env(overrides, name, tmp_path):
    from reverie.configs.compose import make_run_dir

    run_dir = make_run_dir(load_config(overrides), root=tmp_path)
    assert run_dir.parent == tmp_path and run_dir.name[len("2026-12-02_041500_"):] == name
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d{6}_", run_dir.name[:len("2026-12-02_041500_")])
    assert (run_dir / "config.yaml").is_file()


def test_resume_of_a_folder_that_does_not_exist_says_so(tmp_path, capsys):
    missing = tmp_path / "does_not_exist"
    assert main(["train", "--resume", str(missing)]) == 2
    assert f"--resume {missing}: no such folder; pass a run directory written by `reverie train`" in \
        capsys.readouterr().err  # was: no checkpoint under .../does_not_exist/checkpoints
    assert not missing.exists()
    (tmp_path / "file").write_text("")
    assert main(["pretrain", "--resume", str(tmp_path / "file")]) == 2
    assert "file: not a folder; pass a run directory written by `reverie pretrain`" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert f"no checkpoint under {tmp_path / 'empty' / 'checkpoints'}" in capsys.readouterr().err
