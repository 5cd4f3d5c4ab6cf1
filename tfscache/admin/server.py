"""The gRPC service ``tfscache.admin.Admin`` (protos/tfscache/wire/admin.proto) on its own port.

Bound to 127.0.0.1 by default. Bound anywhere else it requires a token: ``settings.check_bind``
refuses to start without one. With a token set, every call must carry metadata
``authorization: Bearer <token>``, else UNAUTHENTICATED. Errors are mapped in one
place (``_Handlers._unary``/``_stream``): a TfscacheError keeps its code and message;
anything else is INTERNAL with a generic message, logged with its traceback.

    server = AdminServer(operations, drainer, bind_address="127.0.0.1", port=8502, token="")
    port = await server.start()
    ...
    await server.stop()

``tfscache.admin.lifecycle.Lifecycle.attach`` builds it in a running ``tfscache serve``.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from tfscache import errors
from tfscache.auth import BearerToken
from tfscache.admin.drain import Drainer
from tfscache.admin.operations import AdminOperations, NodeState
from tfscache.cache.ledger import ResidentModel
from tfscache.settings import check_bind
from tfscache.wire import admin_pb2

log = logging.getLogger("tfscache.admin")

SERVICE = "tfscache.admin.Admin"
DEFAULT_PORT = 8502
_PROGRESS_POLL_S = 0.1


def resident_pb(m: ResidentModel) -> admin_pb2.ResidentModel:
    return admin_pb2.ResidentModel(
        name=m.name,
        version=m.version,
        bytes=m.bytes,
        measured=m.measured,
        leases=m.leases,
        last_use=m.last_use,
        state=m.state,
        pinned=m.pinned,
    )


def _node_pb(state: NodeState) -> admin_pb2.NodeModels:
    return admin_pb2.NodeModels(node=state.node, healthy=state.healthy, draining=state.draining,
                                models=[resident_pb(m) for m in state.models], queued=state.queued)


def _results(done: dict[str, list[ResidentModel]]) -> admin_pb2.ModelResponse:
    return admin_pb2.ModelResponse(results=[
        admin_pb2.ModelResult(node=node, models=[resident_pb(m) for m in models])
        for node, models in sorted(done.items())])


class AdminService:
    """The RPCs, over ``AdminOperations`` and ``Drainer``; each takes and returns protobuf messages."""

    def __init__(self, admin: AdminOperations, drainer: Drainer) -> None:
        self.admin, self.drainer = admin, drainer

    async def ListModels(
        self, request: admin_pb2.ListModelsRequest
    ) -> admin_pb2.ListModelsResponse:
        return admin_pb2.ListModelsResponse(
            nodes=[_node_pb(s) for s in self.admin.list_models(request.node)],
            draining=self.drainer.draining,
        )

    async def Pin(self, request: admin_pb2.ModelRequest) -> admin_pb2.ModelResponse:
        return _results(await self.admin.pin(request.name, _version(request), request.node,
                                             request.timeout_s or None))

    async def Unpin(self, request: admin_pb2.ModelRequest) -> admin_pb2.ModelResponse:
        return _results(await self.admin.unpin(request.name, _version(request), request.node))

    async def Preload(self, request: admin_pb2.ModelRequest) -> admin_pb2.ModelResponse:
        return _results(await self.admin.preload(request.name, _version(request), request.node,
                                                 request.timeout_s or None))

    async def Evict(self, request: admin_pb2.ModelRequest) -> admin_pb2.ModelResponse:
        return _results(await self.admin.evict(request.name, _version(request), request.node))

    async def Drain(self, request: admin_pb2.DrainRequest):
        """Start (or follow) a drain; stream its progress until done."""
        self.drainer.start(request.node, request.grace_s or None)
        last = None
        while True:
            p = self.drainer.progress(request.node)
            message = admin_pb2.DrainProgress(
                phase=p.phase,
                models_left=p.models_left,
                models_total=p.models_total,
                leases=p.leases,
                done=p.done,
            )
            if message != last:
                yield message
                last = message
            if p.done:
                return
            # a progress display's refresh, not a wait for a state
            await asyncio.sleep(_PROGRESS_POLL_S)


    async def Join(self, request: admin_pb2.JoinRequest) -> admin_pb2.JoinResponse:
        """Register a sidecar started with discovery.join = false; refused while the process drains."""
        if self.drainer.draining:
            raise errors.FailedPrecondition("join: this tfscache is draining")
        registered, message = await self.admin.join()
        return admin_pb2.JoinResponse(registered=registered, message=message)


def _version(request: admin_pb2.ModelRequest) -> int | None:
    if request.version < 0:
        raise errors.InvalidArgument(f"version must be >= 0 (0 = latest), got {request.version}")
    return request.version or None


_METHODS = {  # name -> (request type, streaming response)
    "ListModels": (admin_pb2.ListModelsRequest, False),
    "Pin": (admin_pb2.ModelRequest, False),
    "Unpin": (admin_pb2.ModelRequest, False),
    "Preload": (admin_pb2.ModelRequest, False),
    "Evict": (admin_pb2.ModelRequest, False),
    "Drain": (admin_pb2.DrainRequest, True),
    "Join": (admin_pb2.JoinRequest, False),
}


class _Handlers(grpc.GenericRpcHandler):
    """Token check and error mapping for every method, in one place."""

    def __init__(self, service: AdminService, token: str) -> None:
        self._service = service
        self._token = BearerToken(token)
        self._handlers = {}
        for name, (request_type, streaming) in _METHODS.items():
            make = (
                grpc.unary_stream_rpc_method_handler
                if streaming
                else grpc.unary_unary_rpc_method_handler
            )
            behavior = (self._stream if streaming else self._unary)(name, getattr(service, name))
            self._handlers[f"/{SERVICE}/{name}"] = make(
                behavior,
                request_deserializer=request_type.FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )

    def service(self, handler_call_details):
        return self._handlers.get(handler_call_details.method)

    def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        self._token.check(values[0] if values else None)

    def _unary(self, name, method):
        async def behavior(request, context: grpc.aio.ServicerContext):
            try:
                self._authenticate(context)
                return await method(request)
            except Exception as exc:  # noqa: BLE001 - mapped in _status, the one place
                await context.abort(*_status(name, exc))

        return behavior

    def _stream(self, name, method):
        async def behavior(request, context: grpc.aio.ServicerContext):
            try:
                self._authenticate(context)
                async for message in method(request):
                    yield message
            except Exception as exc:  # noqa: BLE001 - mapped in _status, the one place
                await context.abort(*_status(name, exc))

        return behavior


def _status(name: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The admin service's one error mapping: our errors keep their code and text; others are INTERNAL."""
    if isinstance(exc, errors.TfscacheError):
        return exc.grpc_code, exc.message
    log.error("admin %s failed", name, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error in tfscache admin service"


class AdminServer:
    """The admin gRPC server over ``operations`` and ``drainer``; ``start()`` returns the bound port."""

    def __init__(
        self,
        operations: AdminOperations,
        drainer: Drainer,
        *,
        bind_address: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: str = "",
    ) -> None:
        check_bind(bind_address, token)
        self.operations = operations
        self.drainer = drainer
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers([_Handlers(AdminService(operations, drainer), token)])
        self._address = f"{bind_address}:{port}"
        self.port: int | None = None

    async def start(self) -> int:
        try:
            self.port = self._server.add_insecure_port(self._address)
        except RuntimeError:
            self.port = 0
        if not self.port:
            raise OSError(f"cannot bind the admin server to {self._address}")
        await self._server.start()
        log.info("admin API serving on %s (port %s)", self._address, self.port)
        return self.port

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (a second call does nothing)."""
        if self.port is not None:
            self.port = None
            await self._server.stop(grace)
