"""Plan a resize of a tfscache sidecar cluster: which models change nodes, and how many bytes.

    tfscache plan-resize --current a,b,c --new a,b,c,d --model-repository /models
    tfscache plan-resize --current a,b,c --new a,b --models-file sizes.txt --json

Node names are the sidecars' ring names (``ring.self_name``; in Kubernetes the pod names).
Both memberships are hashed with ``tfscache.cluster.ring.Ring`` built as ``tfscache serve`` builds
it (``Ring(names, replicas=ring.replicas_per_model, vnodes=ring.vnodes)``; ``--replicas``
and ``--vnodes`` default to those settings' defaults and must match the cluster's).

A model *moves* when its replica set changes. Each replica it gains on a node is one
copy moving to that node; it is paired with a replica the model loses (``from``), or with
``-`` when the model only gains one (the ring had fewer nodes than ``--replicas``). A
replica lost without a gain is a copy moving to ``-``. Bytes are the newest version's
size on disk (what the cache estimates before the first load, times
``cache.estimate_factor``). Models are read from the repository (``NAME/VERSION/...``;
a progress bar on stderr while scanning and hashing: ``--progress``/``--no-progress``/``--quiet``,
tfscache.cli.options) or from ``--models-file`` lines ``NAME SIZE``
(SIZE in bytes or with a unit, ``4GiB``; ``#`` starts a comment).

Prints a table of copies and bytes per (from, to), per node, and totals; ``--json``
prints the same as one JSON object, with every moving model under ``"moved"``
(name, bytes, old and new replicas: what ``tfscache prewarm`` needs). Exit status 2 on bad
arguments or input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from tqdm import tqdm

from tfscache.cli.options import Parser, add_output_flags, bar_disable, positive
from tfscache.repository.local import ModelRepository
from tfscache.cluster.ring import Ring
from tfscache.settings.sections import RingSection
from tfscache.units import format_bytes, parse_bytes

NONE = "-"  # no node: a replica created from nothing, or dropped


class PlanError(ValueError):
    """Bad arguments or input; the message says which."""


@dataclass(frozen=True)
class Model:
    name: str
    bytes: int


@dataclass
class Flow:
    """Copies moving from one node to another."""

    models: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.models += 1
        self.bytes += size


@dataclass
class Plan:
    current: list[str]
    new: list[str]
    replicas: int
    vnodes: int
    models: int = 0
    bytes: int = 0
    moved: list[dict] = field(default_factory=list)  # {name, bytes, from: [...], to: [...]}
    flows: dict[tuple[str, str], Flow] = field(default_factory=dict)

    @property
    def moving_models(self) -> int:
        return len(self.moved)

    @property
    def moving_bytes(self) -> int:
        """Bytes of the models whose replica set changes (each model counted once)."""
        return sum(m["bytes"] for m in self.moved)

    @property
    def copies(self) -> Flow:
        """Every copy that moves (a model with 2 changed replicas counts twice)."""
        total = Flow()
        for flow in self.flows.values():
            total.models += flow.models
            total.bytes += flow.bytes
        return total

    def per_node(self) -> dict[str, dict[str, int]]:
        """Node -> copies and bytes it loses (out) and gains (in)."""
        nodes = {n: {"models_out": 0, "bytes_out": 0, "models_in": 0, "bytes_in": 0}
                 for n in sorted(set(self.current) | set(self.new))}
        for (src, dst), flow in self.flows.items():
            if src != NONE:
                nodes[src]["models_out"] += flow.models
                nodes[src]["bytes_out"] += flow.bytes
            if dst != NONE:
                nodes[dst]["models_in"] += flow.models
                nodes[dst]["bytes_in"] += flow.bytes
        return nodes

    def to_json(self) -> dict:
        copies = self.copies
        return {
            "current": self.current,
            "new": self.new,
            "replicas": self.replicas,
            "vnodes": self.vnodes,
            "models": self.models,
            "bytes": self.bytes,
            "moving_models": self.moving_models,
            "moving_bytes": self.moving_bytes,
            "moving_copies": copies.models,
            "moving_copy_bytes": copies.bytes,
            "flows": [
                {"from": src, "to": dst, "models": f.models, "bytes": f.bytes}
                for (src, dst), f in sorted(self.flows.items())
            ],
            "nodes": self.per_node(),
            "moved": self.moved,
        }


def parse_members(text: str, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise PlanError(f"{what}: no node names")
    if len(set(names)) != len(names):
        raise PlanError(f"{what}: node names must be unique: {text!r}")
    if NONE in names:
        raise PlanError(f"{what}: {NONE!r} is not a node name")
    return names


def read_models_file(path: str | os.PathLike[str]) -> list[Model]:
    """``NAME SIZE`` per line; blank lines and ``#`` comments ignored."""
    models: dict[str, Model] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except OSError as exc:
        raise PlanError(f"cannot read models file {str(path)!r}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise PlanError(f"{path}:{number}: expected 'NAME SIZE', got {line.strip()!r}")
        name, size = words
        if name in models:
            raise PlanError(f"{path}:{number}: model {name!r} listed twice")
        try:
            models[name] = Model(name, parse_bytes(size))
        except ValueError as exc:
            raise PlanError(f"{path}:{number}: bad size {size!r} ({exc})") from exc
    return sorted(models.values(), key=lambda m: m.name)


def scan_repository(root: str | os.PathLike[str], *, progress: bool | None = None) -> list[Model]:
    """Every model in the repository with its newest version's size on disk."""
    repository = ModelRepository(root)
    try:
        entries = sorted(e.name for e in os.scandir(repository.root) if e.is_dir())
    except OSError as exc:
        raise PlanError(f"cannot list model repository {str(root)!r}: {exc}") from exc
    models = []
    for name in tqdm(
        entries, desc="scanning", unit="model", disable=_quiet(progress), file=sys.stderr
    ):
        latest = repository.latest_version(name)
        if latest is not None:
            models.append(Model(name, repository.disk_bytes(name, latest)))
    return models


def _quiet(progress: bool | None) -> bool | None:
    # None: tqdm shows the bar only when stderr is a terminal.
    return None if progress is None else not progress


def plan(models: Iterable[Model], current: Sequence[str], new: Sequence[str], *, replicas: int,
         vnodes: int, progress: bool | None = False) -> Plan:
    """Hash every model on both memberships and collect what moves."""
    before = Ring(current, replicas=replicas, vnodes=vnodes)
    after = Ring(new, replicas=replicas, vnodes=vnodes)
    result = Plan(list(current), list(new), replicas, vnodes)
    models = list(models)
    for model in tqdm(
        models, desc="hashing", unit="model", disable=_quiet(progress), file=sys.stderr
    ):
        result.models += 1
        result.bytes += model.bytes
        old, now = before.replicas_for(model.name), after.replicas_for(model.name)
        lost = [n for n in old if n not in now]
        gained = [n for n in now if n not in old]
        if not lost and not gained:
            continue
        result.moved.append(
            {"name": model.name, "bytes": model.bytes, "from": list(old), "to": list(now)}
        )
        for src, dst in zip_longest(lost, gained, fillvalue=NONE):
            result.flows.setdefault((src, dst), Flow()).add(model.bytes)
    return result


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render(p: Plan, *, list_models: bool = False) -> str:
    """The plan as a plain-text table."""
    lines = [f"current: {', '.join(p.current)}", f"new:     {', '.join(p.new)}",
             f"replicas per model: {p.replicas}, vnodes: {p.vnodes}", ""]
    rows = [("from", "to", "models", "bytes", "")]
    for (src, dst), flow in sorted(p.flows.items()):
        rows.append((src, dst, f"{flow.models:,}", f"{flow.bytes:,}", format_bytes(flow.bytes)))
    copies = p.copies
    rows.append(
        ("total", "", f"{copies.models:,}", f"{copies.bytes:,}", format_bytes(copies.bytes))
    )
    lines += _table(rows, left=2)
    lines.append("")
    rows = [("node", "models out", "bytes out", "models in", "bytes in")]
    for node, n in p.per_node().items():
        rows.append(
            (
                node,
                f"{n['models_out']:,}",
                format_bytes(n["bytes_out"]),
                f"{n['models_in']:,}",
                format_bytes(n["bytes_in"]),
            )
        )
    lines += _table(rows, left=1)
    lines += [
        "",
        f"models moving: {p.moving_models:,} of {p.models:,} ({_share(p.moving_models, p.models)}), "
        f"{format_bytes(p.moving_bytes)} of {format_bytes(p.bytes)} ({_share(p.moving_bytes, p.bytes)})",
    ]
    if list_models:
        lines.append("")
        lines += [
            f"{m['name']}\t{m['bytes']}\t{','.join(m['from']) or NONE} -> {','.join(m['to']) or NONE}"
            for m in p.moved
        ]
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]], left: int) -> list[str]:
    """Columns padded to their widest cell; the first ``left`` left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


def _parser() -> argparse.ArgumentParser:
    defaults = RingSection()
    parser = Parser(prog="tfscache plan-resize", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--current", required=True, help="current members, comma-separated: a,b,c")
    parser.add_argument("--new", required=True, help="new members, comma-separated: a,b,c,d")
    parser.add_argument("--replicas", type=positive(int), default=defaults.replicas_per_model,
                        help="ring.replicas_per_model of the cluster (default %(default)s)")
    parser.add_argument("--vnodes", type=positive(int), default=defaults.vnodes,
                        help="ring.vnodes of the cluster (default %(default)s)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model-repository", metavar="DIR", help="scan NAME/VERSION/ for models and sizes"
    )
    source.add_argument(
        "--models-file", metavar="FILE", help="lines of NAME SIZE instead of a repository"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--list", action="store_true", help="also list every moving model (text output)"
    )
    add_output_flags(parser, summary=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[2:] if argv is None else argv)
    progress = _progress(args)
    try:
        current, new = parse_members(args.current, "--current"), parse_members(args.new, "--new")
        if args.models_file:
            models = read_models_file(args.models_file)
        else:
            models = scan_repository(args.model_repository, progress=progress)
        result = plan(
            models, current, new, replicas=args.replicas, vnodes=args.vnodes, progress=progress
        )
    except PlanError as exc:
        print(f"tfscache plan-resize: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(result.to_json(), indent=2)
        if args.json
        else render(result, list_models=args.list)
    )
    return 0



def _progress(args: argparse.Namespace) -> bool | None:
    disable = bar_disable(args)
    return None if disable is None else not disable
