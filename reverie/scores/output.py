"""Where ``reverie compare`` writes, without ever overwriting an earlier comparison by accident.

Without ``--out``: a new ``compare/<date>_<time>_<label>/`` (``_2``, ... when taken; ``compare/`` is git-ignored).
``--out DIR``: refused before any score is read when DIR holds files, unless ``--overwrite``, which replaces only
:data:`OUTPUT_FILES`.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

DEFAULT_ROOT = Path("compare")

OUTPUT_FILES = ("table.md", "run_scores.csv", "aggregates.csv", "curves.png", "curves.svg", "aggregates.png",
                "aggregates.svg", "difference.png", "difference.svg")
"""Every file compare may write into its output folder."""


def default_dir(label: str, root: Path = DEFAULT_ROOT, now: dt.datetime | None = None) -> Path:
    """A folder name under ``root`` that does not exist yet: ``<date>_<time>_<label>`` (``_2``, ... if taken)."""
    stamp = (now or dt.datetime.now()).strftime("%Y-%m-%d_%H%M%S")
    base = f"{stamp}_{re.sub(r'[^A-Za-z0-9._-]+', '-', label)}"
    path, suffix = root / base, 1
    while path.exists():
        suffix += 1
        path = root / f"{base}_{suffix}"
    return path


def choose_dir(out: str | Path | None, label: str, overwrite: bool) -> Path:
    """The output folder for ``--out out`` (None: :func:`default_dir`); checks only, creates nothing. Raises
    FileExistsError (``out`` a file, or holding files without ``overwrite``) and ValueError (``overwrite`` alone)."""
    if out is None:
        if overwrite:
            raise ValueError("--overwrite needs --out DIR: without --out every call writes a new folder under "
                             f"{DEFAULT_ROOT}/")
        return default_dir(label)
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"--out {path} is a file; give a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        ours = sorted(p.name for p in path.iterdir() if p.name in OUTPUT_FILES)
        what = f"an earlier comparison ({', '.join(ours)})" if ours else "files that compare did not write"
        raise FileExistsError(f"--out {path} already holds {what}; nothing was written. Give a new folder, leave out "
                              f"--out for a new {DEFAULT_ROOT}/<date>_<time>_... folder, or add --overwrite to "
                              f"replace compare's files in {path}")
    return path


def prepare(path: Path) -> None:
    """Create ``path`` and delete the compare files an earlier call left in it (so none is stale)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:
        (path / name).unlink(missing_ok=True)
