"""A small blocking client of the admin API, for the CLI and the ops scripts.

    with AdminClient("127.0.0.1:8502", token="s3cret") as admin:
        for node in admin.list_models().nodes: ...
        admin.preload("addk_1")
        for progress in admin.drain(): ...
        admin.join()                    # a sidecar started with --no-join: register now

Errors come back as the server sent them: ``AdminError`` with the gRPC code and message.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from tfscache.wire import admin_pb2

SERVICE = "tfscache.admin.Admin"
DEFAULT_ADDRESS = "127.0.0.1:8502"


class AdminError(Exception):
    """An admin call failed; ``code`` is the gRPC status code, ``message`` the server's text."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


class AdminClient:

    def __init__(
        self, address: str = DEFAULT_ADDRESS, *, token: str = "", timeout_s: float = 60.0
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = grpc.insecure_channel(address)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _call(self, method: str, request, response_type, timeout: float | None = None):
        call = self._channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            return call(request, timeout=timeout or self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise AdminError(exc.code(), exc.details() or "") from None

    def list_models(self, node: str = "") -> admin_pb2.ListModelsResponse:
        return self._call(
            "ListModels", admin_pb2.ListModelsRequest(node=node), admin_pb2.ListModelsResponse
        )

    def _model(self, method: str, name: str, version: int | None, node: str, timeout_s: float | None
               ) -> admin_pb2.ModelResponse:
        request = admin_pb2.ModelRequest(
            name=name, version=version or 0, node=node, timeout_s=timeout_s or 0
        )
        # A load may take the server's whole load timeout: wait a little longer than it does.
        timeout = (timeout_s + 10.0) if timeout_s else max(self.timeout_s, 660.0)
        return self._call(
            method,
            request,
            admin_pb2.ModelResponse,
            timeout if method in ("Pin", "Preload") else None,
        )

    def pin(
        self, name: str, version: int | None = None, node: str = "", timeout_s: float | None = None
    ):
        return self._model("Pin", name, version, node, timeout_s)

    def unpin(self, name: str, version: int | None = None, node: str = ""):
        return self._model("Unpin", name, version, node, None)

    def preload(
        self, name: str, version: int | None = None, node: str = "", timeout_s: float | None = None
    ):
        return self._model("Preload", name, version, node, timeout_s)

    def evict(self, name: str, version: int | None = None, node: str = ""):
        return self._model("Evict", name, version, node, None)

    def join(self) -> admin_pb2.JoinResponse:
        """A sidecar started with --no-join registers with discovery now (idempotent)."""
        return self._call("Join", admin_pb2.JoinRequest(), admin_pb2.JoinResponse)

    def drain(self, node: str = "", grace_s: float = 0.0) -> Iterator[admin_pb2.DrainProgress]:
        """Start (or follow) a drain and yield its progress until done.

        A process drain ends with the server exiting: the stream may then end with
        UNAVAILABLE right after the last message (done = true), which is success.
        """
        call = self._channel.unary_stream(
            f"/{SERVICE}/Drain",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=admin_pb2.DrainProgress.FromString,
        )
        done = False
        try:
            for progress in call(
                admin_pb2.DrainRequest(node=node, grace_s=grace_s), metadata=self._metadata
            ):
                done = done or progress.done
                yield progress
        except grpc.RpcError as exc:
            if done and exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                return
            raise AdminError(exc.code(), exc.details() or "") from None
