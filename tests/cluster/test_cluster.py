"""A 3-sidecar cluster on loopback through each discovery backend: forms, survives faults, resizes, drains.

Every process is real: ``tfscache node`` (x3, a 4th for the resize) and one ``tfscache
serve --node-address`` sidecar per node, through static peers (config file + SIGHUP),
the fake Consul, or a real 3-member etcd. The module's tests share one cluster per
backend and run in order: form -> discovery outage -> resize (add d with --no-join, prewarm, join)
and drain b -> kill c.

What the design promises (docs/discovery.md, tfscache/frontend/router.py) and what is
asserted, with ``ring.replicas_per_model = 2``:

* A router tries a model's replicas in order and retries once, on the next replica, when
  the first answers UNAVAILABLE. So while a killed or drained sidecar is still on a ring,
  a request routed to it is retried on the model's other replica: **zero failed requests**
  before, during and after the transition. (With one replica per model, requests for the
  dead sidecar's models would fail UNAVAILABLE until it leaves the ring: there would be no
  other replica to retry.)
* Clients only call live sidecars: the traffic's target list drops a sidecar before it is
  killed or drained, as a Service drops a pod whose readiness probe fails.
* Static discovery has no health check: a dead or drained sidecar leaves the rings only
  when the peers file is edited and the sidecars get SIGHUP.
* A sidecar started with ``--no-join`` (Consul/etcd) stays off every ring, its own included,
  until ``tfscache join``: it can be prewarmed first.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request

from support.node import PYTHON, REPO
from support.waiting import wait_until
from tfscache.cluster.ring import Ring

from .conftest import MODELS, REPLICAS, Client, Traffic


def tfscache(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tfscache", *args], cwd=REPO, capture_output=True, text=True, timeout=180)


def spills_to(sidecar, node: str) -> float:
    """``tfscache_copy_spills_total{node=...}`` on ``sidecar``'s metrics page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.ports['metrics']}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(rf'^tfscache_copy_spills_total{{node="{node}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def replicas(names, model) -> list[str]:
    return Ring(sorted(names), replicas=REPLICAS).replicas_for(model)


def test_the_cluster_forms_and_every_sidecar_serves_every_model(cluster):
    cluster.wait_rings(["a", "b", "c"])
    client = Client()
    try:
        for sidecar in cluster.live():  # every model through every sidecar, with its own answer
            for i, name in enumerate(MODELS):
                client.check(sidecar.grpc_target, name, float(i))
    finally:
        client.close()
    # Requests landed where the rings say: each model is resident on its two replicas only.
    for sidecar in cluster.live():
        expected = {m for m in MODELS if sidecar.name in replicas("abc", m)}
        assert sidecar.resident() == expected, sidecar.name
        assert sidecar.status()["misses"] == len(expected)  # one cold load each, the rest hits


def test_a_discovery_outage_during_traffic_costs_no_request(cluster):
    registry = cluster.registry
    sidecars = cluster.live()
    with Traffic([s.grpc_target for s in sidecars]) as traffic:
        traffic.wait_sent(20)
        if registry.name == "consul":
            registry.stop()  # the agent is gone; blocking queries and TTL passes fail
            wait_until(lambda: all("consul discovery" in s.log() and "failing" in s.log() for s in sidecars), 20,
                       "every sidecar to see the outage")
        elif registry.name == "etcd":
            registry.cluster.kill(0)  # the first endpoint of every sidecar: watches and keep-alives move
        else:  # static has no registry: its failure is a peers file that cannot be read
            for s in sidecars:
                s.config.write_text(s.config.read_text().replace("[ring]", "[ring", 1))
                s.process.send_signal(signal.SIGHUP)
            wait_until(lambda: all("failing" in s.log() for s in sidecars), 20, "the bad file to be reported")
        # The outage outlasts two TTLs (a sidecar's own registration would have expired by then).
        outage_s = 2 * registry.ttl_s
        start = traffic.sent
        wait_until(lambda: traffic.sent - start >= 50, 60, "50 requests in the outage")
        _wait_seconds(outage_s)
        assert all(s.ring() == ["a", "b", "c"] for s in sidecars)
        if registry.name == "consul":
            registry.start()
        elif registry.name == "etcd":
            registry.cluster.restart(0)
        else:
            for s in sidecars:
                s.config.write_text(s.config.read_text().replace("[ring\n", "[ring]\n", 1))
                s.process.send_signal(signal.SIGHUP)
            wait_until(lambda: all("recovered" in s.log() for s in sidecars), 20, "the file to be read again")
        traffic.wait_sent(20)
    assert traffic.failures == []
    cluster.wait_rings(["a", "b", "c"])


def _wait_seconds(seconds: float) -> None:
    """An outage that must last this long: a wall-clock condition, not a guess at a race."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, seconds + 5, f"{seconds} s to pass")


def test_resize_with_the_tools_then_drain_one_sidecar(cluster, tmp_path):
    registry = cluster.registry
    a, b, c = (cluster.sidecars[n] for n in "abc")
    # 1. The new sidecar d starts with --no-join: with Consul/etcd it follows the membership (its
    #    ring is the cluster's, without itself) but does not register, so nobody routes to it yet;
    #    with static peers (which ignore --no-join), nobody lists it yet.
    d = cluster.add("d", join=False)
    if registry.name == "static":
        assert d.ring() == ["d"]
    else:
        cluster.wait_rings(["a", "b", "c"], among=[d])
        assert "not registering" in d.log()
    assert all(s.ring() == ["a", "b", "c"] for s in (a, b, c))
    # 2. Plan.
    run = tfscache("plan-resize", "--current", "a,b,c", "--new", "a,b,c,d", "--replicas", str(REPLICAS),
                 "--model-repository", str(cluster.repository), "--json", "--no-progress")
    assert run.returncode == 0, run.stderr
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(run.stdout)
    plan = json.loads(run.stdout)
    gaining = sorted(m["name"] for m in plan["moved"] if "d" in m["to"] and "d" not in m["from"])
    assert gaining == sorted(m for m in MODELS if "d" in replicas("abcd", m)) and gaining
    # 3. Prewarm: the hot moving models (all resident on their current owners) onto d.
    addresses = [arg for s in (a, b, c, d) for arg in ("--address", f"{s.name}={s.admin_target}")]
    run = tfscache("prewarm", "--plan", str(plan_path), *addresses, "--no-progress")
    assert (run.returncode, run.stdout) == (0, f"prewarmed {len(gaining)} of {len(gaining)} model copies "
                                               f"({len(gaining)} models)\n"), run.stderr
    assert d.resident() == set(gaining)
    # 4. Switch, under traffic.
    old_misses = sum(s.counts()[1] for s in (a, b, c))
    with Traffic([s.grpc_target for s in (a, b, c)]) as traffic:
        traffic.wait_sent(20)
        misses_before = d.counts()[1]  # what the preloads counted
        run = tfscache("join", "--address", d.admin_target)
        if registry.name == "static":  # nothing to register: the peers files are the membership
            assert run.returncode == 0 and run.stdout.startswith("static discovery: nothing to register"), run.stderr
            cluster.set_static_peers(["a", "b", "c", "d"])
        else:
            assert (run.returncode, run.stdout) == (0, f"d registered with {registry.name} discovery\n"), run.stderr
        cluster.wait_rings(["a", "b", "c", "d"])
        if registry.name != "static":  # Join is idempotent
            run = tfscache("join", "--address", d.admin_target)
            assert (run.returncode, run.stdout) == (
                0, f"d is already registered with {registry.name} discovery\n"), run.stderr
        traffic.add(d.grpc_target)
        traffic.wait_sent(40)
        # The moved models are served by their new owner, without a cold load there.
        client = Client()
        try:
            for name in gaining:
                client.check(d.grpc_target, name, 3.0)
        finally:
            client.close()
        assert d.counts()[1] == misses_before
        assert d.resident() == set(gaining)
        # Nor anywhere else: every model's new replicas held it before the switch.
        assert sum(s.counts()[1] for s in (a, b, c)) == old_misses
        # 5. Drain b with the tool while the traffic goes on (clients first stop calling b).
        traffic.remove(b.grpc_target)
        run = tfscache("drain", "--address", b.admin_target, "--no-progress")
        assert (run.returncode, run.stdout) == (0, f"drained {b.admin_target}; the process exited\n"), run.stderr
        assert b.process.wait(30) == 0
        if registry.name == "static":  # no health check: b leaves the lists by hand
            cluster.set_static_peers(["a", "c", "d"])
        cluster.wait_rings(["a", "c", "d"])
        traffic.wait_sent(40)
    b.node.stop()
    assert traffic.failures == []


def test_a_killed_sidecar_leaves_the_ring_and_its_models_load_elsewhere(cluster):
    registry = cluster.registry
    a, c, d = (cluster.sidecars[n] for n in "acd")
    # While c is still on a's ring, a request through a for a model whose first replica is c
    # (a not among its replicas) does not fail: a tries the dead c, is refused and retries on d, or
    # the copies rule (docs/copies.md) sends it past c to d at once (c's last reported load over its
    # bound: counted as a spill to d). Until that probe is answered the traffic goes through d
    # alone, so nothing else of a's marks c first.
    probe = next(m for m in MODELS if replicas("acd", m)[0] == "c" and "a" not in replicas("acd", m))
    with Traffic([s.grpc_target for s in (a, c, d)]) as traffic:
        traffic.wait_sent(20)
        traffic.remove(c.grpc_target)
        traffic.remove(a.grpc_target)
        c.process.send_signal(signal.SIGKILL)  # no deregistration: the TTL check must fail
        c.node.kill()
        c.process.wait(10)
        retries, spills = a.log().count("c unavailable for"), spills_to(a, "d")
        probe_client = Client()
        try:
            probe_client.check(a.grpc_target, probe, 7.0)
        finally:
            probe_client.close()
        traffic.add(a.grpc_target)
        if registry.name == "static" or "c" in a.ring():  # static: c stays until the file changes
            assert a.log().count("c unavailable for") > retries or spills_to(a, "d") > spills, \
                "the probe neither took the retry path nor spilled past c"
        if registry.name == "static":  # no health check: the file is edited and SIGHUP sent
            cluster.set_static_peers(["a", "d"])
        # Consul TTL 1.5 s, etcd lease 2 s: gone from both rings within a few TTLs.
        cluster.wait_rings(["a", "d"], timeout=max(10.0, 5 * registry.ttl_s))
        left_at = traffic.sent
        traffic.wait_sent(len(MODELS) * 2 + 10)
        assert traffic.sent > left_at
    assert traffic.failures == []
    # c's models loaded on their next request elsewhere: on a or d, whichever the copies rule
    # routed them to (docs/copies.md: among a model's copies, the first under its load bound).
    owned_by_c = [m for m in MODELS if "c" in replicas("acd", m)]
    assert owned_by_c
    client = Client()
    try:
        for sidecar in (a, d):
            for name in MODELS:
                client.check(sidecar.grpc_target, name, 5.0)
    finally:
        client.close()
    resident = a.resident() | d.resident()
    assert set(owned_by_c) <= resident
