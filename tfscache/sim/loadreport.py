"""``tfscache simulate --load``: configurations of the load simulation and their table.

Each combination of policy, node count and ``--max-models`` is replayed with copies off
(fixed replicas: every request on its model's home node) and with each copies setting
asked for, in the same run; ``vs_fixed`` is a row's load seconds over the copies-off row's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from tfscache.cluster.copies import CopyRule
from tfscache.sim.load import LoadConfig, LoadResult

DEFAULT_RULE = CopyRule()


def configs(
    policies: Sequence[str],
    nodes: Sequence[int],
    max_models: Sequence[int],
    *,
    concurrency: int,
    service_s: float,
    rules: Sequence[tuple[str, CopyRule]],
) -> list[LoadConfig]:
    """Copies off first, then each named rule, for every policy, node count and cap."""
    out = []
    for policy, count, cap in itertools.product(policies, nodes, max_models):
        base = LoadConfig(
            count, concurrency, service_s, CopyRule(enabled=False), policy, cap, "off"
        )
        out.append(base)
        out.extend(replace(base, rule=rule, label=label) for label, rule in rules)
    return out


def parse_rules(text: str) -> list[tuple[str, CopyRule]]:
    """``on`` (the defaults) or ``on:balance=0.25:hot_share=0.3...``, comma-separated; ``off`` is
    always run."""
    rules = []
    for item in (part.strip() for part in text.split(",")):
        if not item or item == "off":
            continue
        head, *pairs = item.split(":")
        if head != "on":
            raise ValueError(f"copies setting {item!r}: expected on[:NAME=VALUE...] or off")
        changes = {}
        for pair in pairs:
            name, _, value = pair.partition("=")
            if name not in (
                "max_copies",
                "balance",
                "min_load",
                "hot_share",
                "hot_inflight",
                "cool_s",
                "rate_window_s",
                "signal",
            ):
                raise ValueError(f"copies setting {item!r}: unknown {name!r}")
            changes[name] = (
                value
                if name == "signal"
                else (int(value) if name == "max_copies" else float(value))
            )
        rules.append((item, replace(DEFAULT_RULE, **changes)))
    return rules


def table(results: Sequence[LoadResult]) -> str:
    header = (
        "copies",
        "policy",
        "nodes",
        "max_models",
        "max/mean",
        "wait_p50",
        "wait_p99",
        "lat_p50",
        "lat_p99",
        "load_s",
        "vs_fixed",
        "loads",
        "extra_loads",
        "added",
        "removed",
        "max_copies",
    )
    rows = [header]
    fixed: dict[tuple, float] = {}
    for r in results:
        c = r.config
        group = (c.policy, c.nodes, c.max_models)
        if not c.rule.enabled:
            fixed[group] = r.load_seconds
        base = fixed.get(group)
        d = r.as_dict()
        rows.append(
            (
                c.label or ("on" if c.rule.enabled else "off"),
                c.policy,
                str(c.nodes),
                str(c.max_models or "-"),
                f"{r.max_over_mean:.3f}",
                _ms(d["wait_p50_s"]),
                _ms(d["wait_p99_s"]),
                _ms(d["latency_p50_s"]),
                _ms(d["latency_p99_s"]),
                f"{r.load_seconds:.1f}",
                f"{r.load_seconds / base:.3f}" if base else "-",
                str(r.loads),
                str(r.extra_loads),
                str(r.added),
                str(r.removed),
                str(r.max_copies),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms"
