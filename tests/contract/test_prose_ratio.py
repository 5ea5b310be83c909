"""The docstrings state contracts and the docs hold the rest (docs/internals.md): docstring and comment lines stay at
most 0.25 per code line in ``reverie/``, counted by ``bench/prose_ratio.py`` (issue 46 item 6: 0.52 before)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _counter():
    spec = importlib.util.spec_from_file_location("prose_ratio", REPO / "bench" / "prose_ratio.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.count


def test_the_package_keeps_at_most_a_quarter_line_of_prose_per_code_line():
    count = _counter()
    docs = comments = code = 0
    for path in (REPO / "reverie").rglob("*.py"):
        d, c, k = count(path)
        docs, comments, code = docs + d, comments + c, code + k
    ratio = (docs + comments) / code
    assert code > 10_000  # the counter read the package
    assert ratio <= 0.25, (f"reverie/ has {docs + comments} docstring and comment lines for {code} code lines "
                           f"({ratio:.3f} > 0.25): shorten docstrings to their contract and move reasons and "
                           f"measurements to docs/internals.md")


def test_the_counter_tells_docstrings_comments_and_code_apart(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Module\ndocstring."""\n\n# a comment\nx = 1  # code with a comment\n\n\n'
                    'def f():\n    """One line."""\n    return x\n')
    assert _counter()(path) == (3, 1, 3)
