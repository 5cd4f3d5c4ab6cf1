"""Start ``tfscache serve`` with its admin server and health, as real processes, and talk to them.

``start_admin_serve`` runs ``tfscache serve --admin-port 0`` (the admin token, if any, in
``TFSCACHE_SERVER_ADMIN_TOKEN``) and reads the admin port back from the ports file.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import ServeProcess, start_serve
from support.requests import predict_request


class AdminServe(ServeProcess):
    """A ServeProcess that also reports its admin port."""

    def __init__(self, process, directory, ports) -> None:
        super().__init__(process, directory, ports)
        self.admin_port: int = ports["admin"]

    @property
    def admin_target(self) -> str:
        return f"127.0.0.1:{self.admin_port}"


def start_admin_serve(tmp_path: Path, repository: Path, *args: str, token: str = "",
                      timeout: float = 180.0) -> AdminServe:
    """``tfscache serve`` with its admin API on a free port (and ``token``, if given)."""
    return start_serve(tmp_path, repository, "--admin-port", "0", *args, timeout=timeout,
                       env={"TFSCACHE_SERVER_ADMIN_TOKEN": token}, cls=AdminServe)


def health_check(target: str, service: str = "", timeout: float = 10.0) -> int:
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


def predict(channel: grpc.Channel, name: str, x: float = 1.0, timeout: float = 60.0) -> list[float]:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    return list(stub.Predict(predict_request(name, x), timeout=timeout).outputs["y"].float_val)
