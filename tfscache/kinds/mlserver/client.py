"""Async client for one MLServer node's repository API (Open Inference Protocol, gRPC), with deadlines.

MLServer 1.7 serves Triton's repository extension inside ``inference.GRPCInferenceService``
(RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload), with Triton's messages, so this
client sends the wire-compatible messages of ``tfscache.wire.oip_repository`` by method path:
no mlserver, no tritonclient. What differs from Triton, as measured against MLServer 1.7.1
(docs/mlserver.md, "Behaviour"):

* index states are written as Python enum names over gRPC ("State.READY"); they are read here
  as the names alone (READY, UNAVAILABLE, and UNKNOWN for a model registered but still loading);
* a load and an unload return once they are done, in every inference worker;
* errors: MLServer's ``MLServerError`` statuses map 404 -> NOT_FOUND ("Model NAME not found"),
  400 -> INVALID_ARGUMENT, 422 -> FAILED_PRECONDITION, 500 -> INTERNAL; any other exception in a
  load (a model file that does not parse) is INTERNAL with the exception's text;
* ModelReady for a model not loaded is UNKNOWN "Unexpected <class 'mlserver.errors.ModelNotFound'>:
  Model NAME with version V not found" (not ready = false): ``model_ready`` reads it as false.
"""

from __future__ import annotations

import grpc

from tfscache import errors
from tfscache.kinds.channel import NodeChannel
from tfscache.wire import oip_repository_pb2 as pb

SERVICE = "/inference.GRPCInferenceService/"

ModelIndex = pb.RepositoryIndexResponse.ModelIndex

# MLServer's index states (mlserver.types.State); UNKNOWN: registered, not ready yet (loading).
READY = "READY"
UNKNOWN = "UNKNOWN"
UNAVAILABLE = "UNAVAILABLE"
NOT_FOUND_CLASS = "mlserver.errors.ModelNotFound"


class MLServerClient(NodeChannel):
    """Health, readiness and repository calls to the MLServer node at ``target`` ("host:port")."""

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
        """ServerLive (not ServerReady: MLServer's is false while any model is not ready)."""
        return (await self.rpc(self._live, pb.ServerLiveRequest(), deadline_s)).live

    async def index(self, ready: bool = False, deadline_s: float | None = None) -> list[ModelIndex]:
        """RepositoryIndex: one entry per ``model-settings.json`` under the repository (only READY
        ones if ``ready``), with the state as a bare name (READY, UNAVAILABLE, UNKNOWN)."""
        response = await self.rpc(self._index, pb.RepositoryIndexRequest(ready=ready), deadline_s)
        return [ModelIndex(name=m.name, version=m.version, state=m.state.rpartition(".")[2], reason=m.reason)
                for m in response.models]

    async def load(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelLoad: returns once every version of ``name`` in the repository loaded.

        NOT_FOUND ``Model NAME not found`` when no ``model-settings.json`` names it; a load that
        fails is INTERNAL with the runtime's exception text (MLServer drops the model again).
        """
        await self.rpc(self._load, pb.RepositoryModelLoadRequest(model_name=name), deadline_s)

    async def unload(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelUnload: returns once every version of ``name`` is unloaded, in every worker;
        NOT_FOUND ``Model NAME not found`` when none is loaded."""
        await self.rpc(self._unload, pb.RepositoryModelUnloadRequest(model_name=name), deadline_s)

    async def model_ready(self, name: str, version: str = "", deadline_s: float | None = None) -> bool:
        """ModelReady; False for a model (or version) not loaded (MLServer answers UNKNOWN for those)."""
        try:
            response = await self.rpc(self._ready, pb.ModelReadyRequest(name=name, version=version), deadline_s)
        except (errors.NotFound, errors.Unknown) as e:
            if isinstance(e, errors.Unknown) and NOT_FOUND_CLASS not in e.message:
                raise
            return False
        return response.ready
