"""Replay a trace with time in it: requests take node time, nodes have slots, copies follow load.

``tfscache simulate --load`` (and scripts) replay a request log through a cluster in one
discrete-event simulation, as the live system runs it:

* each request takes ``service`` seconds of a node slot (the log's ``service_seconds``
  column, else ``--service-ms``); a node runs ``concurrency`` requests at once and queues
  the rest in arrival order;
* routing is tfscache's own: ``tfscache.cluster.copies.Copies`` over ``Ring.order``, fed
  with every node's requests in flight (queued, running, or waiting for their model's
  load), exactly as the router feeds it; with copies off, each request goes to its
  model's home node (fixed replicas);
* a request whose model is not resident on its node waits for a load of the log's
  ``load_seconds`` (load seconds are summed); loads do not take request slots (TF
  Serving loads on its own threads). Under the caps, the node's eviction policy (the
  class the cache manager runs) picks victims among *idle* models only (no request queued,
  running or waiting for them), so a load that finds no idle victim waits for one, as
  the planner's blocked loads do; the caps hold at every instant;
* an extra copy the rule drops (``Copies.expire``) is evicted from its node once idle, as
  the live reaper does.

Reported per configuration: per-node busy seconds (max over mean), queue wait (arrival,
or the end of its model's load, to a slot) p50 and p99, latency p50/p99, load seconds and
loads, and copies added/removed, spills, the most copies any model had.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tfscache.cache.policy import EvictionPolicy
from tfscache.cluster.copies import Copies, CopyRule
from tfscache.cluster.ring import Ring
from tfscache.sim.trace import Trace

_ARRIVE, _DONE, _LOADED = 0, 1, 2


@dataclass(frozen=True)
class LoadConfig:
    """One simulated cluster under load."""

    nodes: int
    concurrency: int = 1
    service_s: float = 0.05
    rule: CopyRule = CopyRule(enabled=False)
    policy: str = "lru"
    max_models: int = 0
    label: str = ""


@dataclass
class LoadResult:
    config: LoadConfig
    busy: list[float]  # per node: seconds of request service
    waits: list[float]  # per request: seconds queued for a slot
    latencies: list[float]  # per request: arrival to answer
    load_seconds: float = 0.0
    loads: int = 0
    extra_loads: int = 0  # loads on a node that is not among the model's first min_copies
    added: int = 0
    removed: int = 0
    spills: int = 0
    max_copies: int = 1
    peak_models: int = 0  # most models resident (loading or loaded) on one node at once
    requests_per_node: list[int] = field(default_factory=list)

    @property
    def max_over_mean(self) -> float:
        mean = sum(self.busy) / len(self.busy) if self.busy else 0.0
        return max(self.busy) / mean if mean else 1.0

    def as_dict(self) -> dict:
        return {
            "label": self.config.label,
            "nodes": self.config.nodes,
            "concurrency": self.config.concurrency,
            "copies": self.config.rule.enabled,
            "max_over_mean": round(self.max_over_mean, 4),
            "wait_p50_s": quantile(self.waits, 0.5),
            "wait_p99_s": quantile(self.waits, 0.99),
            "latency_p50_s": quantile(self.latencies, 0.5),
            "latency_p99_s": quantile(self.latencies, 0.99),
            "load_seconds": round(self.load_seconds, 3),
            "loads": self.loads,
            "extra_loads": self.extra_loads,
            "copies_added": self.added,
            "copies_removed": self.removed,
            "spills": self.spills,
            "max_copies": self.max_copies,
            "peak_models": self.peak_models,
            "requests_per_node": self.requests_per_node,
        }


def quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 6)


class _Node:
    """One node: slots, a run queue, resident models, what each model has in use."""

    def __init__(self, policy: EvictionPolicy, concurrency: int, max_models: int) -> None:
        self.policy = policy
        self.free = concurrency
        self.queue: deque[int] = deque()  # request indices ready to run, in order
        self.resident: dict[int, bool] = {}  # key -> loaded (False: loading)
        self.in_use: dict[int, int] = {}  # key -> requests queued, running or waiting for its load
        self.waiting: dict[int, list[int]] = {}  # key -> requests waiting for its load
        self.blocked: deque[int] = deque()  # keys whose load waits for an idle victim
        self.max_models = max_models
        self.busy = 0.0
        self.served = 0

    def idle(self) -> list[int]:
        return [k for k, ready in self.resident.items() if ready and not self.in_use.get(k)]

    def evict(self, key: int) -> None:
        del self.resident[key]
        self.policy.forget(key)


def run_load(
    trace: Trace, config: LoadConfig, factory: Callable[[str, int, int], EvictionPolicy]
) -> LoadResult:
    """Replay ``trace`` under ``config`` (a request's node time: the log's ``service_seconds``, else the
    config's ``service_s``)."""
    service = trace.service if len(trace.service) == len(trace) else None
    names = [f"node{i}" for i in range(config.nodes)]
    ring = Ring(names, replicas=config.rule.min_copies)
    orders = [ring.order(name) for name, _ in trace.models]
    by_name: dict[str, int] = {}
    for k, (name, _) in enumerate(trace.models):
        by_name.setdefault(name, k)
    now = [0.0]
    copies = Copies(config.rule, clock=lambda: now[0])
    nodes = {
        n: _Node(
            factory(config.policy, config.max_models, 0), config.concurrency, config.max_models
        )
        for n in names
    }
    events: list[tuple[float, int, int, int, str]] = []  # (time, seq, kind, request or key, node)
    seq = 0
    ready_at = [0.0] * len(trace)
    result = LoadResult(config, [0.0] * config.nodes, [], [])
    keys, times = trace.keys, trace.times

    def push(at: float, kind: int, item: int, node: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, item, node))

    def start(name: str) -> None:
        node = nodes[name]
        while node.free and node.queue:
            i = node.queue.popleft()
            node.free -= 1
            result.waits.append(now[0] - ready_at[i])
            node.policy.record_access(keys[i], now[0])
            took = service[i] if service is not None and service[i] >= 0 else config.service_s
            node.busy += took
            push(now[0] + took, _DONE, i, name)

    def try_load(name: str, key: int) -> bool:
        node = nodes[name]
        if node.max_models and len(node.resident) >= node.max_models:
            idle = node.idle()
            victim = next(iter(node.policy.victims(idle, now[0])), None) if idle else None
            if victim is None:
                return False
            node.evict(victim)
        node.resident[key] = False
        result.peak_models = max(result.peak_models, len(node.resident))
        cost = trace.load_seconds[node.waiting[key][0]]
        result.load_seconds += cost
        result.loads += 1
        if name not in orders[key][:config.rule.min_copies]:
            result.extra_loads += 1
        node.policy.record_load(key, trace.sizes[node.waiting[key][0]], cost, now[0])
        push(now[0] + cost, _LOADED, key, name)
        return True

    def retry_blocked(name: str) -> None:
        node = nodes[name]
        while node.blocked and try_load(name, node.blocked[0]):
            node.blocked.popleft()

    i = 0
    total = len(trace)
    while i < total or events:
        if i < total and (not events or times[i] <= events[0][0]):
            now[0] = times[i]
            for model, gone in copies.expire():
                node = nodes[gone]
                key = by_name[model]
                if node.resident.get(key) and not node.in_use.get(key):
                    node.evict(key)
            _arrive(i, trace, orders, copies, nodes, ready_at, start, try_load, result)
            i += 1
            continue
        at, _, kind, item, name = heapq.heappop(events)
        now[0] = at
        node = nodes[name]
        if kind == _DONE:
            key = keys[item]
            node.free += 1
            node.served += 1
            node.in_use[key] -= 1
            copies.end(trace.models[key][0], name)
            result.latencies.append(at - times[item])
            start(name)
            retry_blocked(name)
        else:  # a load finished: its waiters join the run queue
            node.resident[item] = True
            for r in node.waiting.pop(item, []):
                ready_at[r] = at
                node.queue.append(r)
            start(name)
    result.busy = [nodes[n].busy for n in names]
    result.requests_per_node = [nodes[n].served for n in names]
    result.added, result.removed, result.spills = copies.added, copies.removed, copies.spills
    return result


def _arrive(i, trace, orders, copies, nodes, ready_at, start, try_load, result) -> None:
    key = trace.keys[i]
    model = trace.models[key][0]
    order = orders[key]
    name = copies.pick(model, order).node
    result.max_copies = max(result.max_copies, len(copies.copies(model, order)))
    copies.begin(model, name)
    node = nodes[name]
    node.in_use[key] = node.in_use.get(key, 0) + 1
    loaded = node.resident.get(key)
    if loaded:
        ready_at[i] = trace.times[i]
        node.queue.append(i)
        start(name)
    elif loaded is False or key in node.waiting:
        node.waiting.setdefault(key, []).append(i)
    else:
        node.waiting[key] = [i]
        if not try_load(name, key):
            node.blocked.append(key)
