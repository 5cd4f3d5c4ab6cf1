"""Sidecars that find each other through discovery (etcd real, Consul fake), with traffic through an outage.

Needs the [discovery] settings section and serve.py's wiring (docs/discovery.md).
"""

from __future__ import annotations

import asyncio

import pytest

from fakes.consul import FakeConsul
from support.sidecars import predict
from support.etcd import EtcdCluster
from support.sidecars import sidecar_settings
from support.waiting import until
from tfscache import settings as settings_mod
from tfscache.app import ServeApp


def _settings(name, node, repo, state_dir, discovery: dict):
    s = sidecar_settings(name, node, repo, state_dir)
    for key, value in discovery.items():
        setattr(s.discovery, key, value)
    return s


@pytest.mark.parametrize("backend", ["consul", "etcd"])
async def test_sidecars_form_and_survive_a_discovery_outage(backend, nodes, frontend_repo, tmp_path):
    if backend == "consul":
        consul = FakeConsul()
        await consul.start()
        options = {"backend": "consul", "consul_address": consul.url, "ttl_s": 1.5}
        cluster = None
    else:
        cluster = EtcdCluster(tmp_path / "etcd", size=3).start()
        options = {"backend": "etcd", "etcd_endpoints": cluster.endpoints, "ttl_s": 2}
    options.update(retry_max_s=0.5, start_timeout_s=10)
    apps = {name: ServeApp(_settings(name, node, frontend_repo, tmp_path, options)) for name, node in nodes.items()}
    try:
        for app in apps.values():
            await app.start()
        for app in apps.values():
            await until(lambda: app.router.ring.nodes == ["a", "b"], 20, "the ring [a, b]")
        models = [f"addk_{k}" for k in range(8)]
        for name in models:
            assert (await predict(apps["a"], name, 1.0)).outputs["y"].float_val == [1.0 + int(name[5:])]
        # The outage: requests keep flowing and the ring does not move.
        if cluster is None:
            await consul.stop()
            await until(lambda: all(app.discovery.failing for app in apps.values()), 20,
                        "discovery failing on both")
        else:
            cluster.kill(0)  # the first endpoint of both sidecars
        for round_ in range(3):
            for name in models:
                entry = apps["a" if round_ % 2 else "b"]
                assert (await predict(entry, name, 2.0)).outputs["y"].float_val == [2.0 + int(name[5:])]
            await asyncio.sleep(1.0)  # on purpose: makes the outage outlast the TTL
        assert all(app.router.ring.nodes == ["a", "b"] for app in apps.values())
        if cluster is None:
            await consul.start()
        await apps["b"].stop(grace=1)  # deregisters: a's ring shrinks to itself
        await until(lambda: apps["a"].router.ring.nodes == ["a"], 20, "the ring [a]")
    finally:
        for app in apps.values():
            await app.stop(grace=0)
        if cluster is None:
            await consul.stop()
        else:
            cluster.close()


def test_settings_section_round_trips(tmp_path):
    (tmp_path / "m").mkdir()
    s = settings_mod.load(env={"TFSCACHE_DISCOVERY_BACKEND": "etcd", "TFSCACHE_DISCOVERY_ETCD_ENDPOINTS":
                               "http://10.0.0.1:2379 http://10.0.0.2:2379"},
                          overrides={"model_repository": str(tmp_path / "m"), "node.node_address": "h:1",
                                     "ring.self_name": "a"})
    assert s.discovery.etcd_endpoints == ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    with pytest.raises(settings_mod.SettingsError, match="ring.self_name"):
        settings_mod.load(env={"TFSCACHE_DISCOVERY_BACKEND": "consul"},
                          overrides={"model_repository": str(tmp_path / "m"), "node.node_address": "h:1"})
