"""tfscache's import graph, read statically with ``ast``: no cycles, no long modules, no private imports.

Every ``import`` and ``from ... import`` in tfscache/ counts, including those inside
functions (lazy imports) and under ``if TYPE_CHECKING:``: a cycle hidden behind a lazy
import is still a boundary in the wrong place (STYLE.md). ``from pkg import name``
where ``pkg.name`` is a module is an import of that module; otherwise of ``pkg``.
A private name is ``_x`` taken from another tfscache module, by ``from m import _x`` or
as ``m._x`` on an imported module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

# issue 11: being removed. Each entry is a known offender; a new one fails, and an entry
# that no longer offends fails too (remove it here).
KNOWN_CYCLES: list[frozenset[str]] = []
KNOWN_LONG: set[str] = set()
KNOWN_PRIVATE: set[tuple[str, str]] = set()

MAX_LINES = 400
PACKAGE = Path(__file__).resolve().parent.parent / "tfscache"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _owner(dotted: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``dotted`` that is a tfscache module."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _base(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str | None]]:
    """(imported tfscache module, private name or None) for each import in ``module``."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}  # local name -> tfscache module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _owner(alias.name, known)
                if target:
                    yield target, None
                    aliases[alias.asname or alias.name] = target if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, module, path)
            if _owner(base, known) is None and not any(f"{base}.{a.name}" in known for a in node.names):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    yield submodule, None
                    aliases[alias.asname or alias.name] = submodule
                elif (target := _owner(base, known)) is not None:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    yield target, alias.name if private else None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            yield aliases[node.value.id], node.attr


def graph(package: Path = PACKAGE) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """Edges importer -> imported, and (importer, module.private_name) pairs."""
    known = modules(package)
    edges: dict[str, set[str]] = {name: set() for name in known}
    private: set[tuple[str, str]] = set()
    for name, path in known.items():
        for target, private_name in imports(name, path, known):
            if target == name:
                continue
            edges[name].add(target)
            if private_name:
                private.add((name, f"{target}.{private_name}"))
    return edges, private


def strongly_connected(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm; only the components with a cycle (more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def one_cycle(edges: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """A path start -> ... -> start inside ``component``, for the failure message."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no cycle through {start}")


def long_modules() -> dict[str, int]:
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    return {name: n for name, n in lines.items() if n > MAX_LINES}


def test_no_import_cycles():
    edges, _ = graph()
    new = [c for c in strongly_connected(edges) if c not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(" -> ".join(one_cycle(edges, c)) for c in new)


def test_no_module_over_the_line_limit():
    new = {name: n for name, n in long_modules().items() if name not in KNOWN_LONG}
    assert not new, f"modules over {MAX_LINES} lines (split them): {new}"


def test_no_private_names_imported_across_modules():
    _, private = graph()
    new = sorted(private - KNOWN_PRIVATE)
    assert not new, "private names imported from another module (make them public or move them):\n" + "\n".join(
        f"{importer} uses {name}" for importer, name in new)


@pytest.mark.parametrize("kind", ["cycles", "long", "private"])
def test_known_offenders_still_offend(kind):
    """An allowlist entry that was fixed must leave the list, so it cannot come back unnoticed."""
    edges, private = graph()
    current = {"cycles": set(strongly_connected(edges)), "long": set(long_modules()), "private": private}[kind]
    known = {"cycles": set(KNOWN_CYCLES), "long": KNOWN_LONG, "private": KNOWN_PRIVATE}[kind]
    assert not known - current, f"fixed, remove from KNOWN_{kind.upper()}: {sorted(map(sorted, known - current)) if kind == 'cycles' else sorted(known - current)}"


def test_the_reader_sees_lazy_relative_submodule_and_private_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from pkg.sub import b  # lazy, a submodule\n",
        "sub/__init__.py": "",
        "sub/b.py": "from ..c import _hidden\n",
        "c.py": "import pkg.a as a\nX = a._secret\nimport os\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    edges, private = graph(pkg)
    assert edges == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.sub.b": {"pkg.c"},
                     "pkg.c": {"pkg.a"}}
    assert private == {("pkg.sub.b", "pkg.c._hidden"), ("pkg.c", "pkg.a._secret")}
    [cycle] = strongly_connected(edges)
    assert one_cycle(edges, cycle) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
