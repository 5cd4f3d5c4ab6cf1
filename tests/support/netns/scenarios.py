"""The partition scenarios, run in order against one NetCluster under 16-client Zipf traffic,
each measured into a ``Figures`` (what docs/reliability.md records).

    run = Scenarios(cluster, durations=CI)          # or SOAK (20 s cut, 30 s discovery outage)
    run.setup()                                     # hosts a, b, c (proxied), d; a pin; warm traffic
    cluster.switch_backend("etcd"); run = Scenarios(cluster); run.setup(started=True)   # same hosts
    figures = [run.cut_off(), run.kill_whole(), run.slow_peer(), run.discovery_down(), run.join_and_drain()]

Every scenario takes the faulted host out of the clients' targets first (a Service drops a pod
whose readiness fails; the clients are never the thing under test), so each failure a client sees
is one the cluster's routing could not hide. A failure is expected only where no replica of its
model was reachable within the deadline; then its message must name the unreachable host.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

from support.netns.cluster import NetCluster
from support.waiting import wait_until
from tfscache.cluster.ring import Ring

HOSTS = ["a", "b", "c", "d"]
WAITED_S = 1.0  # a request that took longer than this "waited"


@dataclass
class Durations:
    cut_s: float
    discovery_down_s: float
    slow_s: float
    slow_delay_s: float
    steady_requests: int  # requests after each fault before measuring the end


CI = Durations(cut_s=4.0, discovery_down_s=5.0, slow_s=4.0, slow_delay_s=0.3, steady_requests=150)
SOAK = Durations(cut_s=20.0, discovery_down_s=30.0, slow_s=20.0, slow_delay_s=0.5, steady_requests=1000)


@dataclass
class Figures:
    scenario: str
    backend: str
    requests: int = 0
    failed: dict[str, int] = field(default_factory=dict)          # code -> count
    failure_examples: list[str] = field(default_factory=list)
    failures_naming_host: int = 0                                   # failed requests naming another host
    waited: int = 0                                                 # requests over WAITED_S
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    latency_max_s: float = 0.0
    max_copies: int = 0                                             # most hosts with one model available at once
    over_replicated_s: float = 0.0                                  # time some model was on > replicas hosts
    over_replicated_at_end: list[str] = field(default_factory=list)
    max_resident: int = 0                                           # most models available on one host at once
    cap: int = 0
    converge_s: float | None = None                                 # after healing: rings whole again
    pins_kept: bool | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class Scenarios:
    def __init__(self, cluster: NetCluster, durations: Durations = CI, deadline: float = 10.0) -> None:
        self.cluster, self.durations, self.deadline = cluster, durations, deadline
        self.pinned: dict[str, set[str]] = {}  # host -> pinned models
        self.traffic = None
        self.monitor = None

    # -- set-up -------------------------------------------------------------------------------

    def setup(self, traffic_seed: int = 1, started: bool = False) -> None:
        """Hosts a, b, c (proxied), d (``started``: they run already), the pin, the monitor, warm traffic."""
        from support.netns.cluster import Monitor

        c = self.cluster
        if not started:
            c.add_many(HOSTS, proxied=("c",))
        c.wait_rings(HOSTS)
        # A pin on the most popular model, through the admin API of each of its replicas.
        for name in Ring(HOSTS, replicas=c.replicas).replicas_for(c.models[0]):
            with c.hosts[name].admin(60) as admin:
                admin.pin(c.models[0], timeout_s=60)
        self.pinned = self._pins()
        assert sum(map(len, self.pinned.values())) == c.replicas, self.pinned
        self.monitor = Monitor(c).__enter__()
        self.traffic = c.traffic(HOSTS, deadline=self.deadline, seed=traffic_seed)
        self.traffic.wait_requests(200)

    def close(self) -> None:
        if self.traffic is not None:
            self.traffic.stop()
        if self.monitor is not None:
            self.monitor.__exit__()

    def _pins(self) -> dict[str, set[str]]:
        out = {}
        for host in self.cluster.live():
            out[host.name] = {m for m, (state, pinned) in host.models(10).items() if pinned}
        return out

    def pins_kept(self, hosts: list[str]) -> bool:
        now = self._pins()
        return all(now.get(h, set()) >= self.pinned.get(h, set()) for h in hosts)

    # -- measuring ----------------------------------------------------------------------------

    def measure(self, name: str, start: float, end: float, converge_s: float | None = None,
                pins_kept: bool | None = None) -> Figures:
        c = self.cluster
        f = Figures(name, c.backend, cap=c.cap, converge_s=None if converge_s is None else round(converge_s, 2),
                    pins_kept=pins_kept)
        rows = [r for r in self.traffic.results() if start <= r["t"] < end]
        f.requests = len(rows)
        hosts = {h.address: h.name for h in c.hosts.values()}
        for r in rows:
            if r["code"] != "OK":
                f.failed[r["code"]] = f.failed.get(r["code"], 0) + 1
                if len(f.failure_examples) < 5:
                    f.failure_examples.append(f"{r['code']}: {r['message'][:200]} (to {r['target']}, {r['model']})")
                # A host other than the one the client sent to (a client's timeout names its own target).
                if any(a in r["message"] or f" {n} " in r["message"] for a, n in hosts.items() if a != r["target"]):
                    f.failures_naming_host += 1
        times = sorted(r["s"] for r in rows)
        if times:
            f.waited = sum(t > WAITED_S for t in times)
            f.latency_p50_s = round(statistics.median(times), 3)
            f.latency_p99_s = round(times[min(len(times) - 1, int(len(times) * 0.99))], 3)
            f.latency_max_s = round(times[-1], 3)
        samples = [(t, s) for t, s in self.monitor.samples if start <= t < end]
        previous = None
        for t, sample in samples:
            copies: dict[str, int] = {}
            for host in sample.values():
                if host is None:
                    continue
                available = [m for m, (state, _) in host["models"].items() if state == "available"]
                f.max_resident = max(f.max_resident, len(available))
                for m in available:
                    copies[m] = copies.get(m, 0) + 1
            top = max(copies.values(), default=0)
            f.max_copies = max(f.max_copies, top)
            if previous is not None and top > c.replicas:
                f.over_replicated_s += t - previous
            previous = t
            f.over_replicated_at_end = sorted(m for m, n in copies.items() if n > c.replicas)
        f.over_replicated_s = round(f.over_replicated_s, 2)
        return f

    def _steady(self) -> None:
        self.traffic.wait_requests(self.durations.steady_requests)

    # -- the scenarios ------------------------------------------------------------------------

    def cut_off(self, victim: str = "a") -> Figures:
        """a) ``victim``'s link down for ``cut_s``, then up again. a is the first replica of 5 of the
        12 models (d of none): with DNS it stays on every ring, so its peers' requests meet it first."""
        c, host = self.cluster, self.cluster.hosts[victim]
        others = [h for h in HOSTS if h != victim and not c.hosts[h].killed]
        start = time.time()
        self.traffic.set_targets(others)
        host.net.cut()
        time.sleep(self.durations.cut_s)  # the length of the partition is the scenario
        host.net.heal()
        healed = time.monotonic()
        c.wait_rings(others + [victim], timeout=60)
        converge = time.monotonic() - healed
        self.traffic.set_targets(others + [victim])
        self._steady()
        return self.measure("a) one host cut off", start, time.time(), converge, self.pins_kept(HOSTS))

    def kill_whole(self, victim: str = "b") -> Figures:
        """b) every process of ``victim`` SIGKILLed at once; later started again on its state."""
        c, host = self.cluster, self.cluster.hosts[victim]
        others = [h for h in HOSTS if h != victim]
        start = time.time()
        self.traffic.set_targets(others)
        host.kill()
        if c.backend == "dns":  # Kubernetes drops the dead pod's records (readiness fails)
            c.publish(set(c.published) - {victim})
        c.wait_rings(others, timeout=60)
        self._steady()
        restarted = time.monotonic()
        host.start()
        serving = time.monotonic()
        if c.backend == "dns":
            c.publish(set(c.published) | {victim})
        c.wait_rings(HOSTS, timeout=60)
        converge = time.monotonic() - serving
        self.traffic.set_targets(HOSTS)
        self._steady()
        f = self.measure("b) one host killed whole, then restarted", start, time.time(), converge,
                         self.pins_kept(HOSTS))
        f.notes.append(f"node and sidecar restarted in {serving - restarted:.1f} s; converge_s counts from then")
        return f

    def slow_peer(self, victim: str = "c") -> Figures:
        """c) everything reaching ``victim``'s front ends delayed by ``slow_delay_s`` (user-space proxy)."""
        host = self.cluster.hosts[victim]
        others = [h for h in HOSTS if h != victim]
        start = time.time()
        self.traffic.set_targets(others)
        host.slow(self.durations.slow_delay_s)
        time.sleep(self.durations.slow_s)  # the length of the slowness is the scenario
        host.slow(0.0)
        self.traffic.set_targets(HOSTS)
        self._steady()
        return self.measure(f"c) one peer slow ({self.durations.slow_delay_s * 1000:.0f} ms each way)", start,
                            time.time(), None, self.pins_kept(HOSTS))

    def discovery_down(self) -> Figures:
        """d) etcd and DNS unreachable for ``discovery_down_s``: the rings must not move."""
        c = self.cluster
        start = time.time()
        c.discovery.net.cut()
        moved = []
        deadline = time.monotonic() + self.durations.discovery_down_s
        while time.monotonic() < deadline:  # watching the rings is the scenario
            moved += [f"{n}: {r}" for n, r in c.rings().items() if r is not None and r != sorted(HOSTS)]
            time.sleep(0.2)
        c.discovery.net.heal()
        healed = time.monotonic()
        # Back: every sidecar's registration is renewed (etcd) or the records answer (dns).
        wait_until(lambda: c.discovery.registered() >= len(HOSTS), 60,
                   "every host registered again", interval=0.05)
        converge = time.monotonic() - healed
        settle_end = time.monotonic() + 3 * max(c.ttl_s, 1.0)
        while time.monotonic() < settle_end:
            moved += [f"{n}: {r}" for n, r in c.rings().items() if r is not None and r != sorted(HOSTS)]
            time.sleep(0.2)
        c.wait_rings(HOSTS, timeout=60)
        self._steady()
        f = self.measure("d) discovery unreachable", start, time.time(), converge, self.pins_kept(HOSTS))
        f.notes.append(f"rings seen changed: {len(moved)} samples" + (f", e.g. {moved[:3]}" if moved else ""))
        return f

    def join_and_drain(self, joining: str = "e", leaving: str = "d") -> Figures:
        """e) a new host joins and another is drained and leaves, both under traffic."""
        c = self.cluster
        start = time.time()
        c.add(joining)
        now = [*HOSTS, joining]
        joined = time.monotonic()
        c.wait_rings(now, timeout=60)
        join_s = time.monotonic() - joined
        self.traffic.set_targets(now)
        self._steady()
        rest = [h for h in now if h != leaving]
        self.traffic.set_targets(rest)
        if c.backend == "dns":  # the drained pod turns unready: Kubernetes drops its records
            c.publish(set(c.published) - {leaving})
        host = c.hosts[leaving]
        drained = time.monotonic()
        with host.admin(120) as admin:
            for _ in admin.drain("", 1.0):
                pass
        assert host.sidecar.wait(60) == 0, host.log()[-3000:]
        host.killed = True  # gone: its node goes with its namespace's processes
        host.net.kill_all()
        c.wait_rings(rest, timeout=60)
        converge = time.monotonic() - drained
        self._steady()
        f = self.measure(f"e) {joining} joins, {leaving} drained and leaves", start, time.time(), converge,
                         self.pins_kept([h for h in HOSTS if h != leaving]))
        f.notes.append(f"rings with {joining}: {join_s:.2f} s after it served")
        return f
