"""The ``gate`` model's requests (support/models/tfserving.py ``build_gate``): a Predict that
blocks inside the node until a value is released there, to hold a request in flight without
timing anything; and a clock a test moves by hand.

    held = pool.submit(predict_gate, serve_target)   # blocks in the node
    release(node_target, 7.0)                        # -> the held request answers 7.0
"""

from __future__ import annotations

import grpc
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.requests import float_tensor, predict_request


def predict_gate(target: str) -> float:
    """One gate request: it blocks in the node until a value is released there."""
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        reply = stub.Predict(predict_request("gate", inputs={}), timeout=120)
        return reply.outputs["value"].float_val[0]


def release(target: str, value: float) -> float:
    """Let one held gate request go: at a node itself, or through a public port."""
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        reply = stub.Predict(predict_request("gate", signature="release",
                                             inputs={"value": float_tensor([value], shape=[])}),
                             timeout=60)
        return reply.outputs["value"].float_val[0]


class Clock:
    """A clock for code that takes one (``now = clock()``), moved by the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
