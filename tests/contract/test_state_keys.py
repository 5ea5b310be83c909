"""No module outside the dynamics names a state entry (issue 29 §1; reverie/models/dynamics/base.py): the agents,
planners, loop, viz and play reach a dynamics' state through the protocol alone (``starts``, ``truncate``,
``feature_keys``, ``features``, ``context_*``) and may index, repeat, concatenate, detach and move its entries
generically, never by name.

What counts as naming an entry: a string literal equal to an entry name of a shipped dynamics' states, anywhere in
a module's code (a subscript ``post["deter"]``, ``state.get("stoch")``, a dict display ``{"deter": ...}``, a tuple of
keys ``for k in ("deter", "stoch")``, a comparison), read with ``ast`` from every module of the package outside
:data:`EXEMPT`. Not counted: docstrings, and the attribute name of ``getattr``/``hasattr`` (a dynamics' attribute,
e.g. its width ``deter``, is not a state entry). The entry names are collected from the shipped dynamics themselves
(every state they return, the kernels' imagination included), so a new entry is covered without editing this file.
Names that are also a statistic's name elsewhere in reverie (``mean``, ``std`` of the Gaussian RSSM) are allowed in
the modules of :data:`STATISTICS` alone, which must never reach a dynamics (no ``.dynamics``, ``.wm``,
``.img_step``, ``.posterior_step``, no import of the dynamics or world models) and must still use the name.
The checker's own tests run it on a small package written to ``tmp_path``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "reverie"

#: the dynamics and the categorical RSSM's fast paths, which ``install`` puts into it: their own code
EXEMPT = ("reverie/models/dynamics/", "reverie/models/kernels/")

#: module (or folder, ending in /) -> the entry names it uses as something else, and what for
STATISTICS: dict[str, tuple[frozenset[str], str]] = {
    "reverie/loop/evaluate.py": (frozenset({"mean", "std"}), "the evaluation's return statistics"),
    "reverie/loop/session_report.py": (frozenset({"mean", "std"}), "evaluate()'s result {'mean', 'std', ...}"),
    "reverie/scores/": (frozenset({"mean"}), "aggregate score metrics (mean, median, IQM)"),
    "reverie/sweep/summary.py": (frozenset({"mean"}), "the sweep table's mean column"),
}

#: attributes and imports by which a module reaches a dynamics or its states
REACHING_ATTRIBUTES = frozenset({"dynamics", "wm", "img_step", "posterior_step"})
REACHING_IMPORTS = ("reverie.models.dynamics", "reverie.models.world_model", "reverie.models.kernels")


@functools.lru_cache(maxsize=1)
def state_entry_names() -> frozenset[str]:
    """Every entry name of the states the shipped dynamics return (initial, observe, img_step, imagine with and
    without kernels, starts, truncate, context_state) and of their replay context."""
    from reverie.models.dynamics import BlockRSSM, CategoricalRSSM, GaussianRSSM
    from reverie.models.kernels import install

    names: set[str] = set()
    T, B, A, E = 3, 2, 2, 4
    fast = CategoricalRSSM(A, E, deter=8, stoch=2, classes=3, units=8)
    install(fast, "auto")
    models = [CategoricalRSSM(A, E, deter=8, stoch=2, classes=3, units=8, kernels="off"), fast,
              GaussianRSSM(A, E, deter=8, stoch=2, units=8), BlockRSSM(A, E, deter=8, hidden=4, stoch=2, classes=3,
                                                                       blocks=2)]
    with torch.no_grad():
        for dyn in models:
            post, prior = dyn.observe(torch.randn(T, B, E), torch.zeros(T, B, A), torch.ones(T, B, dtype=torch.bool))
            start = dyn.starts(post)
            states, _ = dyn.imagine(lambda s: torch.zeros(T * B, A), start, 2)
            stored = dyn.context_state({k: v[0] for k, v in dyn.context_rows(post).items()})
            for state in (dyn.initial(B), post, prior, dyn.img_step(start, torch.zeros(T * B, A)), states, start,
                          dyn.truncate(post), stored, dyn.context_spec()):
                names |= set(state)
    return frozenset(names)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _attribute_names(tree: ast.AST) -> set[int]:
    """String arguments naming an attribute: ``getattr(x, "deter")``, ``hasattr``, ``setattr``, ``delattr``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2:
            out.add(id(node.args[1]))
    return out


def named_entries(root: Path, names: frozenset[str], exempt: tuple[str, ...] = EXEMPT) -> list[tuple[str, int, str]]:
    """``(path relative to root's parent, line, name)`` of every string literal in ``root``'s modules (outside
    ``exempt``) equal to one of ``names``, docstrings and attribute names left out."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith(exempt):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        skip = _docstrings(tree) | _attribute_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                    and id(node) not in skip:
                found.append((rel, node.lineno, node.value))
    return sorted(found)


def reaches_a_dynamics(path: Path) -> list[str]:
    """How a module reaches a dynamics: the attributes of :data:`REACHING_ATTRIBUTES` it reads and the modules of
    :data:`REACHING_IMPORTS` it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    how = {f".{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in REACHING_ATTRIBUTES}
    for node in ast.walk(tree):
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        how |= {f"import {m}" for m in modules if m.startswith(REACHING_IMPORTS)}
    return sorted(how)


def _allowed(rel: str, name: str) -> bool:
    return any(rel == key or (key.endswith("/") and rel.startswith(key)) for key, (names, _) in STATISTICS.items()
               if name in names)


def test_the_entry_names_are_those_of_the_shipped_dynamics():
    names = state_entry_names()
    assert {"deter", "stoch", "logits", "mean", "std"} <= names


def test_no_module_outside_the_dynamics_names_a_state_entry():
    names = state_entry_names()
    found = [f"{rel}:{line}: {name!r}" for rel, line, name in named_entries(PACKAGE, names)
             if not _allowed(rel, name)]
    assert not found, ("modules outside reverie/models/dynamics name state entries; use the Dynamics protocol "
                       "(starts, truncate, feature_keys, features, context_*) instead:\n" + "\n".join(found))


def test_the_statistics_exceptions_reach_no_dynamics_and_are_still_used():
    used = {(rel, name) for rel, _, name in named_entries(PACKAGE, state_entry_names())}
    for key, (names, why) in STATISTICS.items():
        paths = sorted((REPO / key).rglob("*.py")) if key.endswith("/") else [REPO / key]
        assert paths and all(p.exists() for p in paths), f"{key} is gone: remove it from STATISTICS"
        for path in paths:
            assert not reaches_a_dynamics(path), f"{path}: {why}, but it reaches a dynamics"
        stale = [n for n in names if not any(rel.startswith(key) if key.endswith("/") else rel == key
                                             for rel, name in used if name == n)]
        assert not stale, f"{key} no longer uses {stale}: remove them from STATISTICS"


def test_the_checker_finds_each_way_of_naming_an_entry(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "dyn").mkdir(parents=True)
    (pkg / "dyn" / "own.py").write_text('x = state["deter"]\n')  # exempt: the dynamics' own
    (pkg / "agent.py").write_text(
        '"""Docstrings may say "deter"."""\n'
        'def f(post, state, d):\n'
        '    """Nor here: deter."""\n'
        '    a = post["deter"]\n'                         # 4: subscript
        '    b = state.get("stoch")\n'                     # 5: get
        '    c = {"deter": a}\n'                           # 6: dict display
        '    for k in ("logits",):\n'                      # 7: tuple of keys
        '        pass\n'
        '    w = getattr(d, "deter")\n'                    # attribute name: not counted
        '    e = f"{a}deter", f"posterior_{a}"\n'         # 10: an f-string part that is the name builds the key
        '    return "other"\n')
    found = named_entries(pkg, frozenset({"deter", "stoch", "logits"}), exempt=("pkg/dyn/",))
    assert found == [("pkg/agent.py", 4, "deter"), ("pkg/agent.py", 5, "stoch"), ("pkg/agent.py", 6, "deter"),
                     ("pkg/agent.py", 7, "logits"), ("pkg/agent.py", 10, "deter")]
    (pkg / "stats.py").write_text("from reverie.models.dynamics import State\nx = agent.wm\n")
    assert reaches_a_dynamics(pkg / "stats.py") == [".wm", "import reverie.models.dynamics"]
    (pkg / "plain.py").write_text("import numpy\nx = rows['mean']\n")
    assert reaches_a_dynamics(pkg / "plain.py") == []


@pytest.mark.parametrize("name", ["deter", "stoch"])
def test_the_check_fails_on_a_named_entry(tmp_path, name):
    """The package check itself, on a copy of one consumer with a named entry put back (as before the protocol's
    starts: ``post[k] for k in ("deter", "stoch")``)."""
    pkg = tmp_path / "reverie"
    (pkg / "agents").mkdir(parents=True)
    source = (PACKAGE / "agents" / "dreamer2025.py").read_text(encoding="utf-8")
    (pkg / "agents" / "dreamer2025.py").write_text(source + f'\n_START = ("{name}",)\n', encoding="utf-8")
    assert [n for _, _, n in named_entries(pkg, state_entry_names())] == [name]
