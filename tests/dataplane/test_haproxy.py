"""The data plane's parts against real HAProxy and real `tfscache node` processes: the rendered
configuration, routing TF Serving's hot methods by the model named in the gRPC body or the REST
path, routes taken away only once their requests in flight are done, restarts and reloads.

Two nodes serve a model named ``m``: node A computes x + 1, node B x + 2. B stands in for
tfscache's Python front end (the fallback every unrouted request goes to), so each answer says
which way a request went: 2.0 routed to A, 3.0 the slow path. A third node, C (x + 3: 4.0),
stands in for a second copy of ``m`` where a route names a group of nodes. The official TF
Serving stubs are the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

import trustme

from support.certs import write_ca, write_leaf
from support.holdproxy import HoldProxy
from support.models import tfserving
from support.node import start_node
from support.waiting import until
from tfscache.dataplane import binary, certs, config
from tfscache.dataplane.process import HaproxyConfigError, Supervisor
from tfscache.dataplane.routes import Routes, revoked
from tfscache.dataplane.runtime import Runtime, RuntimeApiError
from tfscache.frontend.protocols.tfserving import DATA_PLANE
from tfscache.settings.sections import TlsSection

pytestmark = pytest.mark.skipif(
    not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)")

ROUTED, FALLBACK, COPY = 2.0, 3.0, 4.0  # node A answers x + 1, node B x + 2, node C x + 3 (x = 1)


def _config(base) -> str:
    return ('model_config_list { config { name: "m" base_path: "%s" '
            'model_platform: "tensorflow" } }' % base)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dataplane")
    a, b = tfserving.build_addk(tmp / "a", 1), tfserving.build_addk(tmp / "b", 2)
    with start_node(tmp, config=_config(a)) as node_a, start_node(tmp, config=_config(b)) as node_b:
        yield node_a, node_b


@pytest.fixture(scope="module")
def copy_c(tmp_path_factory):
    """Node C: ``m`` as x + 3, a second copy beside node A's (its answers are COPY)."""
    tmp = tmp_path_factory.mktemp("dataplane-copy")
    with start_node(tmp, config=_config(tfserving.build_addk(tmp / "c", 3))) as node_c:
        yield node_c


class Plane:
    """A Supervisor on public sockets bound here, its Routes, and clients of both ports."""

    def __init__(self, tmp_path, routed_to: str, fallback, others=(), mark=None) -> None:
        """Node ``a`` is ``routed_to``; ``others``: more (name, node) pairs; ``mark``: sidecar
        mode's forwarded mark (header, value), with the table ``missed``."""
        self.mark = mark
        self.grpc_socket = socket.create_server(("127.0.0.1", 0))
        self.rest_socket = socket.create_server(("127.0.0.1", 0))
        self.state = tmp_path / "dataplane"
        self.fallback = fallback
        self.plan = self.plan_for([
            config.Node(name, node.grpc_target, f"127.0.0.1:{node.rest_port}")
            for name, node in [("a", routed_to), *others]])
        self.runtime = Runtime(self.plan.runtime_socket)
        self.supervisor = Supervisor("haproxy", self.state, self.plan, runtime=self.runtime)
        self.routes = Routes(self.runtime, self.plan.map_path,
                             elsewhere=self.supervisor.old_in_flight,
                             unroute_elsewhere=self.supervisor.unroute_old)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_socket.getsockname()[1]}")
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def plan_for(self, nodes) -> config.Plan:
        return config.Plan(
            grpc_fd=self.grpc_socket.fileno(), rest_fd=self.rest_socket.fileno(),
            fallback_grpc=self.fallback.grpc_target,
            fallback_rest=f"127.0.0.1:{self.fallback.rest_port}", nodes=nodes,
            state_dir=self.state, runtime_socket=config.runtime_socket_for(self.state),
            rules=DATA_PLANE, mark=self.mark)

    def predict(self, n: int = 1, version: int | None = None, label: str | None = None,
                compression=None) -> float:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        if version is not None:
            request.model_spec.version.value = version
        if label is not None:
            request.model_spec.version_label = label
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([1.0] * n, dtype=tf.float32))
        reply = self.stub.Predict(request, timeout=30, compression=compression)
        return reply.outputs["y"].float_val[0]

    def rest(self, path: str = "/v1/models/m:predict") -> float:
        port = self.rest_socket.getsockname()[1]
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST",
                                         data=json.dumps({"instances": [1.0]}).encode())
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())["predictions"][0]

    async def __aenter__(self):
        config.private_dir(self.plan.runtime_socket.parent)
        await self.supervisor.start()
        return self

    async def __aexit__(self, *exc):
        await self.supervisor.stop()
        if not self.plan.runtime_socket.is_relative_to(self.state):  # kept apart: a long path
            shutil.rmtree(self.plan.runtime_socket.parent, ignore_errors=True)
        self.channel.close()
        self.grpc_socket.close()
        self.rest_socket.close()


def _call(fn, *args, **kwargs):
    return asyncio.to_thread(fn, *args, **kwargs)


@pytest.mark.parametrize("count, group_width, width, sidecar",
                         [(1, None, 1, False), (3, None, 3, False), (4, 2, 2, False),
                          (2, 1, 1, False), (1, 1, 1, True)])
def test_the_rendered_configuration_is_valid(tmp_path, count, group_width, width, sidecar):
    # sidecar mode: two peers, one without a REST port
    with socket.create_server(("127.0.0.1", 0)) as g, socket.create_server(("127.0.0.1", 0)) as r:
        plan = config.Plan(grpc_fd=g.fileno(), rest_fd=r.fileno(), fallback_grpc="127.0.0.1:1",
                           fallback_rest="127.0.0.1:2",
                           nodes=[config.Node(f"n{i}", "127.0.0.1:3", "127.0.0.1:4")
                                  for i in range(count)],
                           state_dir=tmp_path, runtime_socket=tmp_path / "runtime.sock",
                           rules=DATA_PLANE, log_socket=tmp_path / "requests.sock",
                           group_width=group_width,
                           peers=[config.Node("p1", "127.0.0.1:5", "127.0.0.1:6"),
                                  config.Node("p2", "127.0.0.1:7", "")] if sidecar else (),
                           mark=("x-tfscache-forwarded", "own") if sidecar else None,
                           peer_private=("x-tfscache-load",),
                           via=("x-tfscache-via", "haproxy") if sidecar else None)
        text = config.render(plan)
        (tmp_path / "haproxy.cfg").write_text(text)
        (tmp_path / config.MAP).write_text("")
        (tmp_path / config.PEER_MAP).write_text("")
        check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")],
                               capture_output=True, text=True, pass_fds=(g.fileno(), r.fileno()))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "Warning" not in check.stdout + check.stderr, check.stdout + check.stderr
    # a group has at most as many nodes as there are, or as it may (a model's most copies): one
    # choice step per node after the first, in each front end; then the count under the node
    # chosen, and in the node's load
    for frontend in ("grpc", "rest"):
        rules = text.split(f"frontend {frontend}\n", 1)[1].split("\n\n", 1)[0].splitlines()
        at = lambda part: next(i for i, line in enumerate(rules) if part in line)
        assert sum(",table_conn_cur(load)" in line for line in rules) == width
        assert any(f"word({width},+)" in line for line in rules)
        assert not any(f"word({width + 1},+)" in line for line in rules)
        # consecutive: the lookup, the choice (2 rules, 5 more per node), its key, both counts
        lookup, counted = at(",map("), at("track-sc0 var(txn.key) table inflight")
        # sidecar mode: the peers' map, unless marked as forwarded, right after the nodes' map
        assert counted == lookup + 4 + 5 * (width - 1) + 2 * sidecar
        assert at("track-sc1 var(txn.node) table load") == counted + 1
        if sidecar:
            assert "!forwarded" in rules[at(f"map({tmp_path / config.PEER_MAP})")]
            assert "table missed" in rules[at("track-sc2")]
    if sidecar:  # a peer's backend marks what it sends, and says HAProxy sent it (the peer then
        # sends no load report); one with no REST port is the slow path
        backends = {part.split("\n", 1)[0]: part for part in text.split("\nbackend ")[1:]}
        for name in ("grpc_p1", "rest_p1", "grpc_p2"):
            assert "set-header x-tfscache-forwarded own" in backends[name]
            assert "set-header x-tfscache-via haproxy" in backends[name]
            assert "backup" in backends[name]
        assert "x-tfscache-load" in backends["rest_p1"]
        assert backends["rest_p2"].strip().splitlines()[1:] == ["    server python 127.0.0.1:2"]


def test_each_request_to_a_node_or_a_peer_gets_a_connection_of_its_own_unless_shared(tmp_path):
    """server.node_connections: per-request (the default) writes max-reuse 0 on the nodes' and
    the peers' server lines, so a node's crash fails no request (docs/data-plane.md, "Nodes that
    fail"); shared leaves it out. The Python front end's lines keep their connections either way.
    A routed REST request is held until HAProxy has its body, so that it can be sent again."""
    plan = config.Plan(grpc_fd=3, rest_fd=4, fallback_grpc="127.0.0.1:1",
                       fallback_rest="127.0.0.1:2",
                       nodes=[config.Node("n0", "127.0.0.1:3", "127.0.0.1:4")],
                       state_dir=tmp_path, runtime_socket=tmp_path / "runtime.sock",
                       rules=DATA_PLANE, peers=[config.Node("p1", "127.0.0.1:5", "127.0.0.1:6")],
                       mark=("x-tfscache-forwarded", "own"))

    def servers(text: str) -> dict[str, str]:
        return {line.split()[1] + "@" + backend.split("\n", 1)[0]: line.strip()
                for backend in text.split("\nbackend ")[1:]
                for line in backend.splitlines() if line.strip().startswith("server ")}

    apart, shared = (servers(config.render(dataclasses.replace(plan, shared_connections=flag)))
                     for flag in (False, True))
    assert apart.keys() == shared.keys() == {
        "n0@grpc_n0", "python@grpc_n0", "n0@rest_n0", "python@rest_n0", "p1@grpc_p1",
        "python@grpc_p1", "p1@rest_p1", "python@rest_p1", "python@python_grpc",
        "python@python_rest"}
    for key, line in apart.items():
        assert ("max-reuse 0" in line) == (not key.startswith("python@")), line
        assert "max-reuse" not in shared[key], shared[key]
    rest = config.render(plan).split("frontend rest\n", 1)[1].split("\n\n", 1)[0]
    assert (f"http-request wait-for-body time 1s at-least {config.BODY_AT_LEAST} "
            "if { var(txn.node) -m found }") in rest


def test_a_route_names_a_group_and_a_revocation_leaves_the_others():
    assert config.group(["node0", "node1"]) == "node0+node1"
    assert config.members("node0+node1") == ("node0", "node1") and config.members("a") == ("a",)
    # a revocation of a node keeps the group's other nodes, in their order; the last one goes
    assert revoked("a+b+c", "b") == "a+c"
    assert revoked("a+b", "a") == "b"
    assert revoked("a", "a") is None


def _tls_section(tmp_path, client_ca: bool):
    """A [tls] section of trustme files: a server certificate, and (mutual TLS) its CA."""
    from tfscache.settings.sections import TlsSection

    ca = trustme.CA()
    tmp_path.mkdir(exist_ok=True)
    leaf = write_leaf(ca, tmp_path / "server", "127.0.0.1")
    return TlsSection(cert_file=str(leaf.cert), key_file=str(leaf.key),
                      client_ca_file=str(write_ca(ca, tmp_path / "ca.pem")) if client_ca else "")


def test_tls_binds_terminate_tls_with_alpn_and_verify_clients_with_a_ca(tmp_path):
    tls = config.Tls(tmp_path / "haproxy.pem", tmp_path / "client-ca.pem")
    plan = config.Plan(grpc_fd=3, rest_fd=4, fallback_grpc="127.0.0.1:1", fallback_rest="127.0.0.1:2",
                       nodes=[], state_dir=tmp_path, runtime_socket=tmp_path / "runtime.sock",
                       rules=DATA_PLANE, tls=tls)
    binds = [line.strip() for line in config.render(plan).splitlines() if "bind fd@" in line]
    verify = f"ca-file {tmp_path}/client-ca.pem verify required"
    assert binds == [f"bind fd@3 ssl crt {tmp_path}/haproxy.pem alpn h2 {verify} proto h2",
                     f"bind fd@4 ssl crt {tmp_path}/haproxy.pem alpn http/1.1 {verify}"]
    plain = config.render(dataclasses.replace(plan, tls=None))
    assert "bind fd@3 proto h2" in plain and " ssl " not in plain and "ssl-load" not in plain


async def test_the_tls_files_are_checked_by_haproxy_before_they_are_served(tmp_path):
    section = _tls_section(tmp_path, client_ca=True)
    tls = certs.files(tmp_path / "dataplane", section)
    (tmp_path / "dataplane").mkdir()
    certs.write(section, tls)
    assert [(p.name, p.stat().st_mode & 0o777) for p in (tls.pem, tls.client_ca)] == \
        [("haproxy.pem", 0o600), ("client-ca.pem", 0o600)]
    assert tls.pem.read_bytes() == Path(section.cert_file).read_bytes() + Path(section.key_file).read_bytes()
    with socket.create_server(("127.0.0.1", 0)) as g, socket.create_server(("127.0.0.1", 0)) as r:
        plan = config.Plan(grpc_fd=g.fileno(), rest_fd=r.fileno(), fallback_grpc="127.0.0.1:1",
                           fallback_rest="127.0.0.1:2", nodes=[], state_dir=tmp_path / "dataplane",
                           runtime_socket=tmp_path / "dataplane" / "runtime.sock", rules=DATA_PLANE, tls=tls)
        (tmp_path / "dataplane" / config.MAP).write_text("")
        supervisor = Supervisor("haproxy", tmp_path / "dataplane", plan)
        await supervisor.check(plan)
        # a key of another certificate: the Python check refuses it and writes nothing ...
        wrong = dataclasses.replace(section, key_file=str(_tls_section(tmp_path / "x", False).key_file))
        staged = certs.staged(tls)
        with pytest.raises(ssl.SSLError):
            certs.write(wrong, staged)
        assert not staged.pem.exists()
        # ... and HAProxy's own check refuses a PEM it cannot serve, naming it
        staged.pem.write_bytes(Path(section.cert_file).read_bytes() + Path(wrong.key_file).read_bytes())
        with pytest.raises(HaproxyConfigError, match="haproxy.pem.new"):
            await supervisor.check(dataclasses.replace(plan, tls=staged))


def _checked(plan: config.Plan, *fds: int) -> str:
    """``plan`` rendered, once ``haproxy -c`` accepted it with no warning."""
    text = config.render(plan)
    for path in (plan.state_dir / "haproxy.cfg", plan.map_path, plan.peer_map_path):
        path.write_text(text if path.name == "haproxy.cfg" else "")
    check = subprocess.run(["haproxy", "-c", "-f", str(plan.state_dir / "haproxy.cfg")],
                           capture_output=True, text=True, pass_fds=fds)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "Warning" not in check.stdout + check.stderr, check.stdout + check.stderr
    return text


def test_peers_are_reached_over_tls_as_the_python_path_reaches_them(tmp_path):
    """Sidecar mode with [tls]: a peer's server lines speak TLS as tfscache.tls.PeerTls does,
    with this sidecar's certificate as the client's, the peer verified against the peer CAs
    (tls.peer_ca_file, else tls.client_ca_file: written beside the PEM; neither: the system's)
    for tls.peer_server_name, else the host of its address. HAProxy cannot check an IP address
    in a certificate, so a peer at one, with no tls.peer_server_name, is the slow path."""
    section = _tls_section(tmp_path / "pki", client_ca=True)
    state = tmp_path / "dataplane"
    state.mkdir()
    tls = certs.files(state, section, peers=True)
    certs.write(section, tls)
    assert (tls.peer_ca.name, tls.peer_ca.stat().st_mode & 0o777) == ("peer-ca.pem", 0o600)
    assert tls.peer_ca.read_bytes() == Path(section.client_ca_file).read_bytes()
    assert certs.files(state, section).peer_ca is None  # not a sidecar: no peers

    def servers(text: str) -> dict[str, list[str]]:
        return {backend.split("\n", 1)[0]: [line.strip() for line in backend.splitlines()
                                             if line.strip().startswith("server ")]
                for backend in text.split("\nbackend ")[1:]}

    marks = " check inter 1s observe layer4 error-limit 1 on-error mark-down"
    with socket.create_server(("127.0.0.1", 0)) as g, socket.create_server(("127.0.0.1", 0)) as r:
        plan = config.Plan(grpc_fd=g.fileno(), rest_fd=r.fileno(), fallback_grpc="127.0.0.1:1",
                           fallback_rest="127.0.0.1:2", nodes=[], state_dir=state,
                           runtime_socket=state / "runtime.sock", rules=DATA_PLANE, tls=tls,
                           peers=[config.Node("p1", "localhost:5", "localhost:6"),
                                  config.Node("p2", "127.0.0.1:7", "127.0.0.1:8")],
                           mark=("x-tfscache-forwarded", "own"), via=("x-tfscache-via", "haproxy"))
        by_host = servers(_checked(plan, g.fileno(), r.fileno()))
        named = servers(_checked(dataclasses.replace(plan, tls=dataclasses.replace(
            tls, peer_ca=None, peer_name="sidecar.tfscache.test")), g.fileno(), r.fileno()))
    verify = f"ssl crt {tls.pem} ca-file {tls.peer_ca} verify required"
    assert by_host["grpc_p1"] == [
        f"server p1 localhost:5 proto h2 max-reuse 0 {verify} verifyhost localhost "
        f"sni str(localhost) check-sni localhost alpn h2{marks}",
        "server python 127.0.0.1:1 proto h2 backup"]
    assert by_host["rest_p1"] == [
        f"server p1 localhost:6 max-reuse 0 {verify} verifyhost localhost "
        f"sni str(localhost) check-sni localhost alpn http/1.1{marks}",
        "server python 127.0.0.1:2 backup"]
    # an IP address and no name: the Python front end, unmarked (the slow path)
    assert by_host["grpc_p2"] == ["server python 127.0.0.1:1 proto h2"]
    assert by_host["rest_p2"] == ["server python 127.0.0.1:2"]
    # tls.peer_server_name: checked, and sent as SNI, whatever the address; the system's CAs
    system = f"ssl crt {tls.pem} ca-file @system-ca verify required"
    name = "sidecar.tfscache.test"
    assert named["grpc_p2"][0] == (
        f"server p2 127.0.0.1:7 proto h2 max-reuse 0 {system} verifyhost {name} "
        f"sni str({name}) check-sni {name} alpn h2{marks}")
    assert named["rest_p1"][0] == (
        f"server p1 localhost:6 max-reuse 0 {system} verifyhost {name} "
        f"sni str({name}) check-sni {name} alpn http/1.1{marks}")
    # what HAProxy can check as Python does: a DNS name; never an IP address in any spelling
    as_host = config.Tls(tls.pem)
    assert [config.peer_name(as_host, address) for address in (
        "sidecar-b.ns.svc:8500", "localhost:5", "127.0.0.1:5", "[::1]:5", "10.1:5",
        "dns:///b:5")] == ["sidecar-b.ns.svc", "localhost", None, None, None, None]
    assert config.peer_name(dataclasses.replace(as_host, peer_name="b.test"), "[::1]:5") == "b.test"


def test_a_reload_checks_and_installs_the_peer_ca_with_the_certificate(tmp_path):
    """SIGHUP's files in sidecar mode: the peer CA is staged, checked and installed with the
    certificate, or, when one does not load, none of them is written."""
    ca = trustme.CA()
    leaf = write_leaf(ca, tmp_path / "server", "127.0.0.1")
    peer_ca = write_ca(ca, tmp_path / "peer-ca.pem")
    section = TlsSection(cert_file=str(leaf.cert), key_file=str(leaf.key),
                         peer_ca_file=str(peer_ca), peer_server_name="b.test")
    state = tmp_path / "dataplane"
    state.mkdir()
    tls = certs.files(state, section, peers=True)
    assert (tls.client_ca, tls.peer_name) == (None, "b.test")
    certs.write(section, tls)
    staged = certs.staged(tls)
    assert staged.peer_ca == state / "peer-ca.pem.new" and staged.peer_name == "b.test"
    rotated = write_ca(trustme.CA(), peer_ca)  # the same path, another CA
    certs.write(section, staged)
    assert staged.peer_ca.read_bytes() == rotated.read_bytes() != tls.peer_ca.read_bytes()
    certs.install(staged, tls)
    assert tls.peer_ca.read_bytes() == rotated.read_bytes() and not staged.peer_ca.exists()
    assert tls.peer_ca.stat().st_mode & 0o777 == 0o600
    rotated.write_text("not a certificate\n")
    with pytest.raises(ssl.SSLError):
        certs.write(section, staged)
    assert not staged.pem.exists() and not staged.peer_ca.exists()


async def test_hot_methods_are_routed_by_the_model_in_the_body_or_path(nodes, tmp_path):
    node_a, node_b = nodes
    async with Plane(tmp_path, node_a, node_b) as plane:
        assert await _call(plane.predict) == FALLBACK  # no route yet: the slow path
        assert await plane.routes.grant("m", "a")
        assert await _call(plane.predict) == ROUTED
        assert await _call(plane.rest) == ROUTED
        # 4 MB: routed from the part of the body HAProxy buffered
        assert await _call(plane.predict, 1_000_000) == ROUTED
        # a pinned version, a label or a compressed message take the slow path
        assert await _call(plane.predict, version=1) == FALLBACK
        with pytest.raises(grpc.RpcError) as label:
            await _call(plane.predict, label="stable")
        assert "label" in label.value.details()  # node B's answer: it has no labels
        # (gRPC sends a message uncompressed when gzip would not shrink it: 1,000 ones shrink)
        assert await _call(plane.predict, 1000, compression=grpc.Compression.Gzip) == FALLBACK
        assert await _call(plane.rest, "/v1/models/m/versions/1:predict") == FALLBACK
        use = await plane.routes.usage()
        assert use[("m", "a")].requests == 3 and use[("m", "a")].in_flight == 0
        await plane.routes.revoke("m", "a", deadline_s=10)
        assert await _call(plane.predict) == FALLBACK
        assert await _call(plane.rest) == FALLBACK


@contextlib.asynccontextmanager
async def routed_through_a_hold(nodes, tmp_path):
    """A Plane routing ``m`` to node A through a HoldProxy, and a pool to send requests from:
    (plane, proxy, pool)."""
    node_a, node_b = nodes
    with HoldProxy(("127.0.0.1", int(node_a.grpc_target.rsplit(":", 1)[1]))) as proxy:
        held_a = type("Held", (), {"grpc_target": f"127.0.0.1:{proxy.port}",
                                   "rest_port": node_a.rest_port})
        async with Plane(tmp_path, held_a, node_b) as plane:
            await plane.routes.grant("m", "a")
            with ThreadPoolExecutor(1) as pool:
                yield plane, proxy, pool


async def hold_one(plane, proxy, pool):
    """One Predict sent through the plane and held at the proxy (inside ``proxy.holding()``)."""
    request = pool.submit(plane.predict)
    await until(lambda: proxy.held_chunks > 0, 30, "the request held")
    return request


async def test_a_route_is_revoked_only_once_its_request_in_flight_is_answered(nodes, tmp_path):
    async with routed_through_a_hold(nodes, tmp_path) as (plane, proxy, pool):
        with proxy.holding():
            request = await hold_one(plane, proxy, pool)
            assert await plane.routes.in_flight("m@a") == 1
            revoke = asyncio.create_task(plane.routes.revoke("m", "a"))
            await until(lambda: "m" not in plane.routes.current, 30, "route dropped")
            assert await plane.runtime.show_map(plane.plan.map_path) == {}
            # the route is gone, new requests take the slow path ...
            assert await _call(plane.predict) == FALLBACK
            # ... and the revocation still waits for the one held on the data plane
            assert await plane.routes.in_flight("m@a") == 1
            assert not revoke.done()
        await asyncio.wait_for(revoke, 30)
        assert request.result(30) == ROUTED


async def test_a_group_route_balances_and_a_revocation_waits_only_for_its_node(
        nodes, copy_c, tmp_path):
    """``m`` routed to the group a+c: with nothing in flight the first node takes each request;
    one held on A sends the next to C. Taking A out of the group leaves C routed at once and
    serving, and the revocation waits for the request held on A (MODEL@a), not for C's."""
    node_a, node_b = nodes
    with HoldProxy(("127.0.0.1", int(node_a.grpc_target.rsplit(":", 1)[1]))) as proxy:
        held_a = type("Held", (), {"grpc_target": f"127.0.0.1:{proxy.port}",
                                   "rest_port": node_a.rest_port})
        async with Plane(tmp_path, held_a, node_b, others=[("c", copy_c)]) as plane:
            assert await plane.routes.grant("m", "c+a")
            assert await _call(plane.predict) == COPY  # a tie goes to the first node
            assert await plane.routes.grant("m", "a+c")  # in place: no slow path between
            assert await _call(plane.predict) == ROUTED
            with ThreadPoolExecutor(1) as pool, proxy.holding():
                request = await hold_one(plane, proxy, pool)
                assert await plane.routes.in_flight("m@a") == 1
                assert await _call(plane.predict) == COPY  # fewer in flight on C
                assert await _call(plane.rest) == COPY
                revoke = asyncio.create_task(plane.routes.revoke("m", "a"))
                await until(lambda: plane.routes.current == {"m": "c"}, 30, "a out of the route")
                assert await plane.runtime.show_map(plane.plan.map_path) == {"m": "c"}
                assert plane.plan.map_path.read_text() == "m c\n"
                for _ in range(3):  # the other copy keeps serving ...
                    assert await _call(plane.predict) == COPY
                assert await plane.routes.in_flight("m@a") == 1  # ... while A's request is held
                assert not revoke.done()
            await asyncio.wait_for(revoke, 30)
            assert request.result(30) == ROUTED
            use = await plane.routes.usage()
            assert (use[("m", "a")].requests, use[("m", "c")].requests) == (2, 6)
            assert all(u.in_flight == 0 for u in use.values())
            await plane.routes.revoke("m", "c", deadline_s=10)  # the last node: the route goes
            assert plane.routes.current == {}
            assert await plane.runtime.show_map(plane.plan.map_path) == {}
            assert await _call(plane.predict) == FALLBACK


async def test_a_revocation_waits_for_a_request_an_old_worker_carries_across_a_reload(
        nodes, tmp_path):
    """After a reload the new worker's table counts none of the requests the old worker still
    carries: the revocation waits until the old worker's own table (asked through the master
    CLI) counts none under its key either, and an answer from a worker other than the current
    one does not count. A revocation of another route does not wait for the old worker: it may
    live on as long as a client keeps a connection to it open."""
    node_b = nodes[1]
    async with routed_through_a_hold(nodes, tmp_path) as (plane, proxy, pool):
        with proxy.holding():
            request = await hold_one(plane, proxy, pool)
            old = plane.runtime.worker
            b = config.Node("b", node_b.grpc_target, f"127.0.0.1:{node_b.rest_port}")
            async with plane.routes.held():
                await plane.supervisor.reload(plane.plan_for([*plane.plan.nodes, b]))
            assert plane.runtime.worker not in (None, old)
            assert await plane.routes.in_flight("m@a") == 0  # the new worker's table
            assert not await plane.supervisor.old_workers_gone()
            assert await plane.supervisor.old_in_flight("m@a") == 1  # the old worker's
            # another route, granted and taken away while the old worker carries m's request
            assert await plane.routes.grant("other", "a")
            await asyncio.wait_for(plane.routes.revoke("other", "a"), 30)
            assert not await plane.supervisor.old_workers_gone()
            asked, table = [], plane.runtime.table

            async def counted_table(name):
                asked.append(name)
                return await table(name)

            plane.runtime.table = counted_table
            show_old_map = f"@!{old} show map {plane.plan.map_path};quit"
            assert " m a\n" in await plane.supervisor.master._ask(show_old_map)
            revoke = asyncio.create_task(plane.routes.revoke("m", "a"))
            await until(lambda: len(asked) >= 3, 30, "the revocation polling")
            assert "m" not in plane.routes.current and not revoke.done()
            # the old worker's own map has no route for m left either: what still reaches it
            # takes the slow path
            old_map = await plane.supervisor.master._ask(show_old_map)
            assert " m " not in old_map, old_map
        await asyncio.wait_for(revoke, 30)
        assert request.result(30) == ROUTED
        assert await plane.supervisor.old_in_flight("m@a") == 0
        await until(plane.supervisor.old_workers_gone, 30, "the old worker gone")
        current = plane.runtime.worker
        plane.runtime.worker = current + 1_000_000  # as if an old worker had answered
        with pytest.raises(RuntimeApiError, match="not worker"):
            await plane.routes.grant("m", "a")
        assert plane.routes.current == {}
        plane.runtime.worker = current
        assert await plane.routes.grant("m", "a")


async def test_a_missed_model_is_cleared_from_its_table_once_no_request_tracks_it(nodes, tmp_path):
    """Sidecar mode: a request with no route is counted in the table ``missed`` under its model;
    ``clear_keys`` drops such entries, a few hundred to a connection, leaves one that a request
    in flight still tracks (HAProxy refuses to drop it) for a later read, and refuses a key that
    is not one plain word."""
    node_a, node_b = nodes
    with HoldProxy(("127.0.0.1", int(node_b.grpc_target.rsplit(":", 1)[1]))) as proxy:
        held_b = type("Held", (), {"grpc_target": f"127.0.0.1:{proxy.port}",
                                   "rest_port": node_b.rest_port})
        async with Plane(tmp_path, node_a, held_b, mark=("x-tfscache-forwarded", "own")) as plane:
            assert await _call(plane.predict) == FALLBACK  # no route: the slow path, counted
            missed = await plane.runtime.table(config.MISSED)
            assert {k: u.requests for k, u in missed.items()} == {"m": 1}
            many = [f"model-{i:04d}.{'x' * 40}" for i in range(400)]  # several connections
            await plane.runtime.clear_keys(config.MISSED, ["m", *many])
            assert await plane.runtime.table(config.MISSED) == {}

            with ThreadPoolExecutor(1) as pool, proxy.holding():
                request = await hold_one(plane, proxy, pool)  # tracks m in missed, held
                assert (await plane.runtime.table(config.MISSED))["m"].requests == 1
                await plane.runtime.clear_keys(config.MISSED, ["m"])  # in use: it stays
                assert list(await plane.runtime.table(config.MISSED)) == ["m"]
            assert request.result(30) == FALLBACK
            await plane.runtime.clear_keys(config.MISSED, ["m"])
            assert await plane.runtime.table(config.MISSED) == {}
            for key in ("a b", "m;show info", ""):
                with pytest.raises(ValueError, match="not a plain stick-table key"):
                    await plane.runtime.clear_keys(config.MISSED, [key])


async def test_the_routes_in_force_are_the_ones_haproxy_confirmed(nodes, tmp_path):
    """``current`` lists a route once HAProxy took it and until HAProxy dropped it: a caller that
    sees a model routed can count on HAProxy routing its next request. A command HAProxy did not
    answer leaves ``current`` and the map file as HAProxy has them, and a revocation asks again
    until it is answered."""
    node_a, node_b = nodes
    async with Plane(tmp_path, node_a, node_b) as plane:
        routes, real_set_map, answer = plane.routes, plane.runtime.set_map, asyncio.Event()

        async def held_set_map(*args):
            await answer.wait()
            return await real_set_map(*args)

        plane.runtime.set_map = held_set_map
        grant = asyncio.create_task(routes.grant("m", "a"))
        await until(lambda: plane.plan.map_path.read_text() == "m a\n", 30, "the map file written ahead")
        assert "m" not in routes.current and not grant.done()  # HAProxy has not answered yet
        assert await _call(plane.predict) == FALLBACK
        answer.set()
        assert await asyncio.wait_for(grant, 30)
        assert routes.current == {"m": "a"}
        assert await _call(plane.predict) == ROUTED

        socket_path = plane.runtime.socket_path
        plane.runtime.socket_path = tmp_path / "no-haproxy.sock"  # HAProxy does not answer
        with pytest.raises(RuntimeApiError):
            await routes.withdraw("m")
        assert routes.current == {"m": "a"} and plane.plan.map_path.read_text() == "m a\n"
        with pytest.raises(RuntimeApiError):
            await routes.grant("n", "a")
        assert routes.current == {"m": "a"} and plane.plan.map_path.read_text() == "m a\n"
        revoke = asyncio.create_task(routes.revoke("m", "a"))
        await until(lambda: plane.plan.map_path.read_text() == "", 30, "the route out of the file")
        assert routes.current == {"m": "a"} and not revoke.done()  # still routed: asks again
        assert await _call(plane.predict) == ROUTED
        plane.runtime.socket_path = socket_path
        await asyncio.wait_for(revoke, 30)
        assert routes.current == {}
        assert await _call(plane.predict) == FALLBACK
        # the data plane stopping ends a revocation that waits for a HAProxy gone for good
        assert await routes.grant("m", "a")
        plane.runtime.socket_path = tmp_path / "no-haproxy.sock"
        revoke = asyncio.create_task(routes.revoke("m", "a"))
        await until(lambda: plane.plan.map_path.read_text() == "", 30, "the route out of the file")
        assert not revoke.done()
        routes.close()
        await asyncio.wait_for(revoke, 30)
        assert routes.current == {} and not await routes.grant("m", "a")


async def test_a_deep_state_directory_keeps_the_runtime_socket_apart(nodes, tmp_path):
    # STATE/dataplane/runtime.sock would not fit a UNIX socket's address
    deep = tmp_path / ("d" * 120)
    node_a, node_b = nodes
    async with Plane(deep, node_a, node_b) as plane:
        where = plane.plan.runtime_socket
        assert not where.is_relative_to(deep) and len(os.fsencode(where)) <= 90
        assert where.parent.stat().st_mode & 0o777 == 0o700
        assert config.runtime_socket_for(deep / "dataplane") == where  # the same one each time
        await plane.routes.grant("m", "a")
        assert await _call(plane.predict) == ROUTED
    where.parent.mkdir(mode=0o755)
    try:
        with pytest.raises(PermissionError, match="mode 0700"):
            config.private_dir(where.parent)
    finally:
        shutil.rmtree(where.parent)


async def test_a_killed_haproxy_is_restarted_on_the_same_ports_with_its_routes(nodes, tmp_path):
    node_a, node_b = nodes
    async with Plane(tmp_path, node_a, node_b) as plane:
        await plane.routes.grant("m", "a")
        assert await _call(plane.predict) == ROUTED
        killed = plane.runtime.worker
        os.killpg(plane.supervisor.process.pid, signal.SIGKILL)
        await until(lambda: plane.supervisor.restarts == 1
                    and plane.runtime.worker not in (None, killed), 30, "haproxy restarted")
        # the port never closed (tfscache holds it) and the map file held the route; a client's
        # connection to the killed HAProxy died with it, so the gRPC client connects again
        plane.channel.close()
        plane.channel = grpc.insecure_channel(f"127.0.0.1:{plane.grpc_socket.getsockname()[1]}")
        plane.stub = prediction_service_pb2_grpc.PredictionServiceStub(plane.channel)
        assert await _call(plane.predict) == ROUTED
        assert await _call(plane.rest) == ROUTED


async def test_a_reload_adds_a_node_while_requests_keep_being_answered(nodes, tmp_path):
    node_a, node_b = nodes
    async with Plane(tmp_path, node_a, node_b) as plane:
        await plane.routes.grant("m", "a")
        answers, failures, stop = [], [], threading.Event()

        def traffic():
            while not stop.is_set():
                try:
                    answers.append(plane.predict())
                except grpc.RpcError as e:
                    failures.append(e)

        thread = threading.Thread(target=traffic)
        thread.start()
        try:
            await until(lambda: len(answers) >= 5, 30, "traffic through the data plane")
            b = config.Node("b", node_b.grpc_target, f"127.0.0.1:{node_b.rest_port}")
            await plane.supervisor.reload(plane.plan_for([*plane.plan.nodes, b]))
            await until(lambda: plane.plan.runtime_socket.exists(), 30, "reloaded")
            await until(_backend_known(plane, "grpc_b"), 30, "the new node's backend")
            await plane.routes.grant("m", "b")
            seen = len(answers)
            await until(lambda: len(answers) > seen + 5, 30, "traffic after the reload")
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 30)
        assert failures == []
        assert answers[-1] == 3.0  # node B (x + 2) now holds the route
        assert plane.supervisor.restarts == 0


async def test_a_reload_right_after_the_start_is_not_lost(nodes, tmp_path):
    """The master re-executes itself once its first worker serves, and ignores SIGUSR2 until its
    wait loop runs: a reload sent as soon as the worker answers was lost (every time here, and
    once in a fresh-clone run of the test above). Reloads now wait for the master's CLI."""
    node_a, node_b = nodes
    async with Plane(tmp_path, node_a, node_b) as plane:
        first = plane.runtime.worker
        for _ in range(2):  # and a reload right after a reload
            await plane.supervisor.reload(plane.plan)
            assert plane.runtime.worker != first
            first = plane.runtime.worker
        assert plane.supervisor.restarts == 0
        assert (plane.state / "haproxy.log").read_text().count("Reloading HAProxy") == 2


def _backend_known(plane, name):
    async def known():
        try:
            return name in await plane.runtime.command("show backend")
        except Exception:
            return False
    return known


async def test_a_node_that_refuses_connections_sends_its_requests_to_the_fallback(nodes, tmp_path):
    """The route still names a node whose port refuses (it died): HAProxy marks it down on the
    first refusal and retries the request on the backend's backup, the Python front end."""
    _, node_b = nodes
    with socket.create_server(("127.0.0.1", 0)) as closed:
        dead_port = closed.getsockname()[1]
    dead = type("Dead", (), {"grpc_target": f"127.0.0.1:{dead_port}", "rest_port": dead_port})
    async with Plane(tmp_path, dead, node_b) as plane:
        await plane.routes.grant("m", "a")
        assert await _call(plane.predict) == FALLBACK
        assert await _call(plane.rest) == FALLBACK
        assert (await plane.routes.usage())[("m", "a")].requests == 2  # both were routed
