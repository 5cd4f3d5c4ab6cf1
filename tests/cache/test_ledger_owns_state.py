"""The ledger owns its state: no module but tfscache/cache/ledger.py changes a field of a ``Ledger``,
an ``Entry`` or a ``Pending``, and none but tfscache/cache/signals.py one of ``Signals`` (issue 19).

A static check over every module of the package and of the tests, with ``ast``: an assignment,
augmented assignment or ``del`` of such a field (``entry.state = ...``, ``entry.leases += 1``), an
item assigned or deleted in one (``ledger.pending[key] = ...``), a mutating call on one
(``ledger.pinned.add(key)``, ``entry.waiters.append(f)``), or ``setattr`` naming one. A class's
own ``self.x`` is its own business. The allowlist is empty: change the state through the
owner's methods, named for what happened (``Ledger.admitted``, ``loaded``, ``retire``, ``lost``, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OWNERS = {  # module -> the classes whose fields only it changes
    "tfscache/cache/ledger.py": ("Ledger", "Entry", "Pending"),
    "tfscache/cache/signals.py": ("Signals",),
}
MUTATORS = {"add", "discard", "remove", "pop", "popitem", "append", "extend", "insert", "clear", "update",
            "difference_update", "intersection_update", "symmetric_difference_update", "setdefault",
            "sort", "reverse", "__setitem__", "__delitem__"}
# Field names that other classes also use for their own things (a protobuf's ``state``, a
# StateWriter's ``pending``): checked only in modules that import the owner's module.
COMMON = {"key", "state", "bytes", "disk", "estimate", "pending", "services"}
ALLOWED: set[str] = set()  # "path:line", empty: nothing outside the owners changes their state


def owned_fields(path: str, classes: tuple[str, ...]) -> set[str]:
    """Every field of ``classes`` in ``path``: its ``__slots__`` and the ``self.x`` it assigns."""
    fields = set()
    for node in ast.parse((REPO / path).read_text()).body:
        if not isinstance(node, ast.ClassDef) or node.name not in classes:
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                   for t in sub.targets):
                fields |= {e.value for e in sub.value.elts}
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
                sub, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and _is_self(target.value):
                    fields.add(target.attr)
    return fields


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def owner_module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


FIELDS = {path: owned_fields(path, classes) for path, classes in OWNERS.items()}


def modules() -> list[Path]:
    return sorted(p for root in ("tfscache", "tests") for p in (REPO / root).rglob("*.py"))


def imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def changed_fields(tree: ast.AST):
    """(line, field name, what) for every field change that is not ``self.x``."""
    def base(node: ast.expr) -> tuple[str | None, bool]:
        """The attribute named by a target (or by the container it indexes), and whether it is ``self.x``."""
        if isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute):
            return node.attr, _is_self(node.value)
        return None, False

    def flatten(targets):
        for target in targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                yield from flatten(target.elts)
            elif isinstance(target, ast.Starred):
                yield from flatten([target.value])
            else:
                yield target

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, what = node.targets, "assigned"
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets, what = [node.target], "assigned"
        elif isinstance(node, ast.Delete):
            targets, what = node.targets, "deleted"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets, what = [node.func.value], f".{node.func.attr}()"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            yield node.lineno, node.args[1].value, node.func.id
            continue
        else:
            continue
        for target in flatten(targets):
            if isinstance(target, ast.Subscript) or isinstance(node, ast.Call) or isinstance(target, ast.Attribute):
                name, is_self = base(target)
                if name is not None and not is_self:
                    yield node.lineno, name, what


def violations() -> list[str]:
    found = []
    for path in modules():
        rel = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        imported = imports(tree)
        for owner, fields in FIELDS.items():
            if rel == owner:
                continue
            checked = fields if owner_module(owner) in imported else fields - COMMON
            for line, name, what in changed_fields(tree):
                if name in checked and f"{rel}:{line}" not in ALLOWED:
                    found.append(f"{rel}:{line}: {name} {what} (a field of {'/'.join(OWNERS[owner])}; "
                                 f"call a method of {owner} instead)")
    return found


def test_the_fields_are_found():
    # The check is only as good as its field list: the ledger's and the signals' state is in it.
    assert {"entries", "pending", "pinned", "learned", "learned_gpu", "_failed", "state", "leases", "waiters",
            "last_use", "bytes", "measured", "gpu", "blocked_since"} <= FIELDS["tfscache/cache/ledger.py"]
    assert {"_healthy", "_draining", "_evictions", "_rechecks"} <= FIELDS["tfscache/cache/signals.py"]


@pytest.mark.parametrize("source", [
    "entry.state = READY", "entry.leases += 1", "ledger.pending[key] = p", "del ledger.entries[key]",
    "ledger.pinned.add(key)", "self.ledger.pinned.discard(key)", "entry.waiters.append(f)",
    "keys, sig._evictions = sig._evictions, []", "setattr(entry, 'bytes', 3)", "ledger.learned.update(d)",
])
def test_the_check_finds_each_kind_of_change(source):
    imported = "from tfscache.cache.ledger import READY\nfrom tfscache.cache.signals import Signals\n"
    tree = ast.parse(imported + source)
    fields = FIELDS["tfscache/cache/ledger.py"] | FIELDS["tfscache/cache/signals.py"]
    assert [name for _, name, _ in changed_fields(tree) if name in fields]


def test_the_check_leaves_a_class_its_own_fields_and_reads_alone():
    tree = ast.parse("self.entries = {}\nself.pending.append(x)\nn = len(ledger.entries)\nledger.pin(key)\n"
                     "ledger.retire(key)\nx = entry.state\n")
    assert list(changed_fields(tree)) == []


def test_only_the_owners_change_the_ledgers_and_the_signals_state():
    assert violations() == []
