"""tfscache's import graph, read statically with ``ast``: no cycles, no long modules, no private imports.

Every ``import`` and ``from ... import`` in tfscache/ counts, including those inside
functions (lazy imports) and under ``if TYPE_CHECKING:``: a cycle hidden behind a lazy
import is still a boundary in the wrong place. ``from pkg import name``
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

# A module is split where a concept ends, never to fit a count (docs/DESIGN.md, rule 1). Past
# WARN_LINES a module is worth a look (reported, not failed); past MAX_LINES it is plainly too big.
WARN_LINES = 500
MAX_LINES = 800
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
    """Only MAX_LINES fails; a module past WARN_LINES is named in the output (pytest -rP shows it)."""
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    for name, n in sorted(lines.items()):
        if WARN_LINES < n <= MAX_LINES:
            print(f"{name}: {n} lines (over {WARN_LINES}: is it still one concept?)")
    new = {name: n for name, n in long_modules().items() if name not in KNOWN_LONG}
    assert not new, f"modules over {MAX_LINES} lines (split them where a concept ends): {new}"


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


# -- the layout's rules (docs/DESIGN.md, "Rules the layout follows") ------------------------------

PRODUCTS = ("tfserving", "triton", "mlserver")
MAX_TOP_LEVEL = 11  # shared leaves; everything else (app/ too) lives in a package


def product_homes(product: str) -> tuple[str, ...]:
    """Where a product may be named in code: its kind's package and its protocol's."""
    protocol = {"tfserving": "tfserving", "triton": "oip", "mlserver": "oip"}[product]
    return (f"tfscache/kinds/{product}/", f"tfscache/frontend/protocols/{protocol}/")


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Lines of string statements (module, class, function and attribute docstrings)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def _kind_rows(tree: ast.AST) -> dict[str, set[int]]:
    """kinds/table.py: the lines of each row of KINDS, by the row's name."""
    rows: dict[str, set[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "KINDS":
                for key, value in zip(node.value.keys, node.value.values):
                    rows[key.value] = set(range(key.lineno, value.end_lineno + 1))
    return rows


def product_mentions(root: Path = PACKAGE.parent) -> list[str]:
    """Each product name in code (names, strings that are not docstrings) outside its homes and its
    one row of the kind table; comments and docstrings are prose and may name anything."""
    import io
    import tokenize

    found = []
    for path in sorted((root / "tfscache").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("tfscache/wire/"):
            continue  # generated messages: their package names are the wire format
        text = path.read_text()
        tree = ast.parse(text)
        prose = _docstring_lines(tree)
        rows = _kind_rows(tree) if relative == "tfscache/kinds/table.py" else {}
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type not in (tokenize.NAME, tokenize.STRING) or token.start[0] in prose:
                continue
            for product in PRODUCTS:
                if product in token.string.lower() and not relative.startswith(product_homes(product)) \
                        and token.start[0] not in rows.get(product, ()):
                    found.append(f"{relative}:{token.start[0]}: {product} in {token.string[:60]}")
    return found


def test_products_are_named_only_in_their_kind_and_protocol():
    assert product_mentions() == []


def test_the_product_check_sees_code_and_skips_prose(tmp_path):
    (tmp_path / "tfscache" / "cache").mkdir(parents=True)
    (tmp_path / "tfscache" / "cache" / "x.py").write_text(
        '"""Triton and TF Serving, in prose."""\n# triton in a comment\nKIND = "triton"\n'
        'def f():\n    """tfserving in a docstring."""\n    return TritonAdapter\n')
    assert [line.split(": ", 1)[0] for line in product_mentions(tmp_path)] == ["tfscache/cache/x.py:3",
                                                                                "tfscache/cache/x.py:6"]


def test_the_top_level_holds_shared_leaves_only():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules (a grown module becomes a package): {top}"


GENERIC_PARTS = {"protocol", "adapter", "launcher", "methods", "api", "client"}


def test_generic_classes_take_their_kinds_parts_without_a_default():
    """A generic class gets its protocol, adapter, launcher and client from the kind, never from a
    default that quietly picks one product."""
    offenders = []
    for name, path in modules().items():
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative.startswith(("tfscache/kinds/", "tfscache/frontend/protocols/", "tfscache/modelserver/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                positional = [*args.posonlyargs, *args.args]
                defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))
                defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
                offenders += [f"{name}.{node.name}({arg}=...)" for arg in defaults if arg in GENERIC_PARTS]
    assert offenders == []


def test_one_loader_imports_by_name():
    """tfscache/importer.py is the one ``"module:attribute"`` loader; no other module imports by name."""
    offenders = []
    for name, path in modules().items():
        if name == "tfscache.importer":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("import_module", "__import__"):
                    offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


# Packages from the bottom up: each imports only from those before it (and itself). A package
# named here with a dot is a unit of its own (a kind, a protocol, the policies).
LAYERS = [
    {"", "errors", "units", "logs", "importer", "extras", "wire", "webserver", "auth"},
    {"discovery.peer", "discovery.table", "cache.policy", "kinds.table"},
    {"settings", "tls"},
    {"dataplane"},
    {"storage", "repository", "discovery", "modelserver", "sim.trace"},
    {"cache", "cluster.ring"},
    {"kinds"},
    {"frontend"},
    {"frontend.protocols.tfserving", "frontend.protocols.oip"},
    {"kinds.tfserving", "kinds.triton", "kinds.mlserver"},
    {"cluster", "sim", "observe", "admin"},
    {"app", "workers", "dataplane.control", "dataplane.targets"},
    {"cli", "__main__"},
]


def unit_of(module: str) -> str:
    """The layer unit of a module: the longest name in LAYERS that is a prefix of it."""
    parts = module.split(".")[1:]
    names = {name for layer in LAYERS for name in layer}
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in names:
            return ".".join(parts[:end])
    return ""


def test_dependencies_point_down():
    rank = {name: index for index, layer in enumerate(LAYERS) for name in layer}
    edges, _ = graph()
    upward = sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                    if unit_of(a) != unit_of(b) and rank[unit_of(b)] > rank[unit_of(a)])
    assert upward == []


# -- docs and comments stand alone (issue 30, item 6) ---------------------------------------------
# The patterns are built from pieces so that this file does not match itself.
_OUTSIDE = "|".join([r"\.\./" + "shared", "shared/" + "reference", "\u00a7" + "[0-9]"])
_STANDALONE_ROOTS = ("tfscache/", "docs/", "tests/", "scripts/", "deploy/", "README.md")


def outside_references(root: Path, paths) -> list[str]:
    """``path:line`` for each line of ``paths`` (relative to root) that cites notes outside the
    repository (the parent folder's shared notes) or a numbered section sign."""
    import re

    outside = re.compile(_OUTSIDE)
    found = []
    for rel in paths:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    return found


def test_docs_and_comments_stand_alone():
    import subprocess

    root = PACKAGE.parent
    tracked = subprocess.run(["git", "ls-files", *_STANDALONE_ROOTS], cwd=root, check=True,
                             capture_output=True, text=True).stdout.splitlines()
    assert tracked
    assert outside_references(root, tracked) == []


def test_outside_references_sees_an_offender(tmp_path):
    (tmp_path / "a.md").write_text("see ../" + "shared/x.md\nfine\n")
    (tmp_path / "b.py").write_text("# " + "\u00a7" + "1.9 says so\n")
    (tmp_path / "c.md").write_text("docs/upstream/tfserving.md, \"Concurrency\"\n")
    assert outside_references(tmp_path, ["a.md", "b.py", "c.md"]) == ["a.md:1", "b.py:1"]


# -- one way into a node's cache (issue 30, item 2) -----------------------------------------------
CACHE_PARTS = {"ledger", "adapter", "repository"}  # what only tfscache/cache/ may read of a cache


def _names_cache_manager(annotation: ast.AST | None) -> bool:
    """Whether an annotation names CacheManager (``CacheManager | None``, as a string, dotted)."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "CacheManager":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "CacheManager":
            return True
        if isinstance(node, ast.Constant) and "CacheManager" in str(node.value):
            return True
    return False


class _CacheNames:
    """What counts as a cache in one module (see ``cache_reaches``), found to a fixed point."""

    def __init__(self, tree: ast.AST) -> None:
        self.names: set[str] = set()  # local names bound to a cache somewhere in the module
        self.attributes: set[str] = set()  # ``X.attr`` names assigned a cache somewhere in it
        self.functions: set[str] = set()  # functions annotated to return a CacheManager
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _names_cache_manager(node.returns):
                    self.functions.add(node.name)
                args = node.args
                every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                for arg in every:
                    if arg is not None and _names_cache_manager(arg.annotation):
                        self.names.add(arg.arg)
        while self._bind(tree):
            pass

    def is_cache(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            return called == "CacheManager" or called in self.functions
        if isinstance(node, ast.Name):
            return node.id == "cache" or node.id.endswith("_cache") or node.id in self.names
        if isinstance(node, ast.Attribute):
            attr = node.attr
            return attr == "cache" or attr.endswith("_cache") or attr in self.attributes
        return False

    def _bind(self, tree: ast.AST) -> bool:
        """One pass binding the targets of assignments from a cache; whether it bound a new one."""
        before = len(self.names) + len(self.attributes)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and self.is_cache(node.value):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and (_names_cache_manager(node.annotation) or (
                    node.value is not None and self.is_cache(node.value))):
                targets = [node.target]
            elif isinstance(node, ast.NamedExpr) and self.is_cache(node.value):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    self.names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    self.attributes.add(target.attr)
        return len(self.names) + len(self.attributes) > before


def cache_reaches(root: Path = PACKAGE.parent) -> list[str]:
    """``path:line: what`` for each read of a cache's ``ledger``, ``adapter`` or ``repository``
    in a module under tfscache/ outside tfscache/cache/: everything else asks ``CacheManager``.

    The read is ``E.part`` (or ``getattr(E, "part")``) for a part in CACHE_PARTS, where E is a
    cache: a name or attribute called ``cache`` or ending in ``_cache`` (``cache``, ``self.cache``,
    ``backend.cache``, ``node_cache``); a call of ``CacheManager(...)`` or of a function annotated
    to return one; a name annotated ``CacheManager`` (a parameter or a variable, ``| None``
    included); or a name or attribute assigned a cache (``=``, ``:=``, repeated to a fixed point:
    ``c = backend.cache`` makes ``c`` one, ``self.node = c`` makes every ``X.node`` one). Bindings
    count module-wide, not per scope: a name once bound to a cache anywhere in a module is one
    everywhere in it (stricter, never looser). A ``repository`` or ``adapter`` that is not reached
    through a cache (``self.repository`` of a router) is not a cache's and passes.
    """
    found = []
    for path in sorted((root / "tfscache").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("tfscache/cache/"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        caches = _CacheNames(tree)
        reads = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if node.attr in CACHE_PARTS and caches.is_cache(node.value):
                    reads.append(node)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                args = node.args
                if (len(args) >= 2 and isinstance(args[1], ast.Constant)
                        and args[1].value in CACHE_PARTS and caches.is_cache(args[0])):
                    reads.append(node)
        reads.sort(key=lambda node: (node.lineno, node.col_offset))
        found += [f"{relative}:{node.lineno}: {ast.unparse(node)}" for node in reads]
    return found


def test_nothing_outside_the_cache_reads_its_parts():
    """Outside tfscache/cache/, a node's cache is asked through CacheManager's methods (remote use,
    in-use state, probes, lost texts), never through its ledger, adapter or repository."""
    assert cache_reaches() == []  # no allowlist: ask CacheManager instead


def test_the_cache_reach_check_sees_an_offender(tmp_path):
    (tmp_path / "tfscache" / "cache").mkdir(parents=True)
    (tmp_path / "tfscache" / "workers").mkdir()
    (tmp_path / "tfscache" / "cache" / "manager.py").write_text(
        "class CacheManager:\n    def f(self, cache):\n        return self.ledger, cache.adapter\n")
    (tmp_path / "tfscache" / "workers" / "x.py").write_text(
        "def used(backend):\n"
        "    backend.cache.ledger.leased(1)\n"  # 2: a chain through .cache
        "def texts(cache, router):\n"
        "    router.repository.resolve('m')\n"  # 4: not a cache's: passes
        "    return cache.adapter.lost_texts, cache.lost_texts\n"  # 5: only the first offends
        "def probe(m: 'CacheManager | None', backends):\n"
        "    c = backends['n'].cache\n"
        "    self.node = c\n"
        "    return m.repository, c.ledger, getattr(c, 'adapter'), self.node.ledger\n"  # 9: four
        "def make() -> CacheManager:\n"
        "    return CacheManager(1).repository, make().adapter\n")  # 11: two
    assert [line.split(": ", 1)[1] for line in cache_reaches(tmp_path)] == [
        "backend.cache.ledger", "cache.adapter", "m.repository", "c.ledger", "getattr(c, 'adapter')",
        "self.node.ledger", "CacheManager(1).repository", "make().adapter"]
    assert {line.split(":", 1)[0] for line in cache_reaches(tmp_path)} == {"tfscache/workers/x.py"}


# Lines of about 100 characters (black wraps code at 100); none past LONGEST_LINE. Generated
# wire code (tfscache/wire/, from protos/ by scripts/gen_protos.sh) is protoc's and exempt.
LONGEST_LINE = 110


def test_lines_of_about_100_characters():
    long_lines = [f"{name}:{number} ({len(line)})" for name, path in sorted(modules().items())
                  if not name.startswith("tfscache.wire.")
                  for number, line in enumerate(path.read_text().splitlines(), 1)
                  if len(line) > LONGEST_LINE]
    assert long_lines == [], f"lines over {LONGEST_LINE} characters: {long_lines[:20]}"
