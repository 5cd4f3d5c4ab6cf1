"""Two sidecars that find each other through DNS (a real dnsmasq with the SRV records a headless
Kubernetes Service publishes for a StatefulSet), route to each other, and follow the records."""

from __future__ import annotations

from support.sidecars import predict
from support.dnsmasq import Dnsmasq
from support.sidecars import sidecar_settings
from support.waiting import until
from tfscache.app import ServeApp

SERVICE = "tfscache-headless.tfs.test"


def _records(dns: Dnsmasq, apps: dict[str, ServeApp]) -> None:
    """What Kubernetes publishes for the ready pods: POD.SERVICE A records, one SRV per named port."""
    dns.set_hosts({f"{name}.{SERVICE}": ["127.0.0.1"] for name in apps})
    dns.set_srv([(f"_grpc._tcp.{SERVICE}", f"{name}.{SERVICE}", app.grpc_port) for name, app in apps.items()]
                + [(f"_rest._tcp.{SERVICE}", f"{name}.{SERVICE}", app.rest_port) for name, app in apps.items()])


async def test_sidecars_find_each_other_through_dns_and_route(nodes, frontend_repo, tmp_path):
    options = {"backend": "dns", "dns_name": SERVICE, "dns_interval_s": 0.1, "retry_max_s": 0.5,
               "start_timeout_s": 10, "request_timeout_s": 1}
    with Dnsmasq(tmp_path / "dns") as dns:
        apps = {}
        for name, node in nodes.items():
            s = sidecar_settings(name, node, frontend_repo, tmp_path)
            for key, value in {**options, "dns_server": dns.server}.items():
                setattr(s.discovery, key, value)
            apps[name] = ServeApp(s)
        try:
            for app in apps.values():
                await app.start()  # no records yet: each is alone on its own ring
            assert [app.router.ring.nodes for app in apps.values()] == [["a"], ["b"]]
            registered, message = await apps["a"].join()
            assert not registered and message.startswith("dns discovery: nothing to register")
            _records(dns, apps)  # both pods ready
            for app in apps.values():
                await until(lambda: app.router.ring.nodes == ["a", "b"], 20, "the ring [a, b]")
            assert apps["a"].discovery.members()[1].grpc == f"127.0.0.1:{apps['b'].grpc_port}"
            models = [f"addk_{k}" for k in range(8)]
            assert {apps["a"].router.ring.owner(m) for m in models} == {"a", "b"}
            for i, name in enumerate(models):
                entry = apps["a" if i % 2 else "b"]  # half through the owner, half forwarded
                assert (await predict(entry, name, 1.0)).outputs["y"].float_val == [1.0 + int(name[5:])]
            # b's pod turns unready: Kubernetes drops its records, and a's ring follows.
            _records(dns, {"a": apps["a"]})
            await until(lambda: apps["a"].router.ring.nodes == ["a"], 20, "the ring [a]")
            for name in models:
                assert (await predict(apps["a"], name, 3.0)).outputs["y"].float_val == [3.0 + int(name[5:])]
        finally:
            for app in apps.values():
                await app.stop(grace=0)
