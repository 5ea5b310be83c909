import pytest
import torch

from reverie.checkpoint import find_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def test_keeps_newest_k_and_loads_the_newest(tmp_path):
    for step in (5, 100, 20, 7):
        save_checkpoint(tmp_path / "checkpoints", step, {"step": step, "x": torch.tensor([step])}, keep=2)
    names = [p.name for p in list_checkpoints(tmp_path / "checkpoints")]
    assert names == ["ckpt_0000000020.pt", "ckpt_0000000100.pt"]  # oldest removed, ordered by step
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    assert load_checkpoint(tmp_path)["step"] == 100  # a run directory resolves to its newest checkpoint
    assert find_checkpoint(tmp_path / "checkpoints" / "ckpt_0000000020.pt").name == "ckpt_0000000020.pt"


def test_missing_checkpoint_error_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        find_checkpoint(tmp_path)
