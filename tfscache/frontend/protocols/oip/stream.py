"""``inference.GRPCInferenceService/ModelStreamInfer`` through the front end.

One client stream carries ModelInferRequests, each for any model. Each request is
routed by its own model and version (``model_name = 1``, ``model_version = 2``; nothing
else is read) and sent to its node on a stream of its own, under a lease on its model
(``tfscache.frontend.streams``): a cold model loads on its first request, a model with a
request streaming is never unloaded, and the lease goes back when the node ends that
request's stream (after its final response, or with none: a decoupled model may send 0..N),
on an error, or when the client cancels. The node's responses are relayed as bytes, in
the order they come and unchanged, ``triton_final_response`` parameter included; the
node's stream for a request ends only once Triton sent everything for it, so no response
is dropped and none is invented.

Errors of one request (an unknown model, a failed load, a node that died mid-stream) are
answered as Triton answers them in a stream: a ModelStreamInferResponse whose
``error_message`` is the text and whose ``infer_response.id`` is the request's id; the
client stream goes on serving its other requests. Only a failure of the client stream
itself ends it with a gRPC status.

Cancellation and deadlines: the client's deadline bounds every node call of the stream
(and a lease wait); when the client cancels, or the deadline passes, every node call in
flight is cancelled, which Triton passes to the model (``is_cancelled()``).

Backpressure: at most ``max_in_flight`` requests of one client stream are served at once
(the next is read from the client only when one ends, so HTTP/2 flow control holds the
client), and at most ``max_queued`` responses wait for a slow client; past that, the
relays stop reading their nodes, whose own flow control then holds the node back. What
one client stream makes tfscache hold is thus bounded by about ``max_queued +
max_in_flight`` responses, plus gRPC's flow-control windows.

Order: responses of one request keep the node's order. Requests of one client stream go
to their nodes on separate streams, so two requests for one model may start on the node in
either order: a sequence (stateful) model that needs its requests in order must have each
answered before the next is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from google.protobuf.message import DecodeError

from tfscache import errors, logs
from tfscache.frontend.backends import FORWARDED_KEY
from tfscache.frontend.grpc_server import REQUEST_ID_KEY, grpc_message, new_request_id
from tfscache.frontend.methods import RouteKey, select_fields
from tfscache.frontend.protocols.oip.methods import SERVICE, parse_version, unknown_model
from tfscache.frontend.router import Router
from tfscache.frontend.streams import open_stream
from tfscache.frontend.upstream import forwardable_metadata
from tfscache.wire import oip_heads_pb2

log = logging.getLogger("tfscache.frontend.protocols.oip.stream")

PATH = f"/{SERVICE}/ModelStreamInfer"
MAX_IN_FLIGHT = 64  # requests of one client stream served at once; the next waits to be read
MAX_QUEUED = 16  # responses of one client stream waiting for the client to take them
_HEAD_FIELDS = frozenset({1, 2, 3})
_END = object()


def error_response(message: str, request_id: str) -> bytes:
    """A ModelStreamInferResponse carrying one request's error, as Triton writes it."""
    head = oip_heads_pb2.StreamErrorHead(error_message=message,
                                         infer_response=oip_heads_pb2.InferHead(id=request_id))
    return head.SerializeToString()


def read_head(request: bytes) -> tuple[RouteKey | None, str]:
    """A ModelInferRequest's model (None: no name; the node answers) and id."""
    try:
        head = oip_heads_pb2.InferHead.FromString(select_fields(request, _HEAD_FIELDS))
    except DecodeError as exc:
        raise errors.InvalidArgument(
            "Failed to parse request as inference.ModelInferRequest"
        ) from exc
    if not head.model_name:
        return None, head.id
    return RouteKey(head.model_name, version=parse_version(head.model_version)), head.id


class StreamInfer:
    """The ModelStreamInfer method over a router: ``handler()`` is its gRPC method handler."""

    def __init__(self, router: Router, metrics=None, *, max_in_flight: int = MAX_IN_FLIGHT,
                 max_queued: int = MAX_QUEUED) -> None:
        self._router = router
        self._metrics = metrics
        self._max_in_flight = max_in_flight
        self._max_queued = max_queued

    def handler(self) -> grpc.RpcMethodHandler:
        return grpc.stream_stream_rpc_method_handler(self.serve)

    async def serve(self, requests, context: grpc.aio.ServicerContext):
        """Relay every request of the client stream; yield the responses as they come."""
        metadata = context.invocation_metadata() or ()
        request_id = next((v for k, v in metadata if k == REQUEST_ID_KEY), None)
        logs.bind(model=None, node=None, request_id=request_id or new_request_id())
        context.set_trailing_metadata(((REQUEST_ID_KEY, logs.request_id.get()),))
        timeout = context.time_remaining()
        outgoing = forwardable_metadata(metadata)
        if request_id is None:
            outgoing = (*outgoing, (REQUEST_ID_KEY, logs.request_id.get()))
        session = _Session(self, None if timeout is None else time.monotonic() + timeout, outgoing,
                           any(k == FORWARDED_KEY for k, _ in metadata))
        reader = asyncio.create_task(session.read(requests))
        try:
            while (response := await session.queue.get()) is not _END:
                yield response
            await reader
        finally:
            await session.close(reader)
        if session.failure is not None:  # the client stream itself failed: it ends with that status
            await context.abort(session.failure.grpc_code, grpc_message(session.failure.message))


class _Session:
    """One client stream: the requests being served and the responses waiting for the client."""

    def __init__(
        self, method: StreamInfer, deadline: float | None, metadata, forwarded: bool
    ) -> None:
        self.method = method
        self.deadline = deadline
        self.metadata = metadata
        self.forwarded = forwarded
        self.queue: asyncio.Queue = asyncio.Queue(method._max_queued)
        self.slots = asyncio.Semaphore(method._max_in_flight)
        self.tasks: set[asyncio.Task] = set()
        self.failure: errors.TfscacheError | None = None  # reading the client stream failed

    async def read(self, requests) -> None:
        """Start serving each request as it is read; once the client is done, wait for them all."""
        try:
            async for request in requests:
                await self.slots.acquire()
                task = asyncio.create_task(self.serve(request))
                self.tasks.add(task)
                task.add_done_callback(self._done)
            while self.tasks:
                await asyncio.wait(set(self.tasks))
        except grpc.aio.AioRpcError as exc:  # reading the client stream failed
            self.failure = errors.error_for_code(exc.code(), exc.details() or "")
        await self.queue.put(_END)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self.slots.release()

    async def serve(self, request: bytes) -> None:
        """Relay one request's responses; its error as an error response."""
        metrics = self.method._metrics
        started = metrics.begin() if metrics is not None else None
        code = grpc.StatusCode.OK
        request_id = ""
        sent = [0]
        try:
            key, request_id = read_head(request)
            logs.bind(model=key.name if key is not None else None, node=None)
            try:
                await self.relay(key, request, sent)
            except errors.ModelNotFound as missing:
                if key is None:
                    raise
                try:  # a node's own answer, without a lease: Triton's text
                    await self.relay(None, request, sent)
                except (errors.Unavailable, errors.DeadlineExceeded):
                    raise unknown_model(key) from missing
        except errors.TfscacheError as exc:
            code, message = exc.grpc_code, exc.message
            if sent[0] and isinstance(exc, errors.Unavailable):
                message = (
                    f"the node serving this request became unavailable after {sent[0]} response(s) "
                    f"({logs.node.get()}): {message}"
                )
            log.debug("ModelStreamInfer: %s: %s", code.name, message)
            await self.queue.put(error_response(message, request_id))
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:  # noqa: BLE001
            # one request's unknown error: INTERNAL, the stream goes on
            log.exception("ModelStreamInfer request failed")
            code = grpc.StatusCode.INTERNAL
            await self.queue.put(error_response("internal error in tfscache front end", request_id))
        finally:
            if metrics is not None:
                metrics.request("grpc", "ModelStreamInfer", code.name, started)

    async def relay(self, key: RouteKey | None, request: bytes, sent: list[int]) -> None:
        router, deadline, metadata = self.method._router, self.deadline, self.metadata

        def start(backend):
            return backend.stream(key, PATH, request, metadata, deadline)

        async with contextlib.aclosing(
            open_stream(router, key, self.forwarded, deadline, start)
        ) as responses:
            async for response in responses:
                await self.queue.put(response)
                sent[0] += 1

    async def close(self, reader: asyncio.Task) -> None:
        """The client stream ended (or was cancelled): cancel what still runs; its leases go back."""
        pending = [t for t in (reader, *self.tasks) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def stream_infer_handler(router: Router, metrics=None) -> grpc.RpcMethodHandler:
    """ModelStreamInfer's handler, for ``GrpcFrontend(streams=STREAMS)``."""
    return StreamInfer(router, metrics).handler()


STREAMS = {PATH: stream_infer_handler}
