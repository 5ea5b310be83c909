"""``reverie scores fetch``: download the official DreamerV3 score files into the reference folder, checksummed.

The files are those of danijar/dreamerv3 at two pinned commits (:data:`RELEASES`): the current ``scores/`` folder
and ``baselines.yaml`` (commit e3f0224, 2026-05-25) into ``<folder>/dreamerv3/``, and the 2023 ``scores/data/``
folder (commit 8fa35f8, 2023-06-13, the release the 2023 paper's numbers come from) into
``<folder>/dreamerv3-2023/``: the layout ``reverie compare`` reads (:mod:`reverie.scores.references`). Every file
is checked against the sha256 pinned here before anything is put in place; a mismatch writes nothing.

Examples::

    reverie scores fetch                          # into $REVERIE_REFERENCE_SCORES, else ./reference_scores/
    reverie scores fetch --dir ~/reference_scores --release dreamerv3-2023
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from reverie.scores.references import REFERENCE_DIR_ENV

BASE_URL = "https://raw.githubusercontent.com/danijar/dreamerv3"
"""Files are fetched from ``<base>/<commit>/<path>`` (``--base-url`` overrides the base, e.g. a ``file://`` mirror)."""

@dataclasses.dataclass(frozen=True)
class Release:
    """One pinned set of score files: the commit, the sub-folder they go to and ``{path in the repo: sha256}``."""

    commit: str
    folder: str
    files: dict[str, str]


_CURRENT = {  # danijar/dreamerv3 at e3f0224: scores/ and the random/human baselines
    "baselines.yaml": "a791b089f2276cc9583c14342c5408e11135b01f8f18be2d23f2a397da0c83e7",
    "scores/atari100k-dreamerv3.json.gz": "c839ef2fd28a5c4b7c6f36151a8d16cb41d4d2fb72338c265850b2b4dd5b5e15",
    "scores/atari100k-ppo_fixhp.json.gz": "8794eee54b57e8ddf65035d2fcbf4a5c8d84918b67cb6949f83d28a4ce47a9f4",
    "scores/atari57-dreamerv3.json.gz": "59af8b6fbb5d83fb9b9e522421112526be3bf857b9ca17bb56ed7aa39610436e",
    "scores/atari57-muzero.json.gz": "5e9b1c29f58ec5fc0c3f4fdc6564432023930081ac87a867374c339f9d6a6c45",
    "scores/atari57-ppo_fixhp.json.gz": "a728e888a790915434fe188ffdaf8516705cc5ea2a856c39db997addfa93b153",
    "scores/dmc_proprio-d4pg.json.gz": "a6d87670d584daef223736948cb08887b66758433431b4a39e735fff7a9e5bdf",
    "scores/dmc_proprio-ddpg.json.gz": "894cde656c479594dbe481487c6f3e784f6dacfbfd88d28f506d0b1c47a61a89",
    "scores/dmc_proprio-dmpo.json.gz": "e270f18cfdc75b0eaac7cf6dda8415ec1677568067b8a77ea021e242ecf72cf4",
    "scores/dmc_proprio-dreamerv3.json.gz": "8182860a8a56dc56836c319fde9b941376621e1e0d474141c7d174ab833cc7f4",
    "scores/dmc_proprio-mpo.json.gz": "cc6de76168519ab697cc8bf8d86ea78770526f741912cc5716724e963c1bd23e",
    "scores/dmc_proprio-ppo_fixhp.json.gz": "8530f273c3a457b95e4819f788a39629e3663f15ef31c13a075c389faf2afe82",
    "scores/dmc_vision-curl.json.gz": "1d024d75c143cfdbdeed63f8d476c669d4be647759b35ef8fd44ae20d679c47d",
    "scores/dmc_vision-dreamerv3.json.gz": "68dd7e83ee6af076734e1edb843a3816cd241736c92e91837e7cf460231b7b08",
    "scores/dmc_vision-drqv2.json.gz": "18f932e73f139f8192d79f84f90d74b4e7bb9e7a089944fa01a8d10895cf1337",
    "scores/dmc_vision-ppo_fixhp.json.gz": "7cd24804d6596759c1bfc52d76c0c95badbd96ceae3239ef1602755c8b17c8e0",
    "scores/dmc_vision-sac.json.gz": "1d8f352472da8016c113053eba46b4274fc3dac20e1a4eb05ed38267e2a26aa9",
    "scores/dmlab30-dreamerv3.json.gz": "bb13d28c90c5f1fdd0e13be710db75bb73571079a1997b06edc66be78bb3b838",
    "scores/dmlab30-impala_deep.json.gz": "9114b16af49087bb80edad2ac91ac5e2a6e959ed37a12b475b78e71049ca7aef",
    "scores/dmlab30-ppo_fixhp.json.gz": "c47924d94c1765d9187a2e95f707e7ba7611a7056ffec872ef92b05021553e79",
    "scores/minecraft_diamond-dreamerv3.json.gz": "8580751af2ed04479056f0159c404747efe42c20e81464c4a04205b94296f09a",
    "scores/minecraft_diamond-impala.json.gz": "dc8174eabf09ac3b24e839f2bf3402218f416d8d3811866d6b53d1b4ec9a3f79",
    "scores/minecraft_diamond-ppo_fixhp.json.gz": "3f1135eef4dd2b49f26f834bbbdb7d321e49cc18437832937404cd267e36a4ac",
    "scores/minecraft_diamond-r2d2.json.gz": "2e708fee94bde11b1b7ad845c48d4dabedc20762d99889c6e6bd4cc4bcc3e127",
    "scores/minecraft_diamond-rainbow.json.gz": "cc240d7b00100574993d093bf9cff4cc244fe7a073c49f2265c18d98bc0e5a73",
    "scores/procgen-dreamerv3.json.gz": "72f7e3c119053cd907a618fac72b909dd393617c919b5ea3b960f27955bbe0d0",
    "scores/procgen-ppg.json.gz": "d843ca993dd005de1b61ef5a1badc201f5a0599affb63f319b71dccdac8f51c2",
    "scores/procgen-ppo_fixhp.json.gz": "0d8a07301a0d48b1d77fc0e105e35b4645f78983c35231af61231479473bc1be",
}
_2023 = {  # danijar/dreamerv3 at 8fa35f8: scores/data/
    "scores/data/atari100k_dreamerv3.json.gz": "49d940ba61de8a9d1c355fc8d8c03aea1999922e80409276ee964f7337f958f8",
    "scores/data/atari200m_c51.json.gz": "f0848e665121f313e8db93297752a6134596e2bfbc22839d0ffbdf61940df1ea",
    "scores/data/atari200m_dqn.json.gz": "db2a8d00564f25e30cf98c80b4101d8e434244197bc6088d6aadcc60d9c29818",
    "scores/data/atari200m_dreamerv2.json.gz": "d956a203441532baeb27bfe2c86c1e021e7f859843b820e6690ca0d9ae8869d0",
    "scores/data/atari200m_dreamerv3.json.gz": "c4e13cd535398aaa1e9f7755c04da45b1b73520984574597d051471914e1e42a",
    "scores/data/atari200m_iqn.json.gz": "a9e736cf9b95215ecf6d37e1eab65386f212af5c8d42013eb98bfd8d10c52e3d",
    "scores/data/atari200m_rainbow.json.gz": "7e54818d1c95fd51cec44bac4c595474d5719fdc8b04161c9522b4dd81bbc189",
    "scores/data/dmcproprio_d4pg.json.gz": "a25b49a1e91c21734939029ba0530a040154d2e7e2709ef30f8054c0b0b73c3b",
    "scores/data/dmcproprio_dmpo.json.gz": "73391fd7c61ebceb74325a985470be73648406b717a299b9beeb4228bc8cbbd2",
    "scores/data/dmcproprio_dreamerv3.json.gz": "cd8658e3d508d00a19c5ede4c901e6570e81c6d62801d9a1ff156193b7a07f34",
    "scores/data/dmcproprio_mpo.json.gz": "c2c23833b3ece6fdb78ada469d3fc0922531cf8d7a6ef3d3102455102830ea79",
    "scores/data/dmcvision_curl.json.gz": "bf645dec1deb8186125d752ac2cc47d890f0cf2f31d01d78e42e6a1b26608829",
    "scores/data/dmcvision_dreamerv3.json.gz": "3d1098aaebb99cb7643bd3272418306b0ed7bde77c3a7966e1bcd3869a7f54a4",
    "scores/data/dmcvision_drq.json.gz": "c0b6f47c3196cf7cf1acd6cdc761a454a163824dfb831062c7eda48c5c56e7f2",
    "scores/data/dmcvision_drqv2.json.gz": "4f27ac79e7b1e5d79c71c449f798b77c710d2975c1987789b2746ba8ca75ea3f",
    "scores/data/dmcvision_sac.json.gz": "80502e56d84f3f97f57cf33f697a9a2e9d27718946668ed531265c22b03afb66",
    "scores/data/dmlab_dreamerv3.json.gz": "6a7d8c0e08dfb6ec77aba8a765cf4c666b2c7781fdfef762ede2e7f7b4df6abd",
}
RELEASES = {
    "dreamerv3": Release("e3f02248693a79dc8b0ebd62c93683888ddaccfe", "dreamerv3", _CURRENT),
    "dreamerv3-2023": Release("8fa35f83eee1ce7e10f3dee0b766587d0a713a60", "dreamerv3-2023", _2023),
}
"""Reference name (as ``reverie compare --reference`` spells it) -> its pinned files (sha256 of each file's bytes,
computed from the files at those commits)."""


class FetchError(RuntimeError):
    """A download that failed or did not match its pinned checksum; nothing of that call was put in place."""


def default_folder() -> Path:
    """``$REVERIE_REFERENCE_SCORES``, else ``reference_scores/`` in the current directory (where compare looks)."""
    return Path(os.environ.get(REFERENCE_DIR_ENV) or Path.cwd() / "reference_scores")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(folder: str | Path, releases: dict[str, Release] | None = None, base_url: str = BASE_URL,
          log=None) -> list[Path]:
    """Download ``releases`` (default :data:`RELEASES`) into ``folder/<release.folder>/<file name>``.

    Files already there with the pinned checksum are kept (no download). The others are downloaded into a
    temporary folder inside ``folder``, all checked, and only then moved into place, so a failed call leaves
    ``folder`` as it was. ``log`` (e.g. ``print``) gets one line per file.

    Returns:
        The paths of every file of ``releases`` in ``folder`` (downloaded or already there).

    Raises:
        FetchError: a download failed, a file's sha256 is not the pinned one, or a file already in ``folder``
            differs from the pinned one (it is left alone: delete it, or fetch into another folder).
    """
    releases = RELEASES if releases is None else releases
    folder = Path(folder)
    log = log or (lambda line: None)
    targets, todo = [], []
    for name, release in releases.items():
        for path, digest in release.files.items():
            target = folder / release.folder / Path(path).name
            targets.append(target)
            if target.is_file():
                if sha256(target) != digest:
                    raise FetchError(f"{target} exists and is not the {name} file {path} at commit "
                                     f"{release.commit[:7]} (sha256 differs); delete it, or fetch into another "
                                     f"folder with --dir")
                log(f"kept {target} (checksum ok)")
                continue
            todo.append((name, release, path, digest, target))
    if not todo:
        return targets
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=folder))
    try:
        staged = []
        for name, release, path, digest, target in todo:
            url = f"{base_url.rstrip('/')}/{release.commit}/{path}"
            part = staging / f"{len(staged)}_{target.name}"
            try:
                with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
                    shutil.copyfileobj(response, out)
            except (urllib.error.URLError, OSError, ValueError) as err:
                raise FetchError(f"could not download {url}: {getattr(err, 'reason', err)}; nothing was written "
                                 f"to {folder}. Check the network (or --base-url), then run it again") from err
            got = sha256(part)
            if got != digest:
                raise FetchError(f"{url} has sha256 {got}, not the pinned {digest}; refusing it, nothing was "
                                 f"written to {folder}. The file at that commit should never change: check "
                                 f"--base-url, or report it if the URL is the official one")
            log(f"fetched {url} (sha256 ok)")
            staged.append((part, target))
        for part, target in staged:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return targets


def cmd_scores(argv: list[str]) -> int:
    """``reverie scores fetch [--dir DIR] [--release NAME ...] [--base-url URL]``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="reverie scores", description=__doc__.split("Examples::")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    get = sub.add_parser("fetch", help="download the official DreamerV3 score files (checksummed)")
    get.add_argument("--dir", default=None, metavar="DIR",
                     help=f"reference folder (default: ${REFERENCE_DIR_ENV}, else ./reference_scores)")
    get.add_argument("--release", nargs="+", choices=list(RELEASES), default=list(RELEASES),
                     help="which pinned file sets (default: both)")
    get.add_argument("--base-url", default=BASE_URL, help=f"where <commit>/<path> is fetched from (default {BASE_URL})")
    args = parser.parse_args(argv)
    folder = Path(args.dir) if args.dir else default_folder()
    try:
        paths = fetch(folder, {name: RELEASES[name] for name in args.release}, args.base_url,
                      log=lambda line: print(f"[reverie] {line}", file=sys.stderr))
    except FetchError as err:
        print(f"scores error: {err}", file=sys.stderr)
        return 2
    found = "" if folder.resolve() == Path.cwd().resolve() / "reference_scores" or os.environ.get(REFERENCE_DIR_ENV) \
        else f" with --reference-dir {folder} (or ${REFERENCE_DIR_ENV}={folder})"
    print(f"[reverie] {len(paths)} score files in {folder} ({', '.join(args.release)}); reverie compare reads them "
          f"from there{found}")
    return 0
