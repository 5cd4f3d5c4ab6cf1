"""What the benchmarks print and write: a model's table of paths, issue 31's goals judged from the
figures (met / not met, with the numbers), the summary (one row per path), the machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil

# what each figure is judged against (issue 31)
GOAL_P50_VS_NGINX_MS = 0.10
GOAL_REST_P50_VS_NODE_MS = 0.30
GOAL_PYTHON_CPU_US = 100.0
GOAL_RATIO_C16 = 0.85


def _f(value, spec: str = ".2f") -> str:
    return "–" if value is None or value != value else format(value, spec)


def _groups(cpu: dict[str, float]) -> str:
    """CPU µs per request as table cells: tfscache's Python processes, HAProxy, any other proxy
    (nginx, the naive hop), the node; "–" where the path has no such group."""
    other = [v for who, v in cpu.items() if who not in ("node", "tfscache python", "haproxy")]
    return " | ".join(_f(v, ".0f") for v in (cpu.get("tfscache python"), cpu.get("haproxy"),
                                            sum(other) if other else None, cpu.get("node")))


def paths_table(model: dict) -> list[str]:
    """One model's warm figures: per path p50/p99 at c=1, and per concurrency req/s, the ratio to
    direct, and CPU µs per request of tfscache's Python processes, of HAProxy, of any other proxy
    and of the node."""
    cs = model["concurrencies"]
    head = "| path | p50 ms (c=1) | p99 ms (c=1) | added p50 |" + "".join(
        f" req/s c={c} | ratio c={c} | Python CPU µs/req c={c} | HAProxy CPU µs/req c={c} "
        f"| other proxy CPU µs/req c={c} | node CPU µs/req c={c} |" for c in cs)
    lines = [head, "|" + "---|" * (4 + 6 * len(cs))]
    for label, p in model["paths"].items():
        row = f"| {label} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['added_p50_ms']:+.2f} |"
        for c in cs:
            row += f" {p[f'rps_c{c}']:.0f} | {p[f'ratio_c{c}']:.2f} | {_groups(p[f'cpu_us_c{c}'])} |"
        lines.append(row)
    return lines


def _verdict(goal: str, path: str, value: float | None, limit: float, at_most: bool, unit: str,
             missing: str = "") -> dict:
    if value is None:
        return {"goal": goal, "path": path, "verdict": "not measured", "detail": missing}
    met = value <= limit if at_most else value >= limit
    return {"goal": goal, "path": path, "value": round(value, 4), "limit": limit,
            "verdict": "met" if met else "not met",
            "detail": f"{value:.3g} {unit} ({'≤' if at_most else '≥'} {limit:g} wanted)"}


def judge(models: list[dict], tiny: str, rest: dict | None, cold: dict | None,
          skipped: dict[str, str]) -> list[dict]:
    """Issue 31's goals for every tfscache path, each met or not with its numbers:
    gRPC p50 at c=1 within 0.10 ms of nginx grpc_pass (every model); REST p50 at c=1 within
    0.30 ms of the node's own REST port (``tiny``); at most 100 µs of tfscache's Python CPU per
    request under load (every model, its worst concurrency); at c=16 at least 0.85 of
    direct (``tiny``); cold requests no slower than on the Python path (medians)."""
    goals = []
    fronts = [label for label in models[0]["paths"] if label.startswith("tfscache")]
    for label in fronts:
        for model in models:
            paths = model["paths"]
            nginx = paths.get("nginx grpc_pass")
            goals.append(_verdict(f"gRPC p50 c=1 within {GOAL_P50_VS_NGINX_MS} ms of nginx grpc_pass, "
                                  f"{model['model']}", label,
                                  None if nginx is None else paths[label]["p50_ms"] - nginx["p50_ms"],
                                  GOAL_P50_VS_NGINX_MS, True, "ms over nginx",
                                  skipped.get("nginx grpc_pass", "nginx not measured")))
        if rest is not None:
            added = rest[label]["p50_ms"] - rest["direct"]["p50_ms"] if label in rest else None
            goals.append(_verdict(f"REST p50 c=1 within {GOAL_REST_P50_VS_NODE_MS} ms of the node's REST, {tiny}",
                                  label, added, GOAL_REST_P50_VS_NODE_MS, True, "ms over the node"))
        for model in models:  # the worst concurrency of each model
            worst = max((model["paths"][label][f"cpu_us_c{c}"].get("tfscache python", float("nan")), c)
                        for c in model["concurrencies"])
            verdict = _verdict(f"tfscache Python CPU ≤ {GOAL_PYTHON_CPU_US:g} µs per warm request under load, "
                               f"{model['model']}", label, worst[0], GOAL_PYTHON_CPU_US, True, "µs/req")
            verdict["detail"] += f" at c={worst[1]}, the worst"
            goals.append(verdict)
        tiny_paths = next((m["paths"] for m in models if m["model"] == tiny), None)
        ratio = None if tiny_paths is None else tiny_paths[label].get("ratio_c16")
        goals.append(_verdict(f"req/s at c=16 ≥ {GOAL_RATIO_C16} of direct, {tiny}", label, ratio,
                              GOAL_RATIO_C16, False, "of direct", "no c=16 run (--concurrency)"))
    if cold is not None:  # its base (first path) is the Python data plane
        python = cold["paths"][cold["base"]]
        for label, figures in cold["paths"].items():
            if label.startswith("tfscache") and label != cold["base"]:
                added = figures["added_median_vs_base_ms"]
                goals.append(_verdict(f"cold request no slower than on the Python path ({cold['base']}), "
                                      "median", label, figures["median_ms"], round(python["median_ms"], 2), True,
                                      f"ms (per-round difference: median {added:+.1f} ms)"))
    return goals


def summary_rows(models: list[dict], tiny: str, rest: dict | None, cold: dict | None) -> list[dict]:
    """One row per path, on ``tiny``: c=1 latency, REST p50, req/s and ratio at each concurrency,
    CPU µs per request by group (the highest concurrency), cold median."""
    model = next(m for m in models if m["model"] == tiny)
    top = max(model["concurrencies"])
    rows = []
    for label, p in model["paths"].items():
        row = {"path": label, "p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"],
               "rest_p50_ms": (rest or {}).get(label, {}).get("p50_ms"),
               **{f"rps_c{c}": p[f"rps_c{c}"] for c in model["concurrencies"]},
               **{f"ratio_c{c}": p[f"ratio_c{c}"] for c in model["concurrencies"]},
               "cpu_at": top, "cpu_us": p[f"cpu_us_c{top}"], "routed_share": p.get(f"routed_share_c{top}"),
               "cold_median_ms": (cold or {}).get("paths", {}).get(label, {}).get("median_ms")}
        rows.append(row)
    return rows


def summary_markdown(summary: dict) -> list[str]:
    rows, cs = summary["rows"], summary["concurrencies"]
    top = max(cs)
    lines = [f"Summary on {summary['model']} (CPU µs/req at c={top}):", "",
             "| path | p50 ms c=1 | p99 ms c=1 | REST p50 ms |" + "".join(f" req/s c={c} | ratio c={c} |" for c in cs)
             + " Python CPU | HAProxy CPU | other proxy CPU | node CPU | cold median ms |",
             "|" + "---|" * (9 + 2 * len(cs))]
    for r in rows:
        lines.append(f"| {r['path']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {_f(r['rest_p50_ms'])} |"
                     + "".join(f" {r[f'rps_c{c}']:.0f} | {r[f'ratio_c{c}']:.2f} |" for c in cs)
                     + f" {_groups(r['cpu_us'])} | {_f(r['cold_median_ms'], '.1f')} |")
    lines += [f"\nShare of requests HAProxy routed itself at c={top} (the rest took the slow path): "
              f"{r['path']} {r['routed_share']:.3f}" for r in rows if r["routed_share"] is not None]
    lines += ["", "| goal (issue 31) | path | verdict | measured |", "|---|---|---|---|"]
    for g in summary["goals"]:
        lines.append(f"| {g['goal']} | {g['path']} | {g['verdict']} | {g.get('detail', '')} |")
    for label, why in summary.get("skipped", {}).items():
        lines.append(f"\nskipped: {label}: {why}")
    return lines


def summarize(models: list[dict], tiny: str, rest: dict | None, cold: dict | None,
              skipped: dict[str, str]) -> dict:
    """The summary the scripts print last and put in their JSON under ``summary``."""
    model = next(m for m in models if m["model"] == tiny)
    return {"model": tiny, "concurrencies": model["concurrencies"],
            "rows": summary_rows(models, tiny, rest, cold),
            "goals": judge(models, tiny, rest, cold, skipped), "skipped": skipped}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = psutil.virtual_memory().total / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f} at start")
