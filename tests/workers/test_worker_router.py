"""WorkerRouter (tfscache.workers.router) against recording gRPC servers standing for a node and
for the control process's internal listener: the warm path goes to the node under a delegation, the
rest to the control process (then a delegation is asked for), a failed delegated send goes through
the control process and drops the delegation, and a forwarded request's load report comes back."""

from __future__ import annotations

import aiohttp
import pytest
from frontend.test_router import PREDICT, RecordingServer

from tfscache import errors
from tfscache.frontend.backends import LOAD_KEY
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.upstream import Upstream
from tfscache.workers.delegation import Delegations, Grant
from tfscache.workers.router import WorkerRouter


class ReportingServer(RecordingServer):
    """A RecordingServer that sends ``trailers`` (trailing metadata) with each answer."""

    trailers: tuple = ()

    async def _handle(self, request: bytes, context):
        if self.trailers:
            context.set_trailing_metadata(self.trailers)
        return await super()._handle(request, context)


@pytest.fixture
async def world():
    node, control = RecordingServer("node"), ReportingServer("control")
    for server in (node, control):
        await server.server.start()
    http = aiohttp.ClientSession()
    upstreams = {}

    def upstream(address: str) -> Upstream:
        if address not in upstreams:
            upstreams[address] = Upstream(address, None, http, max_send_bytes=1 << 20, max_receive_bytes=1 << 20)
        return upstreams[address]

    table, wanted = Delegations(), []
    router = WorkerRouter(upstream(f"127.0.0.1:{control.port}"), table, want=wanted.append,
                          node_upstream=lambda grant: upstream(grant.grpc))
    grant = Grant(("addk_1", 1), ("node0", "addk_1", 1), f"127.0.0.1:{node.port}", None)
    yield router, table, wanted, grant, node, control
    for u in upstreams.values():
        await u.close()
    await http.close()
    for server in (node, control):
        await server.server.stop(0)


async def test_cold_goes_to_the_control_process_then_asks_once(world):
    router, table, wanted, grant, node, control = world
    key = RouteKey("addk_1", 1)
    for _ in range(3):
        assert await router.grpc(PREDICT, key, b"x", (), None) == b"from-control"
    assert wanted == [("addk_1", 1)] and node.calls == []  # one question until answered
    table.add(grant)
    assert await router.grpc(PREDICT, key, b"x", (), None) == b"from-node"
    rows = table.report()  # [node, name, version, requests, last use, in flight]
    assert [row[:4] + row[5:] for row in rows] == [["node0", "addk_1", 1, 1, 0]]
    assert len(node.calls) == 1 and len(control.calls) == 3


async def test_probes_labels_forwarded_and_unnamed_requests_never_take_a_delegation(world):
    router, table, wanted, grant, node, control = world
    table.add(grant)
    await router.grpc(PREDICT, RouteKey("addk_1", 1), b"x", (), None, probe=lambda answer: b"")
    await router.grpc(PREDICT, RouteKey("addk_1", 1), b"x", (), None, forwarded=True)
    await router.grpc(PREDICT, None, b"x", (), None)
    assert node.calls == [] and len(control.calls) == 3 and wanted == []


async def test_a_delegated_send_the_node_fails_goes_through_the_control_process(world):
    router, table, _, grant, node, control = world
    table.add(grant)
    node.reply = lambda request: errors.NotFound("Servable not found for request: Specific(addk_1, 1)")
    assert await router.grpc(PREDICT, RouteKey("addk_1", 1), b"x", (), None) == b"from-control"
    assert len(node.calls) == 1 and len(control.calls) == 1
    assert table.begin(("addk_1", 1)) is None  # dropped: the next request is cold
    assert grant.in_flight == 0 and grant.idle.is_set()


async def test_a_forwarded_requests_load_report_comes_back(world):
    router, _, _, _, _, control = world
    control.trailers = ((LOAD_KEY, "3"),)
    await router.grpc(PREDICT, RouteKey("addk_1", 1), b"x", (), None, forwarded=True)
    assert router.own_load() == "3"
    control.trailers = ()
    await router.grpc(PREDICT, RouteKey("addk_1", 1), b"x", (), None, forwarded=True)
    assert router.own_load() is None  # none reported on this answer
