"""Async client for one TF Serving node's ModelService, with a deadline on every RPC.

It speaks the wire-compatible messages of ``tfscache.wire`` over raw method paths,
so it needs neither tensorflow nor tensorflow_serving. gRPC errors are translated
here, once, into the ``tfscache.errors`` tree, keeping TF Serving's message.
"""

from __future__ import annotations

import logging

import grpc

from tfscache import errors
from tfscache.wire import serving_pb2 as pb

log = logging.getLogger("tfscache.nodeclient")

RELOAD_METHOD = "/tensorflow.serving.ModelService/HandleReloadConfigRequest"
STATUS_METHOD = "/tensorflow.serving.ModelService/GetModelStatus"

State = pb.ModelVersionStatus.State
AVAILABLE = pb.ModelVersionStatus.AVAILABLE
END = pb.ModelVersionStatus.END

MAX_MESSAGE_BYTES = 2**31 - 1  # TF Serving's own limit, both ways


class NodeClient:
    """ModelService calls to the node at ``target`` ("host:port")."""

    def __init__(self, target: str, *, rpc_deadline_s: float = 10.0,
                 channel: grpc.aio.Channel | None = None) -> None:
        self.target = target
        self.rpc_deadline_s = rpc_deadline_s
        self._channel = channel or grpc.aio.insecure_channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ])
        self._reload = self._channel.unary_unary(
            RELOAD_METHOD,
            request_serializer=pb.ReloadConfigRequest.SerializeToString,
            response_deserializer=pb.ReloadConfigResponse.FromString,
        )
        self._status = self._channel.unary_unary(
            STATUS_METHOD,
            request_serializer=pb.GetModelStatusRequest.SerializeToString,
            response_deserializer=pb.GetModelStatusResponse.FromString,
        )

    async def reload(self, config: pb.ModelServerConfig, deadline_s: float | None = None) -> None:
        """Send the full config; returns when the node's HandleReloadConfigRequest returns OK.

        The node blocks until every newly named model settles (AVAILABLE or END);
        a load failure comes back as UNKNOWN "... did not become available ...".
        """
        request = pb.ReloadConfigRequest(config=config)
        response = await self._call(self._reload, request, deadline_s)
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
            response = await self._call(self._status, pb.GetModelStatusRequest(model_spec=spec), deadline_s)
        except errors.NotFound:
            return []
        return list(response.model_version_status)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method, request, deadline_s: float | None):
        timeout = self.rpc_deadline_s if deadline_s is None else deadline_s
        try:
            return await method(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise errors.NodeUnavailable(
                    f"node {self.target} is unavailable: {e.details()}") from e
            raise errors.error_for_code(e.code(), e.details() or "") from e
