"""Where the official score files are, and which file a ``--reference`` name or path means (``docs/compare.md``).

A reference folder (``--reference-dir``, ``$REVERIE_REFERENCE_SCORES`` or ``reference_scores/`` here or next to
here) holds danijar/dreamerv3 ``scores/`` files, directly or one sub-folder deep: ``dreamerv3/<suite>-<method>.json.gz``
(current names), ``dreamerv3-2023/<suite without _>_<method>.json.gz`` (2023 names), other methods' files. A
reference is a :data:`BUILTIN` name (labelled with it), another method's name (its one file, the current spelling
winning) or a file path; those two are labelled with the file's own ``method``.
"""

from __future__ import annotations

import os
from pathlib import Path

BUILTIN = {
    "dreamerv3": ("dreamerv3", "{suite}-dreamerv3.json.gz"),
    "dreamerv3-2023": ("dreamerv3-2023", "{suite2023}_dreamerv3.json.gz"),
}
"""Built-in reference name -> (sub-folder of the reference folder, file name pattern)."""

REFERENCE_DIR_ENV = "REVERIE_REFERENCE_SCORES"

FETCH_COMMAND = "reverie scores fetch"
"""The command that downloads the official files into a reference folder (:mod:`reverie.scores.fetch`)."""


def missing_folder_note(reference_dir: str | Path | None) -> str | None:
    """The sentence every compare message carries when no reference folder is found, naming the fetch command;
    else None."""
    if reference_dir is not None or default_reference_dir() is not None:
        return None
    return (f"no reference score folder found (--reference-dir, ${REFERENCE_DIR_ENV}, or reference_scores/ here or "
            f"in the parent folder), so there are no official scores to compare with: `{FETCH_COMMAND}` downloads "
            f"the official DreamerV3 files (current and 2023, checksummed) into ./reference_scores/")


def default_reference_dir() -> Path | None:
    """``$REVERIE_REFERENCE_SCORES``, else ``reference_scores/`` in the current directory or its parent; None when
    none exists."""
    candidates = []
    if os.environ.get(REFERENCE_DIR_ENV):
        candidates.append(Path(os.environ[REFERENCE_DIR_ENV]))
    candidates += [Path.cwd() / "reference_scores", Path.cwd().parent / "reference_scores"]
    return next((c for c in candidates if c.is_dir()), None)


def is_path(reference: str) -> bool:
    """True when ``reference`` names a file (``.json``/``.json.gz`` or a path with a folder), not a method name."""
    return reference.endswith((".json", ".json.gz")) or os.sep in reference or "/" in reference


def label(reference: str) -> str | None:
    """Table label of a reference: the name for :data:`BUILTIN` ones, None (the file's own method) otherwise."""
    return reference if reference in BUILTIN else None


def file_names(suite: str, method: str) -> list[str]:
    """The two spellings of ``method``'s score file on ``suite``: current then 2023 (``dmcproprio_x.json.gz``)."""
    return [f"{suite}-{method}.json.gz", f"{suite}-{method}.json", f"{suite.replace('_', '')}_{method}.json.gz",
            f"{suite.replace('_', '')}_{method}.json"]


def available(suite: str, reference_dir: str | Path | None = None) -> list[str]:
    """Reference names with a score file for ``suite`` in the reference folder (built-in ones first)."""
    root = _root(reference_dir, required=False)
    if root is None:
        return []
    names = [n for n in BUILTIN if _builtin_path(root, suite, n).is_file()]
    for path in sorted(_score_files(root)):
        for prefix in (f"{suite}-", f"{suite.replace('_', '')}_"):
            name = path.name.split(".json")[0]
            if name.startswith(prefix) and name[len(prefix):] not in names + ["dreamerv3"]:
                names.append(name[len(prefix):])
    return names


def reference_path(suite: str, reference: str = "dreamerv3", reference_dir: str | Path | None = None) -> Path:
    """Path of the score file that ``reference`` (a built-in name, another method's name, or a path) means on ``suite``.
    Raises FileNotFoundError (no folder, no such file; lists the folder's files for ``suite``) and ValueError (a name
    matching several files)."""
    if is_path(reference):
        path = Path(reference)
        if not path.is_file():
            raise FileNotFoundError(f"score file {path} does not exist")
        return path
    root = _root(reference_dir, required=True)
    if reference in BUILTIN:
        path = _builtin_path(root, suite, reference)
        if path.is_file():
            return path
    else:
        wanted = set(file_names(suite, reference))
        found = sorted(p for p in _score_files(root) if p.name in wanted)
        current = [p for p in found if p.name.startswith(f"{suite}-")]
        if len(found) > 1 and len(current) == 1:  # a fetched folder has both releases: the current file wins
            return current[0]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"reference {reference!r} on suite {suite!r} matches {len(found)} files: "
                             f"{', '.join(map(str, found))}; pass the one you mean as a path (--reference FILE)")
    have = available(suite, root)
    raise FileNotFoundError(
        f"no score file for reference {reference!r} on suite {suite!r} under {root} (looked for "
        f"{' or '.join(file_names(suite, reference)[::2])} there and one folder down); references with a file for "
        f"{suite} there: {', '.join(have) or 'none'}. Put the file (danijar/dreamerv3 scores/ format) there "
        f"(`{FETCH_COMMAND} --dir {root}` downloads the official DreamerV3 ones), or pass its path as --reference FILE")


def _root(reference_dir: str | Path | None, required: bool) -> Path | None:
    root = Path(reference_dir) if reference_dir else default_reference_dir()
    if root is None and required:
        raise FileNotFoundError(
            f"no reference score folder found; `{FETCH_COMMAND}` downloads the official DreamerV3 files into "
            f"./reference_scores/, or pass --reference-dir PATH (the folder holding dreamerv3/ and dreamerv3-2023/) "
            f"or set ${REFERENCE_DIR_ENV}")
    return root


def _builtin_path(root: Path, suite: str, reference: str) -> Path:
    sub, pattern = BUILTIN[reference]
    return root / sub / pattern.format(suite=suite, suite2023=suite.replace("_", ""))


def _score_files(root: Path) -> list[Path]:
    """``.json``/``.json.gz`` files in ``root`` and its direct sub-folders."""
    if not root.is_dir():
        return []
    return [p for pattern in ("*.json", "*.json.gz", "*/*.json", "*/*.json.gz") for p in root.glob(pattern)
            if p.is_file()]
