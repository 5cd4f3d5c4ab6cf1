"""TLS on `tfscache serve`'s front ends and between sidecars, with certificates made by trustme.

Official clients only: TF Serving's stubs over ``grpc.secure_channel`` and plain HTTPS
(requests, aiohttp) trusting the test CA. The serve processes are sidecars in front of the
module's two real nodes (no TensorFlow in them: they start in about a second), one at a time,
so that no two caches manage the same node at once.

The guarantees run on both data planes (``data_plane``): the Python front ends terminate TLS
themselves, or HAProxy does (docs/data-plane.md), and then a warm request is shown routed by
HAProxy (its stick table counts it).
"""

from __future__ import annotations

import logging
import signal
import socket
import ssl
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import grpc
import psutil
import pytest
import requests
import trustme
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import serve_command, start_serve
from support.certs import Leaf, write_ca, write_leaf
from support.dataplane import (dataplane_dir, old_workers_listen, routed_by_key, runtime_command,
                               server_stats, served_with_peer, serving_peer)
from support.waiting import until, wait_until
from support.node import REPO, version_status_at
from support.requests import predict_request
from tfscache import settings as settings_mod
from tfscache.discovery import Peer
from tfscache.cluster.ring import Ring
from tfscache.app import ServeApp
from tfscache.dataplane import binary

SIDECAR_NAME = "sidecar.tfscache.test"  # the only name on the sidecars' certificate in the two-sidecar test


@pytest.fixture(params=["python", pytest.param("haproxy", marks=pytest.mark.skipif(
    not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)"))])
def data_plane(request) -> str:
    """Who terminates TLS on the public ports: the Python front ends, or HAProxy."""
    return request.param


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, its file, a server certificate for 127.0.0.1 and a client certificate."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    return {"ca": ca, "ca_file": write_ca(ca, directory / "ca.pem"), "dir": directory,
            "server": write_leaf(ca, directory / "server", "127.0.0.1", "localhost"),
            "client": write_leaf(ca, directory / "client", "client.tfscache.test")}


def tls_flags(server: Leaf, client_ca: Path | None = None) -> list[str]:
    flags = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    return flags + (["--tls-client-ca", str(client_ca)] if client_ca else [])


def sidecar_of(node) -> list[str]:
    return ["--node-address", f"127.0.0.1:{node.grpc_port},{node.rest_port}"]


def credentials(ca_file: Path, client: Leaf | None = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes())
    return grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes(),
                                        private_key=client.key.read_bytes(), certificate_chain=client.cert.read_bytes())


def predict(channel: grpc.Channel, name: str, x: float) -> list[float]:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    return list(stub.Predict(predict_request(name, x), timeout=60).outputs["y"].float_val)


def grpc_code(target: str, creds: grpc.ChannelCredentials | None, name: str) -> grpc.StatusCode:
    """The code of a Predict on a new channel (OK, or how it failed)."""
    with (grpc.insecure_channel(target) if creds is None else grpc.secure_channel(target, creds)) as channel:
        try:
            predict(channel, name, 1.0)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def https_predict(port: int, name: str, x: float, **tls) -> requests.Response:
    return requests.post(f"https://127.0.0.1:{port}/v1/models/{name}:predict", json={"instances": [x]},
                         timeout=60, **tls)


def same(value, wanted) -> None:
    assert value == wanted


def routed(serve, name: str) -> int:
    """Requests for ``name`` HAProxy routed straight to a node (its stick table)."""
    return sum(count for key, count in routed_by_key(serve).items() if key.split("@")[0] == name)


def warm_and_routed(serve, data_plane: str, name: str, call) -> None:
    """``call()`` (one request for ``name``, asserting its answer) serves; with HAProxy, once the
    model is warm, a further call is routed by HAProxy straight to the node."""
    call()
    if data_plane == "haproxy":
        wait_until(lambda: routed(serve, name) > 0 or call(), 30, f"{name} routed by HAProxy")
        before = routed(serve, name)
        call()
        assert routed(serve, name) == before + 1


def test_mutual_tls_serves_clients_with_a_certificate_and_refuses_others(pki, nodes, frontend_repo, tmp_path,
                                                                         data_plane):
    server, client, ca_file = pki["server"], pki["client"], pki["ca_file"]
    with start_serve(tmp_path, frontend_repo, *sidecar_of(nodes["a"]), *tls_flags(server, ca_file),
                     "--data-plane", data_plane) as serve:
        with grpc.secure_channel(serve.grpc_target, credentials(ca_file, client)) as channel:
            warm_and_routed(serve, data_plane, "addk_2", lambda: same(predict(channel, "addk_2", 1.0), [3.0]))

        def https() -> None:
            reply = https_predict(serve.rest_port, "addk_2", 5.0, verify=str(ca_file),
                                  cert=(str(client.cert), str(client.key)))
            assert (reply.status_code, reply.json()) == (200, {"predictions": [7.0]})

        warm_and_routed(serve, data_plane, "addk_2", https)
        # No client certificate, a certificate from another CA, or no TLS at all: refused.
        other = write_leaf(trustme.CA(), tmp_path / "stranger", "client.tfscache.test")
        assert grpc_code(serve.grpc_target, credentials(ca_file), "addk_2") == grpc.StatusCode.UNAVAILABLE
        assert grpc_code(serve.grpc_target, credentials(ca_file, other), "addk_2") == grpc.StatusCode.UNAVAILABLE
        assert grpc_code(serve.grpc_target, None, "addk_2") == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(requests.exceptions.ConnectionError):
            https_predict(serve.rest_port, "addk_2", 5.0, verify=str(ca_file))
        with pytest.raises(requests.exceptions.ConnectionError):
            https_predict(serve.rest_port, "addk_2", 5.0, verify=str(ca_file), cert=(str(other.cert), str(other.key)))
        with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP to the HTTPS port
            requests.post(f"http://127.0.0.1:{serve.rest_port}/v1/models/addk_2:predict", json={"instances": [1]},
                          timeout=60)
        # ... and the process keeps serving.
        assert grpc_code(serve.grpc_target, credentials(ca_file, client), "addk_2") == grpc.StatusCode.OK
        if data_plane == "haproxy":  # HAProxy's copies of the files: this user's alone
            for name in ("haproxy.pem", "client-ca.pem"):
                assert (dataplane_dir(serve) / name).stat().st_mode & 0o777 == 0o600
        assert serve.stop() == 0


def negotiated(port: int, ca: Path) -> str | None:
    """The protocol a client offering HTTP/2 and HTTP/1.1 gets by ALPN on ``port``."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            return tls.selected_alpn_protocol()


def served_ca(port: int, *cas: Path) -> Path | None:
    """Which of ``cas`` verifies the certificate a new connection to ``port`` is served."""
    for ca in cas:
        context = ssl.create_default_context(cafile=str(ca))
        context.set_alpn_protocols(["h2"])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                with context.wrap_socket(sock, server_hostname="127.0.0.1"):
                    return ca
        except ssl.SSLCertVerificationError:
            continue
    return None


def haproxy_workers(serve) -> list[psutil.Process]:
    """The serve's HAProxy workers: the children of its HAProxy master."""
    masters = [p for p in psutil.Process(serve.pid).children() if p.name() == "haproxy"]
    return [worker for master in masters for worker in master.children()]


class Knocker:
    """Opens TCP connections to ``port`` one after another until stopped; ``refused`` counts
    those the kernel refused (a closed listener)."""

    def __init__(self, port: int) -> None:
        self.port, self.opened, self.refused = port, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=10).close()
                self.opened += 1
            except ConnectionRefusedError:
                self.refused += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_sighup_gives_new_connections_the_new_certificate(pki, nodes, frontend_repo, tmp_path, data_plane):
    first_ca = pki["ca_file"]
    second = trustme.CA()
    second_ca = write_ca(second, tmp_path / "second-ca.pem")
    server = write_leaf(pki["ca"], tmp_path / "server", "127.0.0.1")  # our own files: this test replaces them
    # A client open across the rotation. The Python front end keeps its connection, and the
    # certificate it started with; HAProxy's old worker closes it once its requests are done, and
    # the client's next request connects anew and is served the new certificate, so that client
    # trusts both CAs there.
    trusted = first_ca.read_bytes() + (second_ca.read_bytes() if data_plane == "haproxy" else b"")
    gate, held = nodes["b"].gate, "addk_4"
    with start_serve(tmp_path, frontend_repo, *sidecar_of(nodes["b"]), *tls_flags(server),
                     "--data-plane", data_plane) as serve, ThreadPoolExecutor(1) as pool:
        opened = grpc.secure_channel(serve.grpc_target, grpc.ssl_channel_credentials(trusted))
        knocker = None
        try:
            warm_and_routed(serve, data_plane, "addk_3", lambda: same(predict(opened, "addk_3", 1.0), [4.0]))
            # gRPC is HTTP/2; REST HTTP/1.1 (the Python front end names no protocol, HAProxy http/1.1)
            assert negotiated(serve.grpc_port, first_ca) == "h2"
            assert negotiated(serve.rest_port, first_ca) in (None, "http/1.1")
            # a request in flight across the reload: its model's load is held at the node
            gate.clear()  # a .waiting file left by the other data plane's run
            gate.hold(held)
            in_flight = pool.submit(predict, opened, held, 1.0)
            wait_until(lambda: gate.waiting(held), 60, f"{held}'s load held at the node")
            knocker = Knocker(serve.grpc_port)
            write_leaf(second, tmp_path / "server", "127.0.0.1")  # the same paths, from another CA
            serve.process.send_signal(signal.SIGHUP)
            serve.wait_for_log("TLS certificate reloaded")
            assert served_ca(serve.grpc_port, first_ca, second_ca) == second_ca
            assert served_ca(serve.rest_port, first_ca, second_ca) == second_ca
            knocker.stop()
            assert (knocker.refused, knocker.opened > 0) == (0, True)  # the port never closed
            assert not in_flight.done()
            gate.release(held)
            assert in_flight.result(timeout=60) == [5.0]  # the request open across the reload
            assert grpc_code(serve.grpc_target, credentials(second_ca), "addk_3") == grpc.StatusCode.OK
            assert grpc_code(serve.grpc_target, credentials(first_ca), "addk_3") == grpc.StatusCode.UNAVAILABLE
            assert https_predict(serve.rest_port, "addk_3", 2.0, verify=str(second_ca)).json() == \
                {"predictions": [5.0]}
            with pytest.raises(requests.exceptions.SSLError):
                https_predict(serve.rest_port, "addk_3", 2.0, verify=str(first_ca))
            # The client open across the reload keeps working, warm requests routed as before.
            warm_and_routed(serve, data_plane, "addk_3", lambda: same(predict(opened, "addk_3", 3.0), [6.0]))
            if data_plane == "haproxy":  # the old worker finished its connections and left
                wait_until(lambda: len(haproxy_workers(serve)) == 1, 60, "one HAProxy worker left")
            # A reload that fails (a key of another certificate) keeps the certificate in use.
            write_leaf(trustme.CA(), tmp_path / "wrong", "127.0.0.1").key.replace(server.key)
            serve.process.send_signal(signal.SIGHUP)
            serve.wait_for_log("TLS reload failed, keeping the certificate in use")
            assert served_ca(serve.grpc_port, first_ca, second_ca) == second_ca
            assert grpc_code(serve.grpc_target, credentials(second_ca), "addk_3") == grpc.StatusCode.OK
            assert https_predict(serve.rest_port, "addk_3", 2.0, verify=str(second_ca)).status_code == 200
        finally:
            gate.release(held)
            if knocker is not None:
                knocker.stop()
            opened.close()
        assert serve.stop() == 0


def sidecar_settings(name: str, node, repo: Path, state_dir: Path, server: Leaf, ca_file: Path,
                     data_plane: str = "python", **more: str):
    """``more``: further [tls] settings (``peer_ca_file=...``)."""
    return settings_mod.load(env={}, overrides={"server.data_plane": data_plane,
        "model_repository": str(repo), "node.node_address": f"127.0.0.1:{node.grpc_port},{node.rest_port}",
        "ring.self_name": name, "server.bind_address": "127.0.0.1", "server.grpc_port": 0,
        "server.rest_port": 0, "node.state_dir": str(state_dir / name), "tls.cert_file": str(server.cert),
        "tls.key_file": str(server.key), "tls.client_ca_file": str(ca_file), "tls.peer_server_name": SIDECAR_NAME,
        **{f"tls.{key}": value for key, value in more.items()}})


def node_holds(node, name) -> bool:
    return any(s.state == 30 for s in version_status_at(node.grpc_target, name))


async def start_sidecars(apps: dict, data_plane: str) -> None:
    """Start each sidecar, tell each every sidecar's address (as discovery would), and, with
    HAProxy, wait until each HAProxy serves with its peer's backends (a reload starts HAProxy's
    tables afresh, so a request before it would be forgotten), alone (an old worker's tables are
    not read either)."""
    for app in apps.values():
        await app.start()
    peers = [Peer(key, f"127.0.0.1:{app.grpc_port}", f"127.0.0.1:{app.rest_port}") for key, app in apps.items()]
    for app in apps.values():
        await app.set_peers(peers)
    if data_plane == "haproxy":
        for key, app in apps.items():
            for peer in apps.keys() - {key}:
                await until(lambda app=app, peer=peer: served_with_peer(app, peer), 30,
                            f"{peer} in {key}'s HAProxy configuration")


def write_ca_bundle(path: Path, *cas: Path) -> None:
    """``path`` holds the certificates of ``cas``, replaced in one rename (as a Secret's update)."""
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_bytes(b"".join(ca.read_bytes() for ca in cas))
    scratch.replace(path)


def client_tls(ca_file: Path, client: Leaf) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    context.load_cert_chain(client.cert, client.key)
    return context


async def rest_predict(port: int, name: str, x: float, context: ssl.SSLContext) -> tuple[int, object]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"https://127.0.0.1:{port}/v1/models/{name}:predict", json={"instances": [x]},
                             ssl=context, server_hostname=SIDECAR_NAME) as reply:
            return reply.status, await reply.json()


async def test_two_sidecars_with_mutual_tls_forward_to_each_other(pki, nodes, frontend_repo, tmp_path,
                                                                 data_plane):
    # The sidecars' certificate names neither address, only SIDECAR_NAME (tls.peer_server_name):
    # the hop a -> b verifies b against it, and presents the same certificate as a client. With
    # HAProxy on the public ports, the hop reaches b's HAProxy, which takes b's certificate and
    # sends the marked request on to b's front end (nothing of the TLS session is passed on).
    # Then, once a's control plane routes the model to b, a's HAProxy itself makes that hop, as
    # the Python path does: b's HAProxy counts what it gets, and none fell back to a's own node.
    ca_file, client = pki["ca_file"], pki["client"]
    server = write_leaf(pki["ca"], tmp_path / "sidecar", SIDECAR_NAME)
    apps = {key: ServeApp(sidecar_settings(key, node, frontend_repo, tmp_path, server, ca_file, data_plane))
            for key, node in nodes.items()}
    a, b = apps["a"], apps["b"]
    name = "addk_5"
    try:
        await start_sidecars(apps, data_plane)
        assert Ring(["a", "b"]).owner(name) == "b"
        async with grpc.aio.secure_channel(f"127.0.0.1:{a.grpc_port}", credentials(ca_file, client),
                                           options=[("grpc.ssl_target_name_override", SIDECAR_NAME)]) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            response = await stub.Predict(predict_request(name, 1.0), timeout=60)
            assert list(response.outputs["y"].float_val) == [6.0]
            if data_plane == "haproxy":  # the first went a's slow way; the next goes HAProxy's
                await until(lambda: a.dataplane.peer_routes.current == {name: "b"}, 30,
                            f"a's HAProxy routing {name} to b")
                await until(lambda: name in b.dataplane.routes.current, 30, f"b's HAProxy routing {name}")
                at_b = routed_by_key(b).get(f"{name}@b", 0)
                response = await stub.Predict(predict_request(name, 3.0), timeout=60)
                assert list(response.outputs["y"].float_val) == [8.0]
                assert routed_by_key(a).get(f"{name}@b") == 1  # a's HAProxy sent it to b ...
                assert routed_by_key(b).get(f"{name}@b") == at_b + 1  # ... whose HAProxy took it
        assert node_holds(nodes["b"], name) and not node_holds(nodes["a"], name)
        # REST is forwarded over HTTPS too
        assert await rest_predict(a.rest_port, name, 2.0, client_tls(ca_file, client)) == \
            (200, {"predictions": [7.0]})
        if data_plane == "haproxy":
            assert routed_by_key(a).get(f"{name}@b") == 2
            stats = server_stats(a)
            for backend in ("grpc_b", "rest_b"):  # each request reached b, none failed on the way
                b_server = stats[(backend, "b")]
                assert [b_server[field] for field in ("stot", "econ", "wretr", "wredis")] == ["1", "0", "0", "0"]
                assert stats[(backend, "python")]["stot"] == "0"  # the backup got none
        assert not node_holds(nodes["a"], name)
    finally:
        for app in apps.values():
            await app.stop(grace=1)


async def test_a_peer_whose_certificate_the_peer_cas_did_not_sign_is_not_reached(pki, nodes, frontend_repo,
                                                                                tmp_path, data_plane):
    # a trusts the first CA alone for its peers (tls.peer_ca_file); b presents a certificate of a
    # second CA (either sidecar accepts either CA's client certificate). a's Python path cannot
    # reach b: its request fails once its deadline passes. With HAProxy, once a's control plane
    # routes the model to b all the same, a's HAProxy refuses b's certificate too: its health
    # checks mark b's servers down, and the backup, a's Python front end, gets the requests,
    # marked as forwarded (as for a peer that refuses connections), and serves them from a's own
    # node. A request that meets b's certificate while b's server is still up is sent again, to
    # the backup. None reaches b; none fails. Then a SIGHUP with b's CA added to a's peer CAs: a's
    # HAProxy, reloaded, checks b against them, and its next request reaches b.
    first, second = pki["ca"], trustme.CA()
    second_ca = write_ca(second, tmp_path / "second-ca.pem")
    both, peer_ca = tmp_path / "both-cas.pem", tmp_path / "peer-ca.pem"
    write_ca_bundle(both, pki["ca_file"], second_ca)
    write_ca_bundle(peer_ca, pki["ca_file"])  # a's peer CAs, rewritten below
    leaves = {"a": write_leaf(first, tmp_path / "a", SIDECAR_NAME),
              "b": write_leaf(second, tmp_path / "b", SIDECAR_NAME)}
    apps = {key: ServeApp(sidecar_settings(key, node, frontend_repo, tmp_path, leaves[key], both, data_plane,
                                           peer_ca_file=str(peer_ca)))
            for key, node in nodes.items()}
    a, b, client, name = apps["a"], apps["b"], pki["client"], "addk_1"
    context = client_tls(pki["ca_file"], client)
    try:
        await start_sidecars(apps, data_plane)
        assert Ring(["a", "b"]).owner(name) == "b"
        async with grpc.aio.secure_channel(f"127.0.0.1:{a.grpc_port}", credentials(pki["ca_file"], client),
                                           options=[("grpc.ssl_target_name_override", SIDECAR_NAME)]) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Predict(predict_request(name, 1.0), timeout=3)
            # the front end gives up on b when the request's deadline passes, as the client does
            assert failed.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
            if data_plane == "haproxy":
                await until(lambda: a.dataplane.peer_routes.current == {name: "b"}, 30,
                            f"a's HAProxy routing {name} to b")
                await until(lambda: all(server_stats(a)[(backend, "b")]["status"] == "DOWN"
                                        for backend in ("grpc_b", "rest_b")), 30, "b's servers marked down")
                response = await stub.Predict(predict_request(name, 2.0), timeout=60)
                assert list(response.outputs["y"].float_val) == [3.0]
                assert await rest_predict(a.rest_port, name, 4.0, context) == (200, {"predictions": [5.0]})
                # b's servers up again, and no check to mark them down: a request meets b's certificate
                for backend in ("grpc_b", "rest_b"):
                    runtime_command(a, f"disable health {backend}/b")
                    runtime_command(a, f"set server {backend}/b health up")
                response = await stub.Predict(predict_request(name, 5.0), timeout=60)
                assert list(response.outputs["y"].float_val) == [6.0]
                assert await rest_predict(a.rest_port, name, 6.0, context) == (200, {"predictions": [7.0]})
                assert routed_by_key(a).get(f"{name}@b") == 4  # each took a's route to b ...
                stats = server_stats(a)
                for backend in ("grpc_b", "rest_b"):  # ... the last one tried b, then the backup
                    assert (stats[(backend, "b")]["status"], stats[(backend, "b")]["stot"],
                            stats[(backend, "b")]["wredis"]) == ("DOWN", "1", "1")
                    assert stats[(backend, "python")]["stot"] == "2"
                assert node_holds(nodes["a"], name) and f"{name}@b" not in routed_by_key(b)
                assert not node_holds(nodes["b"], name)

                write_ca_bundle(peer_ca, pki["ca_file"], second_ca)
                await a.reload_tls()  # SIGHUP's work, in process
                assert a.dataplane.peer_routes.current == {name: "b"}  # kept across the reload
                # the old worker keeps this client's open connection; a new one, made once only
                # the new worker listens, reaches the new worker
                await until(lambda: not old_workers_listen(a), 30, "a's old worker listening no more")
                async with grpc.aio.secure_channel(
                        f"127.0.0.1:{a.grpc_port}", credentials(pki["ca_file"], client),
                        options=[("grpc.ssl_target_name_override", SIDECAR_NAME)]) as fresh:
                    response = await prediction_service_pb2_grpc.PredictionServiceStub(fresh).Predict(
                        predict_request(name, 7.0), timeout=60)
                assert list(response.outputs["y"].float_val) == [8.0]
                stats = server_stats(a)  # the new worker's: it sent the request to b, and b took it
                assert [stats[("grpc_b", "b")][field] for field in ("stot", "econ", "wredis")] == ["1", "0", "0"]
                assert stats[("grpc_b", "python")]["stot"] == "0"
                assert node_holds(nodes["b"], name)
        if data_plane == "python":
            assert not node_holds(nodes["b"], name)
    finally:
        for app in apps.values():
            await app.stop(grace=1)


@pytest.mark.skipif(not binary.available(), reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)")
async def test_a_peer_at_an_ip_address_with_no_peer_server_name_keeps_the_slow_path(pki, nodes, frontend_repo,
                                                                                   tmp_path, caplog):
    # The sidecars' certificate is for 127.0.0.1 (an IP address in its subjectAltName), and no
    # tls.peer_server_name is set: the Python path checks b's address against it, which HAProxy
    # cannot do. So a's HAProxy has no backend for b and routes nothing there; b's model takes the
    # slow path, and is answered.
    ca_file, client = pki["ca_file"], pki["client"]
    apps = {key: ServeApp(sidecar_settings(key, node, frontend_repo, tmp_path, pki["server"], ca_file, "haproxy",
                                           peer_server_name=""))
            for key, node in nodes.items()}
    a, name = apps["a"], "addk_4"
    caplog.set_level(logging.INFO, logger="tfscache.dataplane")
    try:
        await start_sidecars(apps, "python")  # no HAProxy waits for a peer's backend here
        assert Ring(["a", "b"]).owner(name) == "b"
        assert "b" in a.topology.peers()
        async with grpc.aio.secure_channel(f"127.0.0.1:{a.grpc_port}", credentials(ca_file, client)) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for x in (1.0, 2.0):
                response = await stub.Predict(predict_request(name, x), timeout=60)
                assert list(response.outputs["y"].float_val) == [x + 4]
                # asked for with no route: in a's table missed until a's control plane read it
                await until(lambda: f"key={name} " not in runtime_command(a, "show table missed"), 30,
                            f"{name} read from a's table missed")
                assert a.dataplane.peer_routes.current == {} and a.dataplane.supervisor.plan.peers == ()
        assert f"{name}@b" not in routed_by_key(a) and not node_holds(nodes["a"], name)
        assert not serving_peer(a, "b")
        assert "peer b at 127.0.0.1:" in caplog.text and "takes the slow path" in caplog.text
    finally:
        for app in apps.values():
            await app.stop(grace=1)


BAD = [
    (lambda p: {"cert_file": p["server"].cert}, "tls.key_file: '' (required with tls.cert_file)"),
    (lambda p: {"key_file": p["server"].key}, "tls.cert_file: '' (required with tls.key_file)"),
    (lambda p: {"client_ca_file": p["ca_file"]}, "tls.client_ca_file: '{ca_file}' (needs tls.cert_file and "
                                                 "tls.key_file)"),
    (lambda p: {"peer_server_name": "x"}, "tls.peer_server_name: 'x' (needs tls.cert_file and tls.key_file)"),
    (lambda p: {"cert_file": p["dir"] / "missing.pem", "key_file": p["server"].key},
     "tls.cert_file: '{dir}/missing.pem' (cannot read it: No such file or directory)"),
    (lambda p: {"cert_file": p["server"].cert, "key_file": p["client"].key},
     "tls.key_file: '{client_key}' (does not load as the private key of tls.cert_file: KEY_VALUES_MISMATCH)"),
    (lambda p: {"cert_file": p["server"].cert, "key_file": p["server"].cert},
     "tls.key_file: '{server_cert}' (does not load as the private key of tls.cert_file: not a PEM private key)"),
    (lambda p: {"cert_file": p["server"].key, "key_file": p["server"].key},
     "tls.cert_file: '{server_key}' (no PEM certificate in it: NO_CERTIFICATE_OR_CRL_FOUND)"),
    (lambda p: {"cert_file": p["server"].cert, "key_file": p["server"].key, "client_ca_file": p["server"].key},
     "tls.client_ca_file: '{server_key}' (no PEM certificate in it: NO_CERTIFICATE_OR_CRL_FOUND)"),
    (lambda p: {"cert_file": p["server"].cert, "key_file": p["server"].key, "peer_ca_file": p["dir"]},
     "tls.peer_ca_file: '{dir}' (cannot read it: Is a directory)"),
]


def expected(pki, message: str) -> str:
    return "bad value for setting " + message.format(dir=pki["dir"], ca_file=pki["ca_file"],
                                                     client_key=pki["client"].key, server_key=pki["server"].key,
                                                     server_cert=pki["server"].cert)


@pytest.mark.parametrize("fields, message", BAD)
def test_bad_tls_settings_name_the_field_and_value(pki, tmp_path, fields, message):
    overrides = {"model_repository": str(tmp_path), **{f"tls.{k}": str(v) for k, v in fields(pki).items()}}
    with pytest.raises(settings_mod.SettingsError) as raised:
        settings_mod.load(env={}, overrides=overrides)
    assert str(raised.value) == expected(pki, message)


@pytest.mark.parametrize("flags, message", [
    (lambda p: ["--tls-cert", str(p["server"].cert)], BAD[0][1]),
    (lambda p: ["--tls-cert", str(p["server"].cert), "--tls-key", str(p["client"].key)], BAD[5][1]),
])
def test_bad_tls_flags_exit_2(pki, tmp_path, flags, message):
    result = subprocess.run(serve_command(["--model-repository", str(tmp_path), *flags(pki)]), cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip()) == (2, f"tfscache serve: {expected(pki, message)}")
