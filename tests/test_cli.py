"""`reverie train --cfg [--diff]`: the resolved config, or only the keys a preset changes against the reference."""

from reverie.cli import config_diff, load_config, main


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
    # the header and what exp=classic changes for DreamerV3: learning rates, train_ratio, run length, and size xs
    # (with the vector encoder/decoder sized by it) against the reference's size s and 5 x 1024 MLPs
    assert sorted(line.split(":")[0] for line in out[1:]) == [
        "agent.module.actor_lr", "agent.module.cnn_depth", "agent.module.critic_lr", "agent.module.dynamics.deter",
        "agent.module.dynamics.units", "agent.module.layers", "agent.module.mlp_layers", "agent.module.mlp_units",
        "agent.module.model_lr", "agent.module.units", "agent.train_ratio", "exp_name", "size.cnn_depth",
        "size.deter", "size.layers", "size.units", "train.steps"]
    assert main(["train", "--diff"]) == 2 and "--diff goes with --cfg" in capsys.readouterr().err
