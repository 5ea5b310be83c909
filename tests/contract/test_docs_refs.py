"""docs/architecture.md cites code as ``path:line`` ("Line numbers are those of this version of the repository"):
each such reference must point at the thing the text names just before it, so that moving code without updating
the page fails here, naming the reference.

Rule: for every code span ``reverie/<...>.py:N`` the file exists, has a line ``N``, and that line contains a word
(3 characters or more) of the nearest code span before it in the same paragraph, e.g. ``CategoricalRSSM.observe``
(`reverie/models/dynamics/categorical.py:N`) needs ``observe`` (or ``CategoricalRSSM``) on line ``N``.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
REFERENCE = re.compile(r"(reverie/[\w/]+\.py):(\d+)")


def references(text: str) -> list[tuple[str, int, str]]:
    """``(path, line, name)`` per code span ``path:line`` of ``text``, ``name`` the code span before it in its
    paragraph ("" where there is none)."""
    out, previous = [], None
    for match in re.finditer(r"`([^`\n]+)`", text):
        ref = REFERENCE.fullmatch(match.group(1))
        if ref is None:
            previous = match
            continue
        same_paragraph = previous is not None and "\n\n" not in text[previous.end():match.start()]
        out.append((ref.group(1), int(ref.group(2)), previous.group(1) if same_paragraph else ""))
    return out


def stale(text: str, root: Path) -> list[str]:
    problems = []
    for path, line, name in references(text):
        file = root / path
        lines = file.read_text(encoding="utf-8").splitlines() if file.exists() else []
        if not 1 <= line <= len(lines):
            problems.append(f"{path}:{line}: no such line ({len(lines)} lines)")
            continue
        words = [w for w in re.findall(r"[A-Za-z_]\w+", name) if len(w) >= 3]
        if not any(w in lines[line - 1] for w in words):
            problems.append(f"{path}:{line} (after `{name}`): the line is {lines[line - 1].strip()[:80]!r}")
    return problems


def test_the_architecture_page_cites_the_lines_it_names():
    text = PAGE.read_text(encoding="utf-8")
    assert len(references(text)) > 30  # the page's trace and maps: the check reads them
    problems = stale(text, REPO)
    assert not problems, "docs/architecture.md cites lines that moved; update them:\n" + "\n".join(problems)


def test_the_check_finds_a_moved_line(tmp_path):
    (tmp_path / "reverie").mkdir()
    (tmp_path / "reverie" / "m.py").write_text("x = 1\n\ndef observe(a):\n    return a\n")
    good = "`Model.observe` (`reverie/m.py:3`)"
    assert stale(good, tmp_path) == []
    assert stale("`Model.observe` (`reverie/m.py:1`)", tmp_path) == [
        "reverie/m.py:1 (after `Model.observe`): the line is 'x = 1'"]
    assert stale("`observe` (`reverie/m.py:9`)", tmp_path) == ["reverie/m.py:9: no such line (4 lines)"]
    assert stale("`observe`\n\n(`reverie/m.py:3`)", tmp_path)  # a name in another paragraph does not count
