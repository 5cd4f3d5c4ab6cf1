"""A cluster of real hosts under partitions: each host a Linux network namespace on a private
bridge with its own address, running a ``tfscache node`` and its sidecar; discovery by a real
etcd and by a real DNS server (dnsmasq) in a namespace of their own; 16 clients (official
tensorflow_serving.apis stubs and REST, Zipf model choice, 10 s deadlines) in another.

The CI version of scripts/soak_partitions.py (tests/support/netns/scenarios.py; docs/reliability.md),
on one cluster whose sidecars are restarted from DNS to etcd discovery between the two sets, in order:

dns: a) and d), the two where DNS behaves unlike etcd: records do not expire, so a host cut off
stays on every ring and its peers must route around it; and nothing registers.
etcd: a) a host's link down for 4 s, then up; b) a host killed whole, then restarted on its state;
c) a peer slowed by 300 ms each way by a user-space proxy; d) etcd and DNS unreachable for 5 s;
e) a host joins and another is drained and leaves.

In each, with one host faulted at a time and two replicas per model, a replica of every model
stays reachable: no request may fail, no host may hold more models than its cap, pins are kept,
and the rings are whole again after healing.
"""

from __future__ import annotations

import shutil

import pytest

from support.netns import unavailable
from support.netns.cluster import NetCluster
from support.netns.scenarios import CI, Scenarios

from .conftest import MODELS


def _reason() -> str | None:
    missing = [tool for tool in ("etcd", "dnsmasq") if shutil.which(tool) is None and
               not shutil.which(tool, path="/usr/sbin:/usr/bin")]
    if missing:
        return f"{' and '.join(missing)} not installed (scripts/test.sh installs etcd-server and dnsmasq-base)"
    return unavailable()


REASON = _reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces here: {REASON}")

CASES = [("dns", "cut_off"), ("dns", "discovery_down"), ("etcd", "cut_off"), ("etcd", "kill_whole"),
         ("etcd", "slow_peer"), ("etcd", "discovery_down"), ("etcd", "join_and_drain")]


class Clusters:
    """One cluster of hosts a, b, c, d; a test of another backend restarts the sidecars with it."""

    def __init__(self, repository, directory) -> None:
        self.repository, self.directory = repository, directory
        self.cluster = self.run = None

    def get(self, backend: str) -> Scenarios:
        if self.cluster is None:
            self.cluster = NetCluster(self.directory, self.repository, MODELS, backend=backend).start()
            self.run = Scenarios(self.cluster, CI)
            self.run.setup()
        elif self.cluster.backend != backend:
            self.run.close()
            self.cluster.switch_backend(backend)
            self.run = Scenarios(self.cluster, CI)
            self.run.setup(traffic_seed=2, started=True)  # its own results file
        return self.run

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
        if self.cluster is not None:
            self.cluster.close()


@pytest.fixture(scope="module")
def clusters(cluster_repo, tmp_path_factory):
    made = Clusters(cluster_repo, tmp_path_factory.mktemp("netns"))
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize(("backend", "scenario"), CASES, ids=[f"{b}-{s}" for b, s in CASES])
def test_partition_scenario(clusters, backend, scenario):
    run = clusters.get(backend)
    figures = getattr(run, scenario)()
    print(figures.as_dict())
    assert figures.requests > 0
    assert figures.failed == {}, figures.failure_examples
    assert figures.max_resident <= figures.cap, figures
    assert figures.pins_kept, run.pinned
    if scenario == "discovery_down":  # a registry outage never moves a ring, not even when it ends
        assert figures.notes[0] == "rings seen changed: 0 samples", figures.notes
    if scenario != "slow_peer":
        assert figures.converge_s is not None
