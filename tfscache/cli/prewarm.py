"""Preload the hot moving models of a resize on their new owners, before the switch.

    tfscache plan-resize --current a,b,c --new a,b,c,d --model-repository /models --json > plan.json
    tfscache prewarm --plan plan.json --address-template '{node}:8502'
    tfscache prewarm --plan plan.json --address a=10.0.0.1:8502 --address d=10.0.0.4:8502
    tfscache prewarm --models m1,m2 --target 10.0.0.4:8502

With ``--plan`` (``tfscache plan-resize --json``), every model under ``"moved"`` gains the nodes in
its ``to`` that are not in its ``from``: those are its new owners. Which moving models
are hot (``--hot``):

* ``resident`` (default): resident on one of its current owners now, asked through their
  admin APIs; the most recently used first;
* ``all``: every moving model;
* ``file:PATH``: the names listed in PATH, one a line (``#`` comments).

``--limit N`` keeps the first N. Each is preloaded (``tfscache.admin.Admin/Preload``:
loaded and AVAILABLE) on each new owner's own node, ``--parallel`` at a time, with a
progress bar on stderr (``--progress``/``--no-progress``/``--quiet``: tfscache.cli.options). A
model that fails is reported and the rest go on; exit status
1 if any failed, 2 on bad arguments. Node names are the sidecars' ring names; their admin
addresses come from ``--address NAME=HOST:PORT`` or ``--address-template``.

``--join``: once every preload succeeded, call ``tfscache.admin.Admin/Join`` on the new
sidecars (with ``--plan``: the nodes of ``"new"`` not in ``"current"``; with ``--models``:
the target), which were started with ``--no-join``: they register with discovery and go on
the ring. After a failed preload nothing joins (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from tfscache.admin.client import AdminClient, AdminError
from tfscache.cli.options import (
    Parser,
    add_output_flags,
    add_token_flag,
    bar_disable,
    host_port,
    non_negative,
    positive,
)

class PrewarmError(ValueError):
    """Bad arguments or input; the message says which."""


def _addresses(pairs: list[str], template: str):
    table = {}
    for pair in pairs:
        name, sep, address = pair.partition("=")
        if not sep or not name or not address:
            raise PrewarmError(f"--address takes NAME=HOST:PORT, got {pair!r}")
        try:
            table[name] = host_port(address)
        except argparse.ArgumentTypeError as exc:
            raise PrewarmError(f"--address {pair!r}: {exc}") from None
    if template and "{node}" not in template:
        raise PrewarmError(f"--address-template {template!r} lacks {{node}}")

    def address_of(node: str) -> str:
        if node in table:
            return table[node]
        if template:
            return template.replace("{node}", node)
        raise PrewarmError(f"no admin address for node {node!r}: give --address {node}=HOST:PORT "
                           "or --address-template")

    return address_of


def read_plan(path: str) -> list[tuple[str, list[str], list[str]]]:
    """(model, current owners, new owners it gains) for every moving model of the plan."""
    try:
        plan = json.loads(Path(path).read_text())
        moved = plan["moved"]
        return [
            (m["name"], list(m["from"]), [n for n in m["to"] if n not in m["from"]]) for m in moved
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrewarmError(
            f"cannot read plan {path!r} (tfscache plan-resize --json): {exc}"
        ) from exc


def added_nodes(path: str) -> list[str]:
    """The plan's new sidecars: in ``"new"``, not in ``"current"``."""
    try:
        plan = json.loads(Path(path).read_text())
        return [n for n in plan["new"] if n not in plan["current"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrewarmError(
            f"cannot read plan {path!r} (tfscache plan-resize --json): {exc}"
        ) from exc


def join(nodes: list[str], address_of, token: str) -> list[str]:
    """Call Join on each node; the failures as text."""
    failures = []
    for node in nodes:
        try:
            with AdminClient(address_of(node), token=token, timeout_s=60) as client:
                print(f"joined {node}: {client.join().message}")
        except AdminError as exc:
            failures.append(f"join {node}: {exc.code.name}: {exc.message}")
    return failures


def resident_last_use(nodes: set[str], address_of, token: str) -> dict[str, float]:
    """Model name -> latest use among ``nodes`` where it is resident now."""
    last: dict[str, float] = {}
    for node in sorted(nodes):
        try:
            with AdminClient(address_of(node), token=token, timeout_s=30) as client:
                listing = client.list_models()
        except AdminError as exc:
            raise PrewarmError(f"cannot list the models of node {node}: {exc}") from exc
        for state in listing.nodes:
            for m in state.models:
                last[m.name] = max(last.get(m.name, 0.0), m.last_use)
    return last


def choose(moving, hot: str, address_of, token: str) -> list[tuple[str, list[str]]]:
    """(model, new owners) to preload, hottest first."""
    if hot == "all":
        return [(name, gained) for name, _, gained in moving if gained]
    if hot.startswith("file:"):
        try:
            wanted = [
                line.split("#", 1)[0].strip() for line in Path(hot[5:]).read_text().splitlines()
            ]
        except OSError as exc:
            raise PrewarmError(f"cannot read {hot[5:]!r}: {exc}") from exc
        by_name = {name: gained for name, _, gained in moving}
        return [
            (name, by_name[name])
            for name in dict.fromkeys(w for w in wanted if w)
            if by_name.get(name)
        ]
    if hot != "resident":
        raise PrewarmError(f"--hot must be resident, all or file:PATH, got {hot!r}")
    last = resident_last_use({n for _, old, _ in moving for n in old}, address_of, token)
    chosen = [(name, gained) for name, _, gained in moving if gained and name in last]
    return sorted(chosen, key=lambda item: -last[item[0]])


def prewarm(
    jobs: list[tuple[str, str]],
    address_of,
    token: str,
    parallel: int,
    timeout_s: float | None,
    disable: bool | None,
) -> list[str]:
    """Preload each (model, node); the failures as text. ``disable``: tqdm's (None: bar only on a
    terminal)."""
    failures = []

    def one(name: str, node: str) -> None:
        with AdminClient(address_of(node), token=token) as client:
            client.preload(name, timeout_s=timeout_s)

    with (
        ThreadPoolExecutor(max_workers=max(1, parallel)) as pool,
        tqdm(
            total=len(jobs), desc="prewarming", unit="model", disable=disable, file=sys.stderr
        ) as bar,
    ):
        futures = {pool.submit(one, name, node): (name, node) for name, node in jobs}
        for future in as_completed(futures):
            name, node = futures[future]
            try:
                future.result()
            except AdminError as exc:
                failures.append(f"{name} on {node}: {exc.code.name}: {exc.message}")
            except PrewarmError as exc:
                failures.append(f"{name} on {node}: {exc}")
            bar.set_postfix_str(f"{name} -> {node}", refresh=False)
            bar.update(1)
    return failures


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tfscache prewarm", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", metavar="FILE", help="tfscache plan-resize --json output")
    source.add_argument("--models", help="comma-separated model names (with --target)")
    parser.add_argument("--target", type=host_port, metavar="HOST:PORT",
                        help="with --models: the admin API to preload on")
    parser.add_argument("--address", action="append", default=[], metavar="NAME=HOST:PORT",
                        help="admin API of a node of the plan (repeat)")
    parser.add_argument("--address-template", default="", metavar="TEMPLATE",
                        help="admin API of any other node, e.g. '{node}.tfscache:8502'")
    add_token_flag(parser)
    parser.add_argument("--hot", default="resident", help="resident (default), all, or file:PATH")
    parser.add_argument(
        "--limit", type=non_negative(int), default=0, help="at most this many models (0: no limit)"
    )
    parser.add_argument(
        "--parallel", type=positive(int), default=2, help="preloads at once (default %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=non_negative(float), default=0.0, help="longest wait for one load, s"
    )
    parser.add_argument(
        "--join",
        action="store_true",
        help="then call Join on the new sidecars (started with --no-join): they go on the ring",
    )
    add_output_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    if args.hot not in ("resident", "all") and not args.hot.startswith("file:"):
        parser.error(f"argument --hot: {args.hot!r} is not resident, all or file:PATH")
    try:
        if args.models is not None:
            if not args.target:
                raise PrewarmError("--models needs --target HOST:PORT")
            names = list(dict.fromkeys(n.strip() for n in args.models.split(",") if n.strip()))
            chosen = [(name, ["target"]) for name in names]
            address_of = _addresses([f"target={args.target}"], "")
            joining = ["target"] if args.join else []
        else:
            address_of = _addresses(args.address, args.address_template)
            chosen = choose(read_plan(args.plan), args.hot, address_of, args.token)
            joining = added_nodes(args.plan) if args.join else []
            if args.join and not joining:
                raise PrewarmError(
                    '--join: the plan adds no node (every node of "new" is in "current")'
                )
        if args.limit > 0:
            chosen = chosen[:args.limit]
        jobs = [(name, node) for name, nodes in chosen for node in nodes]
        for node in [node for _, node in jobs] + joining:
            address_of(node)  # every address known before the first load
    except PrewarmError as exc:
        print(f"tfscache prewarm: {exc}", file=sys.stderr)
        return 2
    failures = prewarm(
        jobs, address_of, args.token, args.parallel, args.timeout or None, bar_disable(args)
    )
    for failure in failures:
        print(f"tfscache prewarm: failed: {failure}", file=sys.stderr)
    print(f"prewarmed {len(jobs) - len(failures)} of {len(jobs)} model copies "
          f"({len({n for n, _ in jobs})} models)")  # the result: printed with --quiet too
    if joining and failures:
        print(
            f"tfscache prewarm: not joining {', '.join(joining)}: a preload failed", file=sys.stderr
        )
    elif joining:
        failures = join(joining, address_of, args.token)
        for failure in failures:
            print(f"tfscache prewarm: failed: {failure}", file=sys.stderr)
    return 1 if failures else 0
