"""The repository extension of the Open Inference Protocol over gRPC, for any kind that serves it.

Triton defines the extension (RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload inside
``inference.GRPCInferenceService``) and other servers speak it with the same messages. This
channel sends the wire-compatible messages of ``tfscache.wire.oip_repository`` by method path
(no server's own client library). A kind's client subclasses it and reads its server's
dialect: how index states are written, how "not loaded" is answered to ModelReady.
"""

from __future__ import annotations

import grpc

from tfscache.kinds.channel import NodeChannel
from tfscache.wire import oip_repository_pb2 as pb

SERVICE = "/inference.GRPCInferenceService/"

ModelIndex = pb.RepositoryIndexResponse.ModelIndex


class OipRepositoryChannel(NodeChannel):
    """ServerLive, ModelReady and the repository calls to the node at ``target`` ("host:port")."""

    def __init__(self, target: str, *, rpc_deadline_s: float = 10.0,
                 channel: grpc.aio.Channel | None = None) -> None:
        super().__init__(target, rpc_deadline_s=rpc_deadline_s, channel=channel)
        self._live = self._oip("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse)
        self._ready = self._oip("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse)
        self._index = self._oip(
            "RepositoryIndex", pb.RepositoryIndexRequest, pb.RepositoryIndexResponse
        )
        self._load = self._oip("RepositoryModelLoad", pb.RepositoryModelLoadRequest,
                               pb.RepositoryModelLoadResponse)
        self._unload = self._oip("RepositoryModelUnload", pb.RepositoryModelUnloadRequest,
                                 pb.RepositoryModelUnloadResponse)

    def _oip(self, name: str, request, response):
        return self.method(SERVICE + name, request, response)

    async def live(self, deadline_s: float | None = None) -> bool:
        """ServerLive: the server process answers (ServerReady is false while any model is not ready)."""
        return (await self.rpc(self._live, pb.ServerLiveRequest(), deadline_s)).live

    async def index(self, ready: bool = False, deadline_s: float | None = None) -> list[ModelIndex]:
        """RepositoryIndex: one entry per version record of every model (only READY ones if ``ready``)."""
        response = await self.rpc(self._index, pb.RepositoryIndexRequest(ready=ready), deadline_s)
        return list(response.models)

    async def load(self, name: str, deadline_s: float | None = None, *,
                   config: str | None = None) -> None:
        """RepositoryModelLoad: returns once the server finished loading ``name``; ``config``: a
        whole model configuration in JSON that replaces the one on disk (Triton's override)."""
        request = pb.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            request.parameters["config"].string_param = config
        await self.rpc(self._load, request, deadline_s)

    async def unload(self, name: str, deadline_s: float | None = None) -> None:
        """RepositoryModelUnload of ``name``."""
        await self.rpc(self._unload, pb.RepositoryModelUnloadRequest(model_name=name), deadline_s)

    async def ready(self, name: str, version: str = "", deadline_s: float | None = None) -> bool:
        """ModelReady as the server answers it (errors raised as they come)."""
        request = pb.ModelReadyRequest(name=name, version=version)
        return (await self.rpc(self._ready, request, deadline_s)).ready
