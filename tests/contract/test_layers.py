"""The import contract (issue 29 §1): which parts of reverie may import which, read from the source with ``ast``
(nothing is imported; the package is parsed once per session).

Every ``import``/``from ... import`` counts, at module level and inside functions alike, and so do
``__import__("reverie...")`` and ``importlib.import_module("...")`` with a literal name. Rules:

- no import cycle among reverie's modules at module level (what runs on ``import``), and none through deferred
  (function-level) imports either, except :data:`KNOWN_CYCLES`;
- ``reverie.models`` (plain ``nn.Module``s) imports nothing from ``reverie.agents``, ``reverie.loop``,
  ``reverie.cli`` or ``reverie.configs``; ``reverie.envs`` nothing from ``reverie.agents`` or ``reverie.models``;
- ``reverie.configs`` (config composition, :mod:`reverie.configs.compose`) imports no command module
  (``reverie.cli``, ``reverie.<package>.cli``): the commands build on it, not the reverse;
- ``reverie.cli`` is imported by ``reverie.__main__`` alone;
- only ``reverie/envs/`` imports the env libraries (:data:`ENV_LIBRARIES`).

A failure names each offending import as ``file:line: statement``. The checker's own tests run it on small
packages written to ``tmp_path``, one per rule, so that each rule is seen to fail.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# An import cycle that is known and tolerated, with the reason and what removes it. A cycle that is gone must leave
# this table (the test says so), so that it never hides a new one.
KNOWN_CYCLES: dict[frozenset[str], str] = {}  # none left (categorical <-> kernels/rssm went with the kernels' install step)

# (importing package, forbidden packages, why)
FORBIDDEN = [
    ("reverie.models", ("reverie.agents", "reverie.loop", "reverie.cli", "reverie.configs"),
     "models are plain nn.Modules and distributions: no agent, loop, command or config (docs/architecture.md)"),
    ("reverie.envs", ("reverie.agents", "reverie.models"),
     "envs produce rows in the data contract (reverie.types) and know no agent or model"),
]

# Libraries that only reverie/envs/ imports (docs/architecture.md: the env layer holds every simulator).
ENV_LIBRARIES = ("gymnasium", "gym", "ale_py", "dm_control", "envpool", "minari", "shimmy")
ENV_LAYER = "reverie.envs"
# Modules outside reverie/envs/ allowed to import an env library, with the reason. None today.
ENV_LIBRARY_EXCEPTIONS: dict[str, str] = {}

CLI = "reverie.cli"
CLI_IMPORTERS = {"reverie.__main__": "`python -m reverie` runs the command line"}


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's target, where it is, and whether it runs when its module is imported."""

    source: str  # importing module, e.g. "reverie.data.cli"
    target: str  # absolute dotted name; inside the package, the deepest module that exists ("reverie.cli")
    path: str  # file, relative to the repository root
    line: int
    deferred: bool  # inside a function, a lambda or an `if TYPE_CHECKING:` block: not run on import
    text: str  # the statement as written

    def where(self) -> str:
        return f"{self.path}:{self.line}: `{self.text}`"


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``root / package`` (``__init__.py``: the package)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _deepest_module(name: str, modules: dict[str, Path]) -> str:
    """``reverie.loop.session.Session`` -> ``reverie.loop.session``: the longest prefix that is a module (or
    ``name`` itself, for a module outside the package)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statement(lines: list[str], node: ast.AST) -> str:
    """The source of ``node`` on one line (``ast.get_source_segment`` re-splits the file on every call)."""
    span = [line.encode() for line in lines[node.lineno - 1:node.end_lineno]]  # offsets count UTF-8 bytes
    span[-1] = span[-1][:node.end_col_offset]
    span[0] = span[0][node.col_offset:]
    return " ".join(b" ".join(span).decode().split())


@functools.lru_cache(maxsize=None)
def module_imports(root: Path, package: str) -> tuple[dict[str, Path], list[Import]]:
    """Every import of every module under ``root / package``, resolved to absolute names (relative imports
    included). Raises SyntaxError for a file that does not parse."""
    modules = package_modules(root, package)
    found: list[Import] = []
    for module, path in modules.items():
        source = path.read_text()
        rel = str(path.relative_to(root))
        base_package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        lines = source.splitlines()

        def add(node: ast.AST, name: str, deferred: bool, module=module, rel=rel, lines=lines) -> None:
            target = _deepest_module(name, modules) if name.split(".")[0] == package else name
            text = _statement(lines, node)
            found.append(Import(module, target, rel, node.lineno, deferred, text))

        def visit(node: ast.AST, deferred: bool, base_package=base_package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True)
                    continue
                if isinstance(child, ast.If) and _is_type_checking(child.test):
                    for stmt in child.body:
                        visit(ast.Module(body=[stmt], type_ignores=[]), True)
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), deferred)
                    continue
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        add(child, alias.name, deferred)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:  # relative: `from . import x`, `from ..a import b`
                        up = base_package.split(".")
                        up = up[:len(up) - (child.level - 1)]
                        base = ".".join(up + ([child.module] if child.module else []))
                    else:
                        base = child.module or ""
                    for alias in child.names:
                        full = f"{base}.{alias.name}"
                        add(child, full if full in modules else base, deferred)
                elif isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant) \
                        and isinstance(child.args[0].value, str) and (
                            (isinstance(child.func, ast.Name) and child.func.id in ("__import__", "import_module"))
                            or (isinstance(child.func, ast.Attribute) and child.func.attr == "import_module")):
                    add(child, child.args[0].value, deferred)
                visit(child, deferred)

        visit(ast.parse(source, filename=str(path)), False)
    return modules, found


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def import_graph(modules: dict[str, Path], imports: list[Import], deferred: bool) -> dict[str, dict[str, Import]]:
    """``{module: {imported module: the import}}`` among ``modules``.

    ``deferred=False``: the imports that run on import, and, since importing ``a.b.c`` first runs the packages
    ``a`` and ``a.b``, an edge to each of those the importer is not inside (a cycle through a package's
    ``__init__.py`` can break an import). ``deferred=True``: every import, module to module (by the time a
    function runs, the packages are loaded: a package importing its own submodules is no cycle there)."""
    graph: dict[str, dict[str, Import]] = {module: {} for module in modules}
    for imp in imports:
        if (imp.deferred and not deferred) or imp.target not in modules:
            continue
        own = set(_ancestors(imp.source))
        packages = [] if deferred else [a for a in _ancestors(imp.target) if a not in own and a in modules]
        for target in [imp.target, *packages]:
            if target != imp.source:
                graph[imp.source].setdefault(target, imp)
    return graph


def strongly_connected(graph: dict[str, dict[str, Import]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(frozenset(component))
    return components


def _describe(component: frozenset[str], graph: dict[str, dict[str, Import]]) -> str:
    lines = [f"  {graph[a][b].where()}" for a in sorted(component) for b in sorted(graph[a]) if b in component]
    return f"cycle among {', '.join(sorted(component))}:\n" + "\n".join(lines)


def cycle_problems(root: Path, package: str = "reverie", known: dict | None = None) -> list[str]:
    """Messages for import cycles: any among module-level imports; through deferred imports, any not in
    ``known`` (and each entry of ``known`` that no longer exists, so that it is removed)."""
    known = KNOWN_CYCLES if known is None else known
    modules, imports = module_imports(root, package)
    problems = []
    eager = import_graph(modules, imports, deferred=False)
    for component in strongly_connected(eager):
        problems.append("module-level import " + _describe(component, eager))
    full = import_graph(modules, imports, deferred=True)
    components = strongly_connected(full)
    for component in components:
        if component not in known and not any(component <= k for k in known):
            problems.append("import " + _describe(component, full) + "\n  (deferred imports count: move the shared "
                            "code below both, or pass it in)")
    for component, why in known.items():
        if not any(component <= c for c in components):
            problems.append(f"KNOWN_CYCLES lists {', '.join(sorted(component))} ({why}), but that cycle is gone: "
                            f"remove it from KNOWN_CYCLES in tests/contract/test_layers.py")
    return problems


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_problems(root: Path, package: str = "reverie", forbidden=None, env_libraries=ENV_LIBRARIES,
                   env_layer=ENV_LAYER, env_exceptions=None, cli=CLI, cli_importers=None) -> list[str]:
    """Messages for imports that cross a layer the wrong way (the rules in the module docstring)."""
    forbidden = FORBIDDEN if forbidden is None else forbidden
    env_exceptions = ENV_LIBRARY_EXCEPTIONS if env_exceptions is None else env_exceptions
    cli_importers = CLI_IMPORTERS if cli_importers is None else cli_importers
    modules, imports = module_imports(root, package)
    # `from reverie import X` runs the package facade: it counts as importing what reverie/__init__.py imports.
    facade = {imp.target for imp in imports if imp.source == package and not imp.deferred and imp.target in modules}
    commands = {m for m in modules if m == cli or m.endswith(".cli")}
    rules = [*forbidden, (f"{package}.configs", tuple(sorted(commands)),
                          "config composition sits below the commands (reverie/configs/compose.py)")]
    problems = []
    for imp in imports:
        targets = facade if imp.target == package else {imp.target}
        for importer, banned, why in rules:
            if _within(imp.source, importer):
                hit = sorted(t for t in targets if any(_within(t, b) for b in banned))
                if hit:
                    problems.append(f"{imp.where()}: {importer} must not import {', '.join(hit)} ({why})")
        if any(_within(t, cli) for t in targets) and imp.source not in cli_importers and imp.source != cli:
            problems.append(f"{imp.where()}: only {', '.join(cli_importers)} imports {cli} (the commands sit on top; "
                            f"import reverie.configs.compose for config loading, setup checks and run folders)")
        top = imp.target.split(".")[0]
        if top in env_libraries and not _within(imp.source, env_layer) and imp.source not in env_exceptions:
            problems.append(f"{imp.where()}: only {env_layer} imports {top} (the env layer holds every simulator "
                            f"library; add a function there)")
    return list(dict.fromkeys(problems))  # `from a import x, y`: one message


def test_reverie_has_no_import_cycle():
    problems = cycle_problems(REPO)
    assert not problems, "\n".join(problems)


def test_reverie_imports_respect_the_layers():
    problems = layer_problems(REPO)
    assert not problems, "\n".join(problems)


def test_the_known_cycle_is_still_deferred_only():
    """The tolerated cycle runs only through a function-level import: at module level the graph is acyclic."""
    modules, imports = module_imports(REPO, "reverie")
    eager = import_graph(modules, imports, deferred=False)
    full = import_graph(modules, imports, deferred=True)
    assert strongly_connected(eager) == []
    assert set(strongly_connected(full)) <= set(KNOWN_CYCLES)


# The checker on small packages in tmp_path: each rule fails and names the offending file and line.

def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


BASE = {"pkg/__init__.py": "", "pkg/models/__init__.py": "", "pkg/models/net.py": "import torch\n",
        "pkg/agents/__init__.py": "", "pkg/agents/agent.py": "from pkg.models.net import x\n",
        "pkg/envs/__init__.py": "", "pkg/envs/gym.py": "import gymnasium\n",
        "pkg/configs/__init__.py": "", "pkg/configs/compose.py": "def f():\n    from pkg.envs import gym\n",
        "pkg/cli.py": "from pkg.configs.compose import f\n", "pkg/__main__.py": "from pkg.cli import main\n"}
RULES = [("pkg.models", ("pkg.agents", "pkg.loop", "pkg.cli", "pkg.configs"), "models"),
         ("pkg.envs", ("pkg.agents", "pkg.models"), "envs")]


def _layer_problems(root):
    return layer_problems(root, "pkg", forbidden=RULES, env_layer="pkg.envs", env_exceptions={}, cli="pkg.cli",
                          cli_importers={"pkg.__main__": "entry"})


def test_checker_passes_a_clean_package(tmp_path):
    root = _write(tmp_path, BASE)
    assert _layer_problems(root) == []
    assert cycle_problems(root, "pkg", known={}) == []


@pytest.mark.parametrize("file, text, expected", [
    ("pkg/models/net.py", "import torch\n\n\ndef f():\n    from pkg.agents.agent import x\n",
     "pkg/models/net.py:5: `from pkg.agents.agent import x`: pkg.models must not import pkg.agents.agent"),
    ("pkg/models/net.py", "from pkg import configs\n",
     "pkg/models/net.py:1: `from pkg import configs`: pkg.models must not import pkg.configs"),
    ("pkg/models/net.py", "from ..cli import main\n",
     "pkg/models/net.py:1: `from ..cli import main`: pkg.models must not import pkg.cli"),
    ("pkg/envs/gym.py", "import gymnasium\nfrom pkg.models import net\n",
     "pkg/envs/gym.py:2: `from pkg.models import net`: pkg.envs must not import pkg.models.net"),
    ("pkg/agents/agent.py", "import gymnasium.spaces\n",
     "pkg/agents/agent.py:1: `import gymnasium.spaces`: only pkg.envs imports gymnasium"),
    ("pkg/agents/agent.py", "run = lambda: __import__('pkg.cli')\n",
     "pkg/agents/agent.py:1: `__import__('pkg.cli')`: only pkg.__main__ imports pkg.cli"),
    ("pkg/configs/compose.py", "def f():\n    import pkg.cli\n",
     "pkg/configs/compose.py:2: `import pkg.cli`: pkg.configs must not import pkg.cli"),
])
def test_checker_names_each_forbidden_import(tmp_path, file, text, expected):
    root = _write(tmp_path, {**BASE, file: text})
    problems = _layer_problems(root)
    assert any(p.startswith(expected) for p in problems), problems


def test_checker_finds_cycles_with_their_lines(tmp_path):
    root = _write(tmp_path, {**BASE, "pkg/agents/agent.py": "from pkg.models.net import x\n",
                             "pkg/models/net.py": "import torch\nfrom pkg.agents import agent\n"})
    problems = cycle_problems(root, "pkg", known={})
    assert problems and problems[0].startswith("module-level import cycle among pkg.agents.agent, pkg.models.net")
    assert "pkg/models/net.py:2: `from pkg.agents import agent`" in problems[0]
    assert "pkg/agents/agent.py:1: `from pkg.models.net import x`" in problems[0]


def test_checker_deferred_cycles_need_a_known_entry_and_stale_entries_fail(tmp_path):
    files = {**BASE, "pkg/models/net.py": "def f():\n    from pkg.agents import agent\n"}
    root = _write(tmp_path, files)
    cycle = frozenset({"pkg.agents.agent", "pkg.models.net"})
    problems = cycle_problems(root, "pkg", known={})
    assert len(problems) == 1 and problems[0].startswith("import cycle among pkg.agents.agent, pkg.models.net")
    assert "pkg/models/net.py:2: `from pkg.agents import agent`" in problems[0]
    assert cycle_problems(root, "pkg", known={cycle: "why"}) == []
    root = _write(tmp_path / "after", BASE)  # the cycle is gone, the entry stays
    assert cycle_problems(root, "pkg", known={cycle: "why"}) == [
        "KNOWN_CYCLES lists pkg.agents.agent, pkg.models.net (why), but that cycle is gone: remove it from "
        "KNOWN_CYCLES in tests/contract/test_layers.py"]
