"""``reverie scores fetch``: pinned files into the reference folder, checked by sha256, nothing half-written.

No network: the tests serve small fake files from a ``file://`` base laid out as ``<base>/<commit>/<path>``, with
their checksums computed here by hashlib, and pass that base as the URL override.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from conftest import make_run
from reverie.cli import main
from reverie.scores import fetch as fetch_module
from reverie.scores.cli import cmd_compare
from reverie.scores.fetch import FetchError, Release, fetch

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def serve(root: Path, commit: str, files: dict[str, bytes]) -> dict[str, str]:
    """Write ``files`` under ``root/<commit>/`` (what ``<base>/<commit>/<path>`` resolves to); ``{path: sha256}``."""
    for path, data in files.items():
        (root / commit / path).parent.mkdir(parents=True, exist_ok=True)
        (root / commit / path).write_bytes(data)
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


@pytest.fixture
def mirror(tmp_path):
    """``(base URL, releases)``: a current-style and a 2023-style release of two files each."""
    root = tmp_path / "mirror"
    current = serve(root, COMMIT_A, {"scores/atari100k-dreamerv3.json.gz": b"current atari",
                                     "baselines.yaml": b"pong: [1, 2]\n"})
    old = serve(root, COMMIT_B, {"scores/data/atari100k_dreamerv3.json.gz": b"2023 atari",
                                 "scores/data/dmcvision_drqv2.json.gz": b"2023 drqv2"})
    releases = {"dreamerv3": Release(COMMIT_A, "dreamerv3", current),
                "dreamerv3-2023": Release(COMMIT_B, "dreamerv3-2023", old)}
    return root.as_uri(), releases


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fetch_lays_out_the_folder_compare_reads(mirror, tmp_path):
    base, releases = mirror
    paths = fetch(tmp_path / "ref", releases, base)
    assert tree(tmp_path / "ref") == {
        "dreamerv3/atari100k-dreamerv3.json.gz": b"current atari", "dreamerv3/baselines.yaml": b"pong: [1, 2]\n",
        "dreamerv3-2023/atari100k_dreamerv3.json.gz": b"2023 atari",
        "dreamerv3-2023/dmcvision_drqv2.json.gz": b"2023 drqv2"}
    assert sorted(paths) == sorted(tmp_path / "ref" / p for p in tree(tmp_path / "ref"))
    # a second call finds every file in place with its checksum and downloads nothing (the mirror is gone)
    for path in (tmp_path / "mirror").rglob("*.gz"):
        path.unlink()
    assert sorted(fetch(tmp_path / "ref", releases, base)) == sorted(paths)


def test_a_checksum_mismatch_is_refused_and_nothing_is_written(mirror, tmp_path):
    base, releases = mirror
    # the second release's last file is served with other bytes than its pinned checksum
    (tmp_path / "mirror" / COMMIT_B / "scores/data/dmcvision_drqv2.json.gz").write_bytes(b"tampered")
    with pytest.raises(FetchError, match=r"dmcvision_drqv2\.json\.gz has sha256 [0-9a-f]{64}, not the pinned "
                                         + releases["dreamerv3-2023"].files["scores/data/dmcvision_drqv2.json.gz"]
                                         + r"; refusing it, nothing was written"):
        fetch(tmp_path / "ref", releases, base)
    assert tree(tmp_path / "ref") == {}  # not even the files that matched, and no staging folder left
    assert list((tmp_path / "ref").iterdir()) == []


def test_a_failed_download_and_a_differing_local_file_leave_the_folder_alone(mirror, tmp_path):
    base, releases = mirror
    (tmp_path / "mirror" / COMMIT_A / "baselines.yaml").unlink()
    with pytest.raises(FetchError, match=r"could not download .*baselines\.yaml.*nothing was written"):
        fetch(tmp_path / "ref", releases, base)
    assert tree(tmp_path / "ref") == {}
    mine = tmp_path / "ref" / "dreamerv3-2023" / "atari100k_dreamerv3.json.gz"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"my own edit")
    with pytest.raises(FetchError, match=r"atari100k_dreamerv3\.json\.gz exists and is not the dreamerv3-2023 file "
                                         r"scores/data/atari100k_dreamerv3\.json\.gz at commit bbbbbbb"):
        fetch(tmp_path / "ref", releases, base)
    assert tree(tmp_path / "ref") == {"dreamerv3-2023/atari100k_dreamerv3.json.gz": b"my own edit"}


def test_the_command_fetches_one_release_and_reports_a_mismatch(mirror, tmp_path, monkeypatch, capsys):
    base, releases = mirror
    monkeypatch.setattr(fetch_module, "RELEASES", releases)
    assert main(["scores", "fetch", "--dir", str(tmp_path / "ref"), "--release", "dreamerv3-2023",
                 "--base-url", base]) == 0
    assert sorted(tree(tmp_path / "ref")) == ["dreamerv3-2023/atari100k_dreamerv3.json.gz",
                                              "dreamerv3-2023/dmcvision_drqv2.json.gz"]
    assert "2 score files in" in capsys.readouterr().out
    (tmp_path / "mirror" / COMMIT_A / "baselines.yaml").write_bytes(b"other")
    assert main(["scores", "fetch", "--dir", str(tmp_path / "ref"), "--base-url", base]) == 2
    assert re.search(r"scores error: .*baselines\.yaml has sha256 .*not the pinned", capsys.readouterr().err)
    assert not (tmp_path / "ref" / "dreamerv3").exists()


def test_the_pinned_releases_are_the_official_layout():
    """Full commits (raw URLs need them), one sha256 per file, the sub-folders compare reads, unique names."""
    for name, release in fetch_module.RELEASES.items():
        assert release.folder == name and re.fullmatch(r"[0-9a-f]{40}", release.commit)
        assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in release.files.values())
        names = [Path(p).name for p in release.files]
        assert len(set(names)) == len(names)
    current, old = fetch_module.RELEASES["dreamerv3"], fetch_module.RELEASES["dreamerv3-2023"]
    assert current.commit.startswith("e3f0224") and old.commit.startswith("8fa35f8")
    assert {"scores/dmc_proprio-dreamerv3.json.gz", "scores/atari100k-dreamerv3.json.gz", "baselines.yaml"} \
        <= set(current.files)
    assert {"scores/data/dmcproprio_dreamerv3.json.gz", "scores/data/atari100k_dreamerv3.json.gz"} <= set(old.files)


def dmc_vision_run(root: Path) -> Path:
    env = {"suite": "dmc", "task": "walker_walk", "action_repeat": 2, "image": True, "proprio": False}
    metadata = {"suite": "dmc", "task": "walker_walk", "action_repeat": 2, "frames_per_agent_step": 2,
                "observations": ["image"], "num_envs": 1}
    return make_run(root, "vision", [(1000, 5.0)], env=env, metadata=metadata, mode="eval", action_repeat=2)


def test_every_compare_message_names_the_fetch_command_when_no_folder_is_found(tmp_path, monkeypatch, capsys):
    """A dmc_vision run with no reference folder anywhere: the error cites the dmc_vision window (it cited
    atari100k's) and says the folder is missing, naming the command; so does a report that succeeds."""
    monkeypatch.delenv("REVERIE_REFERENCE_SCORES", raising=False)
    monkeypatch.chdir(tmp_path)
    dmc_vision_run(tmp_path / "runs")
    assert cmd_compare(["runs", "--no-plots", "--reps", "10"]) == 2
    err = capsys.readouterr().err
    assert "(dmc_vision: [990k, 1M] frames)" in err and "atari100k" not in err
    assert "no reference score folder found" in err and "`reverie scores fetch`" in err
    assert cmd_compare(["runs", "--no-plots", "--reps", "10", "--window", "0", "3000", "--out", "o"]) == 0
    out = capsys.readouterr().out
    assert "Note: no reference score folder found" in out and "`reverie scores fetch`" in out
    assert cmd_compare(["runs", "--no-plots", "--reps", "10", "--reference", "dreamerv3"]) == 2
    assert "no reference score folder found; `reverie scores fetch` downloads" in capsys.readouterr().err
    # --reference none asks for no official scores: no note
    assert cmd_compare(["runs", "--no-plots", "--reps", "10", "--window", "0", "3000", "--out", "o2",
                        "--reference", "none"]) == 0
    assert "reverie scores fetch" not in capsys.readouterr().out


def test_a_fetched_folder_with_both_spellings_resolves_another_method_to_the_current_file(tmp_path):
    from reverie.scores.references import reference_path

    for path in ("dreamerv3/dmc_vision-drqv2.json.gz", "dreamerv3-2023/dmcvision_drqv2.json.gz"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"")
    assert reference_path("dmc_vision", "drqv2", tmp_path) == tmp_path / "dreamerv3/dmc_vision-drqv2.json.gz"
