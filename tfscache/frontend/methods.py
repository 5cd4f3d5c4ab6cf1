"""What the front ends know of a gRPC method: its routing key, read from request bytes.

A protocol (tfscache.frontend.protocols.*) lists its methods as ``Method`` rows. Only the
head of a request is decoded, through small wire-compatible messages (``select_fields``,
``field_one``): the tensors are never copied. The request bytes themselves are forwarded
unchanged, except where a method rewrites version labels into versions (``with_versions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from google.protobuf.message import DecodeError

from tfscache import errors
from tfscache.frontend.probe import ProbeAnswer


@dataclass(frozen=True)
class RouteKey:
    """What routing needs from a request: the model name and the version asked for."""

    name: str
    version: int | None = None
    label: str | None = None


def records(request: bytes):
    """(field number, wire type, record start, payload start, record end) of each top-level field,
    in order; payloads are skipped unread."""
    view, pos, end = memoryview(request), 0, len(request)
    while pos < end:
        start = pos
        tag, pos = varint(view, pos)
        field, wire_type = tag >> 3, tag & 7
        payload = pos
        if wire_type == 0:
            _, pos = varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            size, payload = varint(view, pos)
            pos = payload + size
        elif wire_type == 5:
            pos += 4
        else:  # groups (3, 4) do not occur in these messages; 6 and 7 are invalid
            raise DecodeError(f"unexpected wire type {wire_type}")
        if field == 0 or pos > end:
            raise DecodeError("truncated or invalid message")
        yield field, wire_type, start, payload, pos


def field_one(request: bytes) -> list[memoryview]:
    """The payloads of every occurrence of length-delimited field 1, other fields skipped unread.

    Parsing the whole request would copy every other field (the tensors: up to the message
    size limit) into the parsed message's unknown fields; only the ModelSpec is needed.
    """
    view = memoryview(request)
    return [view[payload:end] for field, wire_type, _, payload, end in records(request)
            if field == 1 and wire_type == 2]


def select_fields(request: bytes, fields: frozenset[int]) -> bytes:
    """The records of ``fields`` only (tags included, in order): a message a small head message
    parses as it would the whole request, without copying the fields it skips (the tensors)."""
    view = memoryview(request)
    return b"".join(
        view[start:end] for field, _, start, _, end in records(request) if field in fields
    )


def varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise DecodeError("truncated varint")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


LabelResolver = Callable[[str, str], int]  # (model name, label) -> version; raises TfscacheError


@dataclass(frozen=True)
class Method:
    """One RPC: its full path and the functions reading its routing key from request bytes
    and replacing its version labels by versions."""

    path: str
    request_type: str
    read_key: Callable[[bytes], RouteKey | None]
    rewrite: Callable[[bytes, LabelResolver], bytes] | None = None  # None: labels are ignored
    # For a node that words its own "unknown model" errors (Triton): when the repository has no
    # such model, the request goes to a node without a lease for the node's answer; this error
    # when no node answers. None (TF Serving): the cache's error is the answer.
    unknown: Callable[[RouteKey], errors.TfscacheError] | None = None
    # A status probe (tfscache.frontend.probe): a version not on its node is answered with this
    # wording of the probe's rule, without loading it. None: not a probe.
    probe: Callable[[ProbeAnswer], bytes] | None = None
    # A method with its own texts for a model the repository lacks (TF Serving's GetModelStatus).
    not_found: Callable[[RouteKey], errors.TfscacheError] | None = None
    # How the request is answered, when not by ``Router.grpc`` (one node under a lease):
    # ``send(router, path, key, request, metadata, deadline, forwarded)`` -> response bytes.
    send: Callable[..., Awaitable[bytes]] | None = None
    # For such a node: the answer (an error, or response bytes) when the repository has the model but
    # not the version asked for, as that node kind answers while it serves the model. None: as above.
    unknown_version: Callable[[RouteKey], errors.TfscacheError | bytes] | None = None

    def route_key(self, request: bytes) -> RouteKey | None:
        """The request's RouteKey; None when it names no model (the node then reports TF's error)."""
        try:
            return self.read_key(request)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"Failed to parse request as {self.request_type}") from exc

    def with_versions(
        self, request: bytes, key: RouteKey, resolve: LabelResolver
    ) -> tuple[RouteKey, bytes]:
        """For a request naming a version label: its key and bytes with the label's version instead.

        Any other request (and GetModelStatus, which ignores labels as TF Serving does)
        comes back as it is, its bytes untouched.
        """
        if key is None or key.label is None or self.rewrite is None:
            return key, request
        version = resolve(key.name, key.label)

        # the bytes name the version the key routes to
        def resolve_once(name: str, label: str) -> int:
            return version if (name, label) == (key.name, key.label) else resolve(name, label)

        try:
            request = self.rewrite(request, resolve_once)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"Failed to parse request as {self.request_type}") from exc
        return RouteKey(key.name, version=version), request
