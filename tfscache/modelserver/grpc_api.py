"""gRPC adapter: PredictionService and ModelService over a ServingCore.

Methods are registered as generic handlers on raw bytes, so a request that does not
parse gets INVALID_ARGUMENT from us (not grpc's INTERNAL deserialisation error) and
the server keeps serving. Every method goes through ``_Method.__call__``, the one
place where errors are mapped: ``TfscacheError`` -> its code and message (cut to
1024 characters like ``ms/grpc_status_util.cc``), anything else -> INTERNAL, logged.
It is also where Predict, Classify and Regress are counted in TF Serving's request_count
and request_latency (entrypoint "GRPC"; serving_metrics.py), as ms/prediction_service_impl.cc
does; a request that does not parse never reached TF Serving's method and is not counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf import message as pb_message
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    predict_pb2,
    regression_pb2,
)

from tfscache.errors import Internal, InvalidArgument, TfscacheError, code_name
from tfscache.modelserver import serving_metrics
from tfscache.modelserver.server_core import ServingCore

log = logging.getLogger("tfscache.modelserver.grpc_api")

MAX_MESSAGE_BYTES = 2**31 - 1  # INT32_MAX both ways (ms/server.cc)
MAX_ERROR_CHARS = 1024


def grpc_message(message: str) -> str:
    """TF Serving's ToGRPCStatus: messages over 1024 chars are cut and marked."""
    if len(message) > MAX_ERROR_CHARS:
        return message[:MAX_ERROR_CHARS] + "...TRUNCATED"
    return message


def _run_in_daemon_thread(fn: Callable[[], object]) -> asyncio.Future:
    """Run a call that may block forever (a reload waiting on a missing base path)
    on its own daemon thread, so it can never hold up process exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=target, name="tfscache-reload", daemon=True).start()
    return future


def _settle(future: asyncio.Future, result: object, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


@dataclass
class _Method:
    """One RPC: parse bytes, run the blocking implementation off the loop, map errors."""

    request_type: type[pb_message.Message]
    impl: Callable[[pb_message.Message, float | None], pb_message.Message]
    executor: concurrent.futures.Executor | None  # None: a daemon thread per call
    api: str = ""  # the API label of TF Serving's request metrics; "": not counted

    async def __call__(self, request_bytes: bytes, context: grpc.aio.ServicerContext) -> bytes:
        start = time.perf_counter()
        request = None
        try:
            request = self._parse(request_bytes)
            timeout_s = context.time_remaining()
            call = lambda: self.impl(request, timeout_s)  # noqa: E731
            if self.executor is None:
                response = await _run_in_daemon_thread(call)
            else:
                response = await asyncio.get_running_loop().run_in_executor(self.executor, call)
            self._record(request, "OK", start)
            return response.SerializeToString()
        except TfscacheError as exc:
            error = exc
        except Exception:
            log.exception("%s failed", self.request_type.DESCRIPTOR.name)
            error = Internal("Internal error in the model server; see its log")
        self._record(request, code_name(error.grpc_code), start)
        await context.abort(error.grpc_code, grpc_message(error.message))

    def _record(self, request: pb_message.Message | None, code: str, start: float) -> None:
        if self.api and request is not None:
            serving_metrics.record_request(request.model_spec.name, self.api, "GRPC", code, start)

    def _parse(self, request_bytes: bytes) -> pb_message.Message:
        try:
            return self.request_type.FromString(request_bytes)
        except pb_message.DecodeError as exc:
            raise InvalidArgument(
                f"Could not parse the request as {self.request_type.DESCRIPTOR.full_name}: {exc}"
            ) from exc


class ModelService:
    """tensorflow.serving.ModelService."""

    def __init__(self, core: ServingCore) -> None:
        self.core = core

    def get_model_status(self, request, timeout_s):
        return self.core.status(request)

    def handle_reload_config_request(self, request, timeout_s):
        if request.config.WhichOneof("config") != "model_config_list":
            raise InvalidArgument(
                "ServerModelConfig type not supported by HandleReloadConfigRequest. "
                "Only ModelConfigList is currently supported"
            )
        self.core.reload(request.config)
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = 0
        return response


def _prediction_methods(
    core: ServingCore, executor, max_tensor_bytes: int | None
) -> dict[str, _Method]:
    from tfscache.modelserver import inference

    def bind(fn):
        return lambda request, timeout_s: fn(core, request, timeout_s)

    def predict(request, timeout_s):
        return inference.predict(core, request, timeout_s, max_tensor_bytes)

    return {
        "Predict": _Method(predict_pb2.PredictRequest, predict, executor, "Predict"),
        "Classify": _Method(
            classification_pb2.ClassificationRequest, bind(inference.classify), executor, "Classify"
        ),
        "Regress": _Method(
            regression_pb2.RegressionRequest, bind(inference.regress), executor, "Regress"
        ),
        "MultiInference": _Method(
            inference_pb2.MultiInferenceRequest, bind(inference.multi_inference), executor
        ),
        "GetModelMetadata": _Method(
            get_model_metadata_pb2.GetModelMetadataRequest,
            bind(inference.get_model_metadata),
            executor,
        ),
    }


def _handler(service: str, methods: dict[str, _Method]) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(service, {
        # a bound coroutine method, so grpc.aio awaits it; no (de)serialisers: raw bytes
        name: grpc.unary_unary_rpc_method_handler(method.__call__)
        for name, method in methods.items()
    })


def build_server(core: ServingCore, executor: concurrent.futures.Executor,
                 channel_arguments: list[tuple[str, object]] = (),
                 max_tensor_bytes: int | None = None) -> grpc.aio.Server:
    """A grpc.aio server with both services registered (ports not yet bound).

    ``max_tensor_bytes``: --max_request_tensor_bytes (None or 0: no bound)."""
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *channel_arguments]
    server = grpc.aio.server(options=options)
    models = ModelService(core)
    server.add_generic_rpc_handlers(
        (
            _handler(
                "tensorflow.serving.PredictionService",
                _prediction_methods(core, executor, max_tensor_bytes),
            ),
            _handler(
                "tensorflow.serving.ModelService",
                {
                    "GetModelStatus": _Method(
                        get_model_status_pb2.GetModelStatusRequest,
                        models.get_model_status,
                        executor,
                    ),
                    # A reload can wait forever (TF Serving's hang): never on the shared pool.
                    "HandleReloadConfigRequest": _Method(
                        model_management_pb2.ReloadConfigRequest,
                        models.handle_reload_config_request,
                        None,
                    ),
                },
            ),
        )
    )
    return server


def bind_ports(server: grpc.aio.Server, tcp_address: str, socket_path: str,
               credentials: grpc.ServerCredentials | None) -> int | None:
    """Bind ``tcp_address`` ("": none) and ``unix:socket_path`` ("": none), both with
    ``credentials`` (None: insecure), as ms/server.cc does. The bound TCP port (0 when
    none), or None when a bind failed (logged)."""
    def add(address: str) -> int | None:
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:  # grpc raises where C++ would return port 0
            log.error("Failed to bind the gRPC server to %s: %s", address, exc)
            return None
        if port == 0:
            log.error("Failed to bind the gRPC server to %s", address)
            return None
        return port

    tcp_port = add(tcp_address) if tcp_address else 0
    if tcp_port is None or (socket_path and add(f"unix:{socket_path}") is None):
        return None
    return tcp_port
