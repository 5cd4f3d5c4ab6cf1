"""TF Serving traffic for integration tests: 16 client threads, gRPC (official stubs) and REST.

    with Traffic(serve.grpc_target, f"http://127.0.0.1:{serve.rest_port}", ["addk_1", "addk_2"]) as traffic:
        wait_until(lambda: traffic.ok() >= 100, 120, "warm traffic")
    traffic.check()   # none failed, every y == x + k
"""

from __future__ import annotations

import grpc
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.requests import predict_request
from support.traffic import ClientLoop


class Traffic(ClientLoop):
    """Predict (gRPC, official stubs) from most client threads, REST predicts from a quarter of them."""

    errors = (grpc.RpcError, requests.RequestException)

    def __init__(self, grpc_target: str, rest_url: str, models: list[str], clients: int = 16,
                 timeout: float = 30.0) -> None:
        super().__init__(models, clients, timeout)
        self.grpc_target, self.rest_url = grpc_target, rest_url

    def client(self, worker: int) -> None:
        if worker % 4 == 3:  # a quarter of the clients use REST
            self.loop(worker, self.rest_predict)
            return
        with grpc.insecure_channel(self.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            self.loop(worker, lambda name, x: list(
                stub.Predict(predict_request(name, x), timeout=self.timeout).outputs["y"].float_val))

    def rest_predict(self, name: str, x: float) -> object:
        reply = requests.post(f"{self.rest_url}/v1/models/{name}:predict", json={"instances": [x]},
                              timeout=self.timeout)
        return reply.json()["predictions"] if reply.status_code == 200 else \
            RuntimeError(f"{reply.status_code} {reply.text}")
