"""``tfscache node --ssl_config_file``: TF Serving's SSLConfig (server_key, server_cert,
custom_ca, client_verify, each PEM text) for gRPC, on the TCP port and the UNIX socket
alike, as ms/server.cc's BuildServerCredentials. Certificates come from a CA the test
makes (trustme). REST stays plain HTTP, as in TF Serving.
"""

from __future__ import annotations

import re
import subprocess

import grpc
import pytest
import requests
import trustme
from support.node import node_command, start_node
from support.requests import predict_request, status_request
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from tfscache.errors import InvalidArgument
from tfscache.modelserver.grpc_api import bind_ports
from tfscache.modelserver.server_configs import SSLConfig, server_credentials


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_cert(ca):
    return ca.issue_cert("localhost", "127.0.0.1")


@pytest.fixture(scope="module")
def client_cert(ca):
    return ca.issue_cert("client.example")


def pem(blob) -> str:
    return blob.bytes().decode()


def chain(cert) -> str:
    return "".join(pem(part) for part in cert.cert_chain_pems)


def text_string(value: str) -> str:
    """A text-format string literal, as a user writes a PEM into the file."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def ssl_config_text(ca, server_cert, *, client_verify: bool, custom_ca: bool = True) -> str:
    lines = [f"server_key: {text_string(pem(server_cert.private_key_pem))}",
             f"server_cert: {text_string(chain(server_cert))}"]
    if custom_ca:
        lines.append(f"custom_ca: {text_string(pem(ca.cert_pem))}")
    lines.append(f"client_verify: {'true' if client_verify else 'false'}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory, test_models, ca, server_cert):
    root = tmp_path_factory.mktemp("tls")
    (root / "ssl.config").write_text(ssl_config_text(ca, server_cert, client_verify=True))
    with start_node(root, model_name="half_plus_two", model_base_path=str(test_models / "half_plus_two"),
                    flags=[f"--ssl_config_file={root / 'ssl.config'}",
                           f"--grpc_socket_path={root / 'grpc.sock'}"]) as node:
        node.socket_path = root / "grpc.sock"
        yield node


def credentials(ca, client_cert=None) -> grpc.ChannelCredentials:
    if client_cert is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    return grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes(),
                                        private_key=client_cert.private_key_pem.bytes(),
                                        certificate_chain=chain(client_cert).encode())


def model_status(channel) -> list:
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    return list(stub.GetModelStatus(status_request("half_plus_two"), timeout=10).model_version_status)


def test_mutual_tls_over_tcp(node, ca, client_cert):
    with grpc.secure_channel(node.grpc_target, credentials(ca, client_cert)) as channel:
        assert [s.version for s in model_status(channel)] == [124]


def test_mutual_tls_over_the_unix_socket(node, ca, client_cert):
    # a unix: target's authority is its path: name the host the certificate is for
    with grpc.secure_channel(f"unix:{node.socket_path}", credentials(ca, client_cert),
                             options=[("grpc.ssl_target_name_override", "localhost")]) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            predict_request("half_plus_two", 4.0), timeout=30)
    assert list(response.outputs["y"].float_val) == [4.0]


@pytest.mark.parametrize("kind", ["no client certificate", "plaintext", "other CA"])
def test_refused_without_a_client_certificate_the_ca_signed(node, ca, kind):
    if kind == "no client certificate":
        channel = grpc.secure_channel(node.grpc_target, credentials(ca))
    elif kind == "plaintext":
        channel = grpc.insecure_channel(node.grpc_target)
    else:
        other = trustme.CA()
        channel = grpc.secure_channel(node.grpc_target, credentials(ca, other.issue_cert("client.example")))
    with channel, pytest.raises(grpc.RpcError) as info:
        model_status(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_rest_stays_plain_http(node):
    response = requests.get(f"{node.rest_url}/v1/models/half_plus_two", timeout=10)
    assert response.status_code == 200
    assert response.json()["model_version_status"][0]["version"] == "124"


async def test_one_way_tls_without_client_verify(ca, server_cert):
    """client_verify false: any client that trusts the server's CA gets in (no client cert)."""
    config = SSLConfig(server_key=pem(server_cert.private_key_pem), server_cert=chain(server_cert))
    server = grpc.aio.server()
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {"Echo": echo}),))
    port = bind_ports(server, "127.0.0.1:0", "", server_credentials(config))
    await server.start()
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials(ca)) as channel:
            assert await channel.unary_unary("/t.Echo/Echo")(b"hi", timeout=10) == b"hi"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary("/t.Echo/Echo")(b"hi", timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


def test_a_custom_ca_that_is_not_pem_fails_before_serving(server_cert):
    config = SSLConfig(server_key=pem(server_cert.private_key_pem), server_cert=chain(server_cert),
                       custom_ca="garbage", client_verify=True)
    with pytest.raises(InvalidArgument, match=r"^Failed to BuildAndStart gRPC server: "):
        server_credentials(config)


def test_client_verify_needs_a_custom_ca(server_cert):
    config = SSLConfig(server_key=pem(server_cert.private_key_pem), server_cert=chain(server_cert),
                       client_verify=True)
    with pytest.raises(InvalidArgument, match=r"^SSLConfig\.client_verify needs SSLConfig\.custom_ca"):
        server_credentials(config)


@pytest.mark.parametrize("content, expected", [
    ("server_key: unquoted",
     r"^Error parsing text-format tensorflow\.serving\.SSLConfig: 1:\d+ : .+\n"
     r"Failed to start server\. Error: INVALID_ARGUMENT: Invalid protobuf file: '.*ssl\.config'$"),
    ("client_verify: true",
     r"^Failed to start server\. Error: INVALID_ARGUMENT: SSLConfig\.client_verify needs "
     r"SSLConfig\.custom_ca: the CA that signs the client certificates$"),
    ('custom_ca: "x"',
     r"^Failed to start server\. Error: INVALID_ARGUMENT: SSLConfig needs both server_key and "
     r"server_cert \(PEM text\)$"),
    ('server_key: "not PEM" server_cert: "not PEM either"',
     r"^Failed to start server\. Error: INVALID_ARGUMENT: Failed to BuildAndStart gRPC server: gRPC "
     r"does not accept the SSLConfig's server_key, server_cert or custom_ca"),
])
def test_node_with_a_bad_ssl_config_exits_1(tmp_path, content, expected):
    (tmp_path / "ssl.config").write_text(content)
    result = subprocess.run(
        node_command(["--port=0", "--model_name=m", f"--model_base_path={tmp_path}",
                      f"--ssl_config_file={tmp_path / 'ssl.config'}"]),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert re.search(expected, result.stderr, re.MULTILINE), result.stderr
