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
from tfscache.kinds.channel import NodeChannel
from tfscache.wire import oip_repository_pb2 as pb

log = logging.getLogger("tfscache.kinds.triton.client")

SERVICE = "/inference.GRPCInferenceService/"

ModelIndex = pb.RepositoryIndexResponse.ModelIndex

# Triton's index states (model_lifecycle.cc) and the reason of a completed unload.
READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED_REASON = "unloaded"


class OipClient(NodeChannel):
    """Health, readiness and repository calls to the Triton node at ``target`` ("host:port")."""

    def __init__(self, target: str, *, rpc_deadline_s: float = 10.0,
                 channel: grpc.aio.Channel | None = None) -> None:
        super().__init__(target, rpc_deadline_s=rpc_deadline_s, channel=channel)
        self._live = self._oip("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse)
        self._ready = self._oip("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse)
        self._index = self._oip("RepositoryIndex", pb.RepositoryIndexRequest, pb.RepositoryIndexResponse)
        self._load = self._oip("RepositoryModelLoad", pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse)
        self._unload = self._oip("RepositoryModelUnload", pb.RepositoryModelUnloadRequest,
                                 pb.RepositoryModelUnloadResponse)

    def _oip(self, name: str, request, response):
        return self.method(SERVICE + name, request, response)

    async def live(self, deadline_s: float | None = None) -> bool:
        """ServerLive: the server process answers (not /ready: one failed model poisons that, §9.5)."""
        return (await self.rpc(self._live, pb.ServerLiveRequest(), deadline_s)).live

    async def index(self, ready: bool = False, deadline_s: float | None = None) -> list[ModelIndex]:
        """RepositoryIndex: one entry per version record of every model directory (only READY ones if ``ready``)."""
        response = await self.rpc(self._index, pb.RepositoryIndexRequest(ready=ready), deadline_s)
        return list(response.models)

    async def load(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelLoad: returns once Triton finished loading ``name`` (its version policy's versions).

        Triton blocks for the whole load and has no timeout of its own; a failed load is
        INVALID_ARGUMENT ``load failed for model 'NAME': version N is at UNAVAILABLE state: ...``.
        """
        await self.rpc(self._load, pb.RepositoryModelLoadRequest(model_name=name), deadline_s)

    async def unload(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelUnload: returns once no version is READY, *before* the model is gone (§2.4)."""
        await self.rpc(self._unload, pb.RepositoryModelUnloadRequest(model_name=name), deadline_s)

    async def model_ready(self, name: str, version: str = "", deadline_s: float | None = None) -> bool:
        """ModelReady; False for an unknown name (Triton's HEAD answers NOT_FOUND for those, 2.51 ready=false)."""
        try:
            response = await self.rpc(self._ready, pb.ModelReadyRequest(name=name, version=version), deadline_s)
        except errors.NotFound:
            return False
        return response.ready
