"""`tfscache serve --workers 2`: warm and cold TF Serving gRPC and REST through the workers."""

from __future__ import annotations

import grpc
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from frontend.serving import start_serve
from support.requests import predict_request
from workers.conftest import worker_pids


def test_two_workers_serve_cold_and_warm(tmp_path, workers_repo):
    with start_serve(tmp_path, workers_repo, "--workers", "2", "--local-nodes", "1") as serve:
        assert len(worker_pids(serve.pid)) == 2
        with grpc.insecure_channel(serve.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for x in range(20):
                reply = stub.Predict(predict_request("addk_1", float(x)), timeout=60)
                assert list(reply.outputs["y"].float_val) == [x + 1.0]
        for x in range(20):
            reply = requests.post(f"{serve.rest_url}/v1/models/addk_2:predict", json={"instances": [x]}, timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["predictions"] == [x + 2.0]
