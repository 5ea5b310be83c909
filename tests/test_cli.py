"""`reverie train --cfg [--diff]`: the resolved config, or only the keys a preset changes against the reference."""

from reverie.cli import config_diff, load_config, main


def test_diff_lists_only_the_keys_a_preset_changes():
    lines = config_diff(load_config(["exp=debug"]))
    assert lines[0].startswith("# keys that differ from `reverie train agent=dreamerv3 exp=reference`")
    changes = dict(line.split(": ", 1) for line in lines[1:])
    assert changes["agent.train_ratio"] == "512 -> 64" and changes["agent.batch_size"] == "16 -> 4"
    assert changes["agent.module.dynamics.deter"] == "256 -> 32"  # size=debug, through the dynamics block
    assert "agent.module.gamma" not in changes and "agent.module.kernels" not in changes  # unchanged keys stay out
    assert config_diff(load_config(["exp=reference"])) == lines[:1]  # the reference against itself: nothing
    planet = dict(line.split(": ", 1) for line in config_diff(load_config(["agent=planet", "exp=debug"]))[1:])
    assert planet["agent.module.dynamics.deter"] == "200 -> 16"
    assert planet["agent.train_ratio"] == "(absent) -> 64"  # exp=debug sets it; PlaNet counts episodes instead


def test_cfg_diff_prints_it_and_diff_alone_is_refused(capsys):
    assert main(["train", "exp=classic", "--cfg", "--diff"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "agent.train_ratio: 512 -> 128" in out and "agent.module.model_lr: 0.0001 -> 0.0003" in out
    assert len(out) == 7  # the header and what exp=classic changes for DreamerV3
    assert main(["train", "--diff"]) == 2 and "--diff goes with --cfg" in capsys.readouterr().err
