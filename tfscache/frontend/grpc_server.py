"""gRPC front end: a protocol's methods (tfscache.frontend.protocol) as raw-bytes generic handlers.

No request is deserialized beyond its routing key (``Method.route_key``); bytes go to the
router and the node's response bytes come back unchanged. Errors are mapped here, in one
place for every method: a TfscacheError keeps its code and message (a node's error arrives
as one, with the node's code and its own text); anything else is INTERNAL and logged.

Each request binds its log context here (model, request id; the router adds the
node): the id is the caller's ``x-request-id`` metadata, else a generated one, which
is then sent on to the node or peer so a forwarded request keeps it, and sent back to
the caller in the trailing metadata (``x-request-id``), errors included. The answer to a
request a peer sidecar's Python front end forwarded also carries this sidecar's own node's
load (``x-tfscache-load``, docs/copies.md) for the peer's copies rule; one the peer's HAProxy
sent (``x-tfscache-via``) does not, since HAProxy would pass it on to its client. Each request
is timed and counted here too (``Metrics.begin`` / ``request``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Mapping

import grpc

from tfscache import errors, logs
from tfscache.frontend.backends import FORWARDED_KEY, LOAD_KEY, VIA_KEY
from tfscache.frontend.methods import Method, RouteKey
from tfscache.frontend.protocol import Protocol
from tfscache.frontend.router import Router
from tfscache.frontend.upstream import PEER_PING_SERVER_OPTIONS, forwardable_metadata

log = logging.getLogger("tfscache.frontend.grpc_server")

REQUEST_ID_KEY = "x-request-id"
# gRPC sends the message in a header, percent-encoded beyond printable ASCII: one over
# the client's metadata limit (8 KB by default) reaches it as RESOURCE_EXHAUSTED, its
# own error hidden. So a message is cut to this many bytes on the wire.
MAX_ERROR_BYTES = 4096
# A streaming method's handler, made for the router and metrics: (router, metrics) -> handler.
StreamHandler = Callable[[Router, object], grpc.RpcMethodHandler]


def grpc_message(message: str) -> str:
    """The message as sent: cut to MAX_ERROR_BYTES once encoded, marked as TF Serving marks cuts."""
    size = 0
    for index, char in enumerate(message):
        size += (
            1 if " " <= char <= "~" and char != "%" else 3 * len(char.encode("utf-8", "replace"))
        )
        if size > MAX_ERROR_BYTES:
            return message[:index] + "...TRUNCATED"
    return message


# Ids made here: a random 48-bit start per process, then counting (12 hex digits, as a random one
# would be), so a request costs an addition rather than a call to the operating system's randomness.
_ids = itertools.count(secrets.randbits(48))


def new_request_id() -> str:
    """A short id for a request that came without one (unique within this process)."""
    return f"{next(_ids) & 0xFFFFFFFFFFFF:012x}"


class _Handlers(grpc.GenericRpcHandler):

    def __init__(
        self,
        router: Router,
        metrics,
        methods: Mapping[str, Method],
        refused: Mapping[str, errors.TfscacheError],
        streams: Mapping[str, StreamHandler],
    ) -> None:
        self._router = router
        # tfscache.observe.metrics.Metrics: requests counted by method and code
        self._metrics = metrics
        self._handlers = {path: grpc.unary_unary_rpc_method_handler(self._behavior(method))
                          for path, method in methods.items()}
        for path, error in refused.items():
            self._handlers[path] = grpc.unary_unary_rpc_method_handler(self._refuse(error))
        for path, make in streams.items():  # streaming methods map their errors themselves
            self._handlers[path] = make(router, metrics)

    def service(self, handler_call_details):
        return self._handlers.get(handler_call_details.method)  # None: UNIMPLEMENTED

    def _behavior(self, method: Method):
        router, metrics, name = self._router, self._metrics, method.path.rsplit("/", 1)[-1]
        debug = functools.partial(log.isEnabledFor, logging.DEBUG)

        async def behavior(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            started = metrics.begin() if metrics is not None else None
            metadata = context.invocation_metadata() or ()
            request_id, forwarded, via = None, False, False
            for k, v in metadata:
                if k == REQUEST_ID_KEY:
                    request_id = v
                elif k == FORWARDED_KEY:
                    forwarded = True
                elif k == VIA_KEY:
                    via = True
            outgoing = forwardable_metadata(metadata)
            if request_id is None:  # one made here goes to the node or peer, as the caller's would
                request_id = new_request_id()
                outgoing = (*outgoing, (REQUEST_ID_KEY, request_id))
            logs.bind(model=None, node=None, request_id=request_id)
            context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))  # the id goes back
            try:
                key = method.route_key(request)
                if key is not None:
                    logs.bind(model=key.name)
                    if key.label is not None and router.resolves_labels:
                        await router.read_labels(key.name)  # labels.json, off the event loop
                        key, request = method.with_versions(request, key, router.label_version)
                timeout = context.time_remaining()
                deadline = None if timeout is None else time.monotonic() + timeout
                try:
                    if method.send is None:
                        response = await router.grpc(
                            method.path,
                            key,
                            request,
                            outgoing,
                            deadline,
                            forwarded,
                            probe=method.probe,
                        )
                    else:
                        response = await method.send(
                            router, method.path, key, request, outgoing, deadline, forwarded
                        )
                except errors.ModelNotFound as missing:
                    if key is not None and method.not_found is not None:  # the method's own texts
                        raise method.not_found(key) from missing
                    if method.unknown is None or key is None:
                        raise
                    response = await _unknown_model(
                        router, method, key, request, outgoing, deadline, forwarded, missing
                    )
                # for the peer's copies rule, unless its HAProxy sent it (no one reads it there)
                if forwarded and not via and (load := router.own_load()) is not None:
                    context.set_trailing_metadata(((REQUEST_ID_KEY, request_id), (LOAD_KEY, load)))
                if debug():
                    log.debug(
                        "%s: OK", name, extra={"version": key.version} if key is not None else None
                    )
                if metrics is not None:
                    metrics.request("grpc", name, "OK", started)
                return response
            except errors.TfscacheError as exc:
                code, message = exc.grpc_code, exc.message
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the client cancelled, its deadline passed, or the server is stopping
                # Not ours: re-raised, gRPC would send the client nothing until its deadline.
                log.error("%s: cancelled inside tfscache, not by its client", method.path)
                code, message = (
                    grpc.StatusCode.UNAVAILABLE,
                    "request cancelled inside tfscache; retry it",
                )
            except Exception:  # noqa: BLE001 - the one place unknown errors become INTERNAL
                log.exception("%s failed", method.path)
                code, message = grpc.StatusCode.INTERNAL, "internal error in tfscache front end"
            log.debug("%s: %s: %s", name, code.name, message)
            if metrics is not None:
                metrics.request("grpc", name, code.name, started)
            await context.abort(code, grpc_message(message))

        return behavior

    def _refuse(self, error: errors.TfscacheError):
        async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            await context.abort(error.grpc_code, error.message)

        return refuse


async def _unknown_model(
    router: Router,
    method: Method,
    key: RouteKey,
    request: bytes,
    metadata,
    deadline: float | None,
    forwarded: bool,
    missing: errors.ModelNotFound,
) -> bytes:
    """A model the repository lacks, for a node that words that error itself (``Method.unknown``):
    a node's own answer, asked without a lease (it has no such model: the cache alone loads);
    the method's text when no node answers. A version it lacks of a model it has: the method's
    answer for a served model (``Method.unknown_version``), asking no node."""
    if isinstance(missing, errors.VersionNotFound) and method.unknown_version is not None:
        answer = method.unknown_version(key)
        if isinstance(answer, errors.TfscacheError):
            raise answer from missing
        return answer
    try:
        return await router.grpc(method.path, None, request, metadata, deadline, forwarded)
    except (errors.Unavailable, errors.DeadlineExceeded):
        raise method.unknown(key) from missing


class GrpcFrontend:
    """The gRPC server; ``start()`` returns once serving with the bound port."""

    def __init__(
        self,
        router: Router,
        *,
        bind_address: str,
        port: int,
        max_send_bytes: int,
        max_receive_bytes: int,
        protocol: Protocol,
        metrics=None,
        credentials: grpc.ServerCredentials | None = None,
        reuse_port: bool = False,
    ) -> None:
        """``protocol``: the API served, its methods, the ones refused and its streaming methods
        (the node kind's). ``credentials``: TLS (``tfscache.tls.ServerTls``); None: plaintext.
        ``reuse_port``: SO_REUSEPORT, so that worker processes share the port (tfscache.workers)."""
        self._credentials = credentials
        self._server = grpc.aio.server(options=[
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
            *PEER_PING_SERVER_OPTIONS,  # peer sidecars ping while their calls are in flight
        ])
        self._server.add_generic_rpc_handlers(
            [
                _Handlers(
                    router,
                    metrics,
                    protocol.grpc_methods,
                    protocol.grpc_refused,
                    protocol.grpc_streams,
                )
            ]
        )
        self._address = f"{bind_address}:{port}"
        self.port: int | None = None

    def add_handlers(self, handlers: list[grpc.GenericRpcHandler]) -> None:
        """Serve more services on this port (grpc.health.v1); grpc.aio takes them after start too."""
        self._server.add_generic_rpc_handlers(handlers)

    async def start(self) -> int:
        if self._credentials is None:
            self.port = self._server.add_insecure_port(self._address)
        else:
            self.port = self._server.add_secure_port(self._address, self._credentials)
        if not self.port:
            raise OSError(f"cannot bind gRPC front end to {self._address}")
        await self._server.start()
        log.info("gRPC front end serving on %s (port %s%s)", self._address, self.port,
                 "" if self._credentials is None else ", TLS")
        return self.port

    async def stop(self, grace: float | None) -> None:
        await self._server.stop(grace)
