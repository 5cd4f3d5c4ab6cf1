"""Async client for one TF Serving node's ModelService, with a deadline on every RPC.

It speaks the wire-compatible messages of ``tfscache.wire`` over raw method paths,
so it needs neither tensorflow nor tensorflow_serving. gRPC errors are translated
here, once, into the ``tfscache.errors`` tree, keeping TF Serving's message.
"""

from __future__ import annotations

import logging

import grpc

from tfscache import errors
from tfscache.kinds.channel import NodeChannel
from tfscache.wire import serving_pb2 as pb

log = logging.getLogger("tfscache.kinds.tfserving.client")

RELOAD_METHOD = "/tensorflow.serving.ModelService/HandleReloadConfigRequest"
STATUS_METHOD = "/tensorflow.serving.ModelService/GetModelStatus"

State = pb.ModelVersionStatus.State
AVAILABLE = pb.ModelVersionStatus.AVAILABLE
END = pb.ModelVersionStatus.END

class NodeClient(NodeChannel):
    """ModelService calls to the node at ``target`` ("host:port")."""

    def __init__(self, target: str, *, rpc_deadline_s: float = 10.0,
                 channel: grpc.aio.Channel | None = None) -> None:
        super().__init__(target, rpc_deadline_s=rpc_deadline_s, channel=channel)
        self._reload = self.method(RELOAD_METHOD, pb.ReloadConfigRequest, pb.ReloadConfigResponse)
        self._status = self.method(
            STATUS_METHOD, pb.GetModelStatusRequest, pb.GetModelStatusResponse
        )

    async def reload(self, config: pb.ModelServerConfig, deadline_s: float | None = None) -> None:
        """Send the full config; returns when the node's HandleReloadConfigRequest returns OK.

        The node blocks until every newly named model settles (AVAILABLE or END);
        a load failure comes back as UNKNOWN "... did not become available ...".
        """
        request = pb.ReloadConfigRequest(config=config)
        response = await self.rpc(self._reload, request, deadline_s)
        if response.status.error_code:  # a real node never sends a body with an error; be safe
            raise errors.error_for_code(response.status.error_code, response.status.error_message)

    async def status(self, name: str, version: int | None = None,
                     deadline_s: float | None = None) -> list[pb.ModelVersionStatus]:
        """GetModelStatus for ``name``: its versions in ascending order.

        ``[]`` when the node has never heard of the model ("Could not find any versions").
        """
        spec = pb.ModelSpec(name=name)
        if version is not None:
            spec.version.value = version
        try:
            response = await self.rpc(
                self._status, pb.GetModelStatusRequest(model_spec=spec), deadline_s
            )
        except errors.NotFound:
            return []
        return list(response.model_version_status)
