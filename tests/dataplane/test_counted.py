"""`--routed-requests counted`: HAProxy logs no routed request to tfscache; the stick table's
counts alone come back (docs/data-plane.md, "Logged or counted"). A real HAProxy, a real
`tfscache node`, the official TF Serving client."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from support.dataplane import serving
from support.serving import link_repository
from support.node import node_template
from support.waiting import until

from tfscache import settings as settings_mod
from tfscache.dataplane import binary
from dataplane.test_serve import answered, predict, routed, routed_count

pytestmark = [
    pytest.mark.skipif(not binary.available(),
                       reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)"),
    pytest.mark.asyncio(loop_scope="module"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(synthetic_models, tmp_path_factory):
    repo = link_repository(tmp_path_factory.mktemp("counted-repo") / "models", synthetic_models(2))
    settings = settings_mod.load(None, {}, {
        "model_repository": str(repo), "node.local_nodes": 1, "server.data_plane": "haproxy",
        "server.routed_requests": "counted", "server.grpc_port": 0, "server.rest_port": 0,
        "server.bind_address": "127.0.0.1", "node.template_socket": node_template(),
        "node.state_dir": str(tmp_path_factory.mktemp("counted-app") / "state")})
    async with serving(settings) as app:
        yield app


async def test_routed_requests_are_counted_but_not_logged(app):
    assert app.dataplane.request_log is None  # no socket, no log line in haproxy.cfg
    config = (app.dataplane.supervisor.plan.state_dir / "haproxy.cfg").read_text()
    assert "log-format" not in config
    assert await asyncio.to_thread(predict, app.target, "addk_1") == 2.0  # cold: the slow path
    await until(lambda: routed(app, "addk_1"), 30, "addk_1 routed")
    slow = answered(app, "grpc", "Predict", "OK")
    assert slow >= 1
    for x in range(5):
        assert await asyncio.to_thread(predict, app.target, "addk_1", float(x)) == x + 1.0
    assert await routed_count(app, "addk_1") == 5  # HAProxy routed them all
    # /metrics counts them per node (from the stick table) ...
    await until(lambda: app.metrics.registry.get_sample_value(
        "tfscache_dataplane_routed_total", {"node": "node0"}) == 5, 10, "the routed counter")
    # ... and the request metrics, which need each request's line, count only the slow path's
    assert answered(app, "grpc", "Predict", "OK") == slow
    # per-node latency, from HAProxy's own statistics (show stat), read every second
    await until(lambda: app.metrics.registry.get_sample_value(
        "tfscache_dataplane_response_seconds", {"node": "node0", "protocol": "grpc"}) is not None,
                10, "node0's response time")
    assert 0 <= app.metrics.registry.get_sample_value(
        "tfscache_dataplane_response_seconds", {"node": "node0", "protocol": "grpc"}) < 60
    assert app.metrics.registry.get_sample_value(  # no REST request routed: no figure
        "tfscache_dataplane_response_seconds", {"node": "node0", "protocol": "rest"}) is None
