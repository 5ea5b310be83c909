"""Docstring and comment lines per code line of a Python package (issue 46 item 6: the prose ratio).

    .venv/bin/python bench/prose_ratio.py reverie            # this package
    .venv/bin/python bench/prose_ratio.py /path/to/other/pkg  # any folder of .py files, counted the same way

Every ``.py`` file under the folder: a line is a *docstring* line when it lies inside a module, class or function
docstring (``ast``), a *comment* line when its only token is a comment (``tokenize``), a *code* line when it holds
any other token; blank lines count as nothing. A line with code and a trailing comment is a code line. Prints the
three counts, the ratio (docstring + comment lines) / code lines and the five files with the highest ratio.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING}


def count(path: Path) -> tuple[int, int, int]:
    """``(docstring lines, comment-only lines, code lines)`` of one file."""
    source = path.read_text(encoding="utf-8")
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    comment, code = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in SKIP:
            continue
        lines = range(tok.start[0], tok.end[0] + 1)
        if tok.type == tokenize.COMMENT:
            comment.update(lines)
        elif not docs.issuperset(lines):
            code.update(lines)
    comment -= code | docs
    return len(docs), len(comment), len(code - docs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    rows = [(p, *count(p)) for p in sorted(args.folder.rglob("*.py"))]
    docs, comments, code = (sum(r[i] for r in rows) for i in (1, 2, 3))
    print(f"{args.folder}: {len(rows)} files, {code} code lines, {docs} docstring lines, {comments} comment lines; "
          f"prose ratio {(docs + comments) / max(code, 1):.2f}")
    worst = sorted(rows, key=lambda r: -(r[1] + r[2]) / max(r[3], 1))[:5]
    for path, d, c, k in worst:
        print(f"  {(d + c) / max(k, 1):.2f}  {path} ({k} code, {d} docstring, {c} comment lines)")


if __name__ == "__main__":
    main()
