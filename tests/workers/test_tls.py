"""TLS and the request id through `tfscache serve --workers 2`: each worker serves the [tls]
certificate on the public ports (official clients trusting the test CA), SIGHUP reaches the
workers, and a request's x-request-id goes back to its caller on the warm and the cold path."""

from __future__ import annotations

import signal

import grpc
import pytest
import requests
import trustme
from support.serving import start_serve
from support.certs import write_ca, write_leaf
from support.requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from workers.conftest import worker_pids


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    return {"ca_file": write_ca(ca, directory / "ca.pem"),
            "server": write_leaf(ca, directory / "server", "127.0.0.1", "localhost")}


@pytest.fixture(scope="module")
def serve(workers_repo, pki, tmp_path_factory):
    server = pki["server"]
    with start_serve(tmp_path_factory.mktemp("tls"), workers_repo, "--workers", "2", "--local-nodes", "1",
                     "--tls-cert", str(server.cert), "--tls-key", str(server.key)) as serve:
        yield serve


def secure_stub(serve, pki):
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca_file"].read_bytes())
    channel = grpc.secure_channel(serve.grpc_target, creds)
    return channel, prediction_service_pb2_grpc.PredictionServiceStub(channel)


def test_grpc_over_tls_keeps_the_request_id_cold_and_warm(serve, pki):
    channel, stub = secure_stub(serve, pki)
    with channel:
        for x in range(40):  # the first cold (through the control process), then warm under a delegation
            reply, call = stub.Predict.with_call(predict_request("addk_3", float(x)), timeout=60,
                                                 metadata=(("x-request-id", f"req-{x}"),))
            assert list(reply.outputs["y"].float_val) == [x + 3.0]
            assert ("x-request-id", f"req-{x}") in call.trailing_metadata()
        reply, call = stub.Predict.with_call(predict_request("addk_3", 1.0), timeout=60)
        made = dict(call.trailing_metadata())["x-request-id"]  # none sent: one is made and sent back
        assert len(made) == 12
    assert "delegated model addk_3" in serve.log_text()


def test_rest_over_tls_keeps_the_request_id(serve, pki):
    for x in range(10):
        reply = requests.post(f"https://127.0.0.1:{serve.rest_port}/v1/models/addk_4:predict",
                              json={"instances": [x]}, headers={"X-Request-Id": f"rest-{x}"},
                              verify=str(pki["ca_file"]), timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["predictions"] == [x + 4.0]
        assert reply.headers["X-Request-Id"] == f"rest-{x}"


def test_plain_text_is_refused(serve):
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(predict_request("addk_3", 1.0), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_sighup_reaches_every_worker_and_they_keep_serving(serve, pki):
    workers = worker_pids(serve.pid)
    serve.process.send_signal(signal.SIGHUP)
    serve.wait_for_log(r"TLS certificate reloaded", timeout=30, count=len(workers) + 1)  # each worker, and the control process
    assert worker_pids(serve.pid) == workers
    channel, stub = secure_stub(serve, pki)
    with channel:
        assert list(stub.Predict(predict_request("addk_3", 2.0), timeout=60).outputs["y"].float_val) == [5.0]
