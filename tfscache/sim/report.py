"""The simulator's outputs: a text table, a JSON document, and a PNG of hit ratio against capacity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfscache.sim.bound import Bound
from tfscache.sim.engine import BELADY, Result
from tfscache.units import format_bytes

Bounds = dict[tuple[int, int, int], Bound]  # (nodes, max_models, memory_bytes) -> bound
OPTIMUM, LOWER_BOUND = "optimum", "lp-bound"


def _group(r: Result) -> tuple[int, int, int]:
    return r.config.nodes, r.config.max_models, r.config.memory_bytes


def vs_bound(r: Result, bounds: Bounds) -> float | None:
    """``r``'s load seconds over its bound (None: no bound; a bound of 0 and no load seconds: 1)."""
    bound = bounds.get(_group(r))
    if bound is None:
        return None
    if bound.load_seconds <= 0:
        return 1.0 if r.counts.load_seconds <= 0 else float("inf")
    return r.counts.load_seconds / bound.load_seconds


def table(results: Sequence[Result], bounds: Bounds | None = None) -> str:
    """One row per configuration, aligned columns; a cap of 0 shows as '-'.

    With ``bounds``: a ``vs_bound`` column, and after each group's last row a row for its
    bound (``optimum`` when exact, else ``lp-bound``) with its load seconds.
    """
    bounds = bounds or {}
    header = ("policy", "nodes", "max_models", "memory", "hit_ratio", "hits", "misses",
              "load_s", "peak_mem", "evictions", "uncacheable") + (("vs_bound",) if bounds else ())
    rows = [header]
    last = {_group(r): i for i, r in enumerate(results)}
    for i, r in enumerate(results):
        c, n = r.config, r.counts
        caps = (
            str(c.nodes),
            str(c.max_models or "-"),
            format_bytes(c.memory_bytes) if c.memory_bytes else "-",
        )
        ratio = vs_bound(r, bounds)
        rows.append((c.policy, *caps, f"{r.hit_ratio:.4f}",
                     str(n.hits), str(n.requests - n.hits), f"{n.load_seconds:.1f}",
                     format_bytes(n.peak_bytes), str(n.evictions), str(n.uncacheable))
                    + ((f"{ratio:.3f}" if ratio is not None else "-",) if bounds else ()))
        bound = bounds.get(_group(r))
        if bound is not None and last[_group(r)] == i:
            rows.append((OPTIMUM if bound.exact else LOWER_BOUND, *caps, "-", "-", "-",
                         f"{bound.load_seconds:.1f}", "-", "-", "-", "1.000"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    return "\n".join(lines)


def document(results: Sequence[Result], log: str, requests: int, models: int, wall_seconds: float,
             bounds: Bounds | None = None) -> dict:
    """The JSON report: the log, its size, every configuration's counts (with ``load_vs_bound``),
    and the bounds: ``exact`` true for the optimum under a count cap, false for a lower bound."""
    bounds = bounds or {}
    return {
        "log": log,
        "requests": requests,
        "models": models,
        "wall_seconds": round(wall_seconds, 3),
        "results": [{**r.as_dict(), "load_vs_bound": vs_bound(r, bounds)} for r in results],
        "bounds": [
            {
                "nodes": g[0],
                "max_models": g[1],
                "memory_bytes": g[2],
                "load_seconds": b.load_seconds,
                "exact": b.exact,
            }
            for g, b in bounds.items()
        ],
    }


def plot(results: Sequence[Result], out: Path) -> None:
    """Hit ratio, and total load seconds, against per-node capacity; one line per policy.

    One column per node count; a pair of rows (hit ratio above load seconds) per value of
    the other cap. The capacity axis is the cap given with several values (the count cap
    when both are); uncapped (0) points are left off it unless nothing else is there.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    counts = sorted({r.config.max_models for r in results})
    memories = sorted({r.config.memory_bytes for r in results})
    axis = "max_models" if len(counts) > 1 or len(memories) == 1 else "memory_bytes"
    other = "memory_bytes" if axis == "max_models" else "max_models"
    node_counts = sorted({r.config.nodes for r in results})
    others = sorted({getattr(r.config, other) for r in results})
    policies = list(dict.fromkeys(r.config.policy for r in results if r.config.policy != BELADY))
    if any(r.config.policy == BELADY for r in results):
        policies.append(BELADY)
    metrics = (
        ("hit ratio", lambda r: r.hit_ratio),
        ("total load seconds", lambda r: r.counts.load_seconds),
    )
    fig, axes = plt.subplots(2 * len(others), len(node_counts), squeeze=False, sharey="row",
                             figsize=(4.8 * len(node_counts), 3.4 * 2 * len(others)))
    for block, other_value in enumerate(others):
        for col, nodes in enumerate(node_counts):
            panel = [
                r
                for r in results
                if r.config.nodes == nodes and getattr(r.config, other) == other_value
            ]
            xs_all = {getattr(r.config, axis) for r in panel}
            title = f"{nodes} node{'s' if nodes != 1 else ''}"
            if len(others) > 1 or other_value:
                cap = format_bytes(other_value) if other == "memory_bytes" else str(other_value)
                title += f", {other} {cap if other_value else 'uncapped'}"
            for offset, (label, metric) in enumerate(metrics):
                ax = axes[2 * block + offset][col]
                xs_plotted: set[float] = set()
                for policy in policies:
                    points = sorted(
                        (getattr(r.config, axis), metric(r))
                        for r in panel
                        if r.config.policy == policy and (getattr(r.config, axis) or xs_all == {0})
                    )
                    if not points:
                        continue
                    xs = [x / 2**30 if axis == "memory_bytes" else x for x, _ in points]
                    xs_plotted.update(xs)
                    style = {"color": "black", "linestyle": "--"} if policy == BELADY else {}
                    ax.plot(xs, [y for _, y in points], marker="o", label=policy, **style)
                positive = sorted(x for x in xs_plotted if x > 0)
                if positive and positive[-1] >= 8 * positive[0]:
                    ax.set_xscale("log", base=2)
                    ax.set_xticks(positive)
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                    ax.xaxis.set_minor_locator(NullLocator())
                ax.set_title(title if offset == 0 else "")
                ax.set_xlabel(
                    "max models per node" if axis == "max_models" else "memory per node (GiB)"
                )
                ax.grid(True, alpha=0.3)
                if col == 0:
                    ax.set_ylabel(label)
    axes[0][0].legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
