"""Async client for one Triton node's repository API (Open Inference Protocol, gRPC), with deadlines.

It speaks the wire-compatible messages of ``tfscache.wire.oip_repository`` over raw
method paths (``/inference.GRPCInferenceService/RepositoryIndex`` ...), so it needs
neither tritonclient nor Triton's generated code. gRPC errors are translated here, once,
into the ``tfscache.errors`` tree, keeping Triton's message word for word: Triton maps
its own status codes one-to-one to gRPC's (triton-behavior.md §5), so INVALID_ARGUMENT
"load failed for model 'X': ..." stays an InvalidArgument carrying that text.

Every call has a deadline: a load has no timeout on Triton's side (§2.3), so the
caller's deadline is the only one there is.
"""

from __future__ import annotations

import logging

import grpc

from tfscache import errors
from tfscache.nodeclient import MAX_MESSAGE_BYTES, RECONNECT_OPTIONS, channel_ready
from tfscache.wire import oip_repository_pb2 as pb

log = logging.getLogger("tfscache.oipclient")

SERVICE = "/inference.GRPCInferenceService/"

ModelIndex = pb.RepositoryIndexResponse.ModelIndex

# Triton's index states (model_lifecycle.cc) and the reason of a completed unload.
READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED_REASON = "unloaded"


class OipClient:
    """Health, readiness and repository calls to the Triton node at ``target`` ("host:port")."""

    def __init__(self, target: str, *, rpc_deadline_s: float = 10.0,
                 channel: grpc.aio.Channel | None = None) -> None:
        self.target = target
        self.rpc_deadline_s = rpc_deadline_s
        self._channel = channel or grpc.aio.insecure_channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            *RECONNECT_OPTIONS,
        ])
        self._live = self._method("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse)
        self._ready = self._method("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse)
        self._index = self._method("RepositoryIndex", pb.RepositoryIndexRequest, pb.RepositoryIndexResponse)
        self._load = self._method("RepositoryModelLoad", pb.RepositoryModelLoadRequest,
                                  pb.RepositoryModelLoadResponse)
        self._unload = self._method("RepositoryModelUnload", pb.RepositoryModelUnloadRequest,
                                    pb.RepositoryModelUnloadResponse)

    def _method(self, name: str, request, response):
        return self._channel.unary_unary(SERVICE + name, request_serializer=request.SerializeToString,
                                         response_deserializer=response.FromString)

    async def live(self, deadline_s: float | None = None) -> bool:
        """ServerLive: the server process answers (not /ready: one failed model poisons that, §9.5)."""
        return (await self._call(self._live, pb.ServerLiveRequest(), deadline_s)).live

    async def index(self, ready: bool = False, deadline_s: float | None = None) -> list[ModelIndex]:
        """RepositoryIndex: one entry per version record of every model directory (only READY ones if ``ready``)."""
        response = await self._call(self._index, pb.RepositoryIndexRequest(ready=ready), deadline_s)
        return list(response.models)

    async def load(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelLoad: returns once Triton finished loading ``name`` (its version policy's versions).

        Triton blocks for the whole load and has no timeout of its own; a failed load is
        INVALID_ARGUMENT ``load failed for model 'NAME': version N is at UNAVAILABLE state: ...``.
        """
        await self._call(self._load, pb.RepositoryModelLoadRequest(model_name=name), deadline_s)

    async def unload(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelUnload: returns once no version is READY, *before* the model is gone (§2.4)."""
        await self._call(self._unload, pb.RepositoryModelUnloadRequest(model_name=name), deadline_s)

    async def model_ready(self, name: str, version: str = "", deadline_s: float | None = None) -> bool:
        """ModelReady; False for an unknown name (Triton's HEAD answers NOT_FOUND for those, 2.51 ready=false)."""
        try:
            response = await self._call(self._ready, pb.ModelReadyRequest(name=name, version=version), deadline_s)
        except errors.NotFound:
            return False
        return response.ready

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the channel to connect to the node; whether it did (not an RPC)."""
        return await channel_ready(self._channel, timeout)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method, request, deadline_s: float | None):
        timeout = self.rpc_deadline_s if deadline_s is None else deadline_s
        try:
            return await method(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise errors.NodeUnavailable(f"node {self.target} is unavailable: {e.details()}") from e
            raise errors.error_for_code(e.code(), e.details() or "") from e
