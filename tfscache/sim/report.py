"""The simulator's outputs: a text table, a JSON document, and a PNG of hit ratio against capacity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfscache.sim.engine import BELADY, Result
from tfscache.units import format_bytes

def table(results: Sequence[Result]) -> str:
    """One row per configuration, aligned columns; a cap of 0 shows as '-'."""
    header = ("policy", "nodes", "max_models", "memory", "hit_ratio", "hits", "misses",
              "load_s", "peak_mem", "evictions", "uncacheable")
    rows = [header]
    for r in results:
        c, n = r.config, r.counts
        rows.append((c.policy, str(c.nodes), str(c.max_models or "-"),
                     format_bytes(c.memory_bytes) if c.memory_bytes else "-", f"{r.hit_ratio:.4f}",
                     str(n.hits), str(n.requests - n.hits), f"{n.load_seconds:.1f}",
                     format_bytes(n.peak_bytes), str(n.evictions), str(n.uncacheable)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join(lines)


def document(results: Sequence[Result], log: str, requests: int, models: int, wall_seconds: float) -> dict:
    """The JSON report: the log, its size, and every configuration's counts."""
    return {"log": log, "requests": requests, "models": models, "wall_seconds": round(wall_seconds, 3),
            "results": [r.as_dict() for r in results]}


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
    metrics = (("hit ratio", lambda r: r.hit_ratio), ("total load seconds", lambda r: r.counts.load_seconds))
    fig, axes = plt.subplots(2 * len(others), len(node_counts), squeeze=False, sharey="row",
                             figsize=(4.8 * len(node_counts), 3.4 * 2 * len(others)))
    for block, other_value in enumerate(others):
        for col, nodes in enumerate(node_counts):
            panel = [r for r in results if r.config.nodes == nodes and getattr(r.config, other) == other_value]
            xs_all = {getattr(r.config, axis) for r in panel}
            title = f"{nodes} node{'s' if nodes != 1 else ''}"
            if len(others) > 1 or other_value:
                cap = format_bytes(other_value) if other == "memory_bytes" else str(other_value)
                title += f", {other} {cap if other_value else 'uncapped'}"
            for offset, (label, metric) in enumerate(metrics):
                ax = axes[2 * block + offset][col]
                xs_plotted: set[float] = set()
                for policy in policies:
                    points = sorted((getattr(r.config, axis), metric(r)) for r in panel if r.config.policy == policy
                                    and (getattr(r.config, axis) or xs_all == {0}))
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
                ax.set_xlabel("max models per node" if axis == "max_models" else "memory per node (GiB)")
                ax.grid(True, alpha=0.3)
                if col == 0:
                    ax.set_ylabel(label)
    axes[0][0].legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
