"""ServerMetadata as tfscache serves it: the node's answer, less the extensions not served here.

A node advertises its protocol extensions (Triton: ``model_repository``, shared memory, trace,
logging; see ``src/grpc/grpc_server.cc`` and ``src/http_server.cc`` in triton-inference-server's
server repository). Through tfscache the repository API is refused and shared memory, trace and
log settings are not served (``protocols/oip/methods``), so a client that reads the list to pick
a code path must not see them. Every other extension (binary tensors, statistics, parameters,
classification, sequence, ...) is the node's and stays, in the node's order.
"""

from __future__ import annotations

import json

from tfscache import errors
from tfscache.frontend.methods import RouteKey

UNSERVED_EXTENSIONS = frozenset({
    "model_repository",
    "model_repository(unload_dependents)",
    "system_shared_memory",
    "cuda_shared_memory",
    "trace",
    "logging",
})
_EXTENSIONS_FIELD = 3  # ServerMetadataResponse: name = 1, version = 2, repeated extensions = 3


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise errors.Internal("a node sent a ServerMetadataResponse that does not parse")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def served_grpc(response: bytes) -> bytes:
    """A ServerMetadataResponse's bytes without the unserved extensions (other fields as sent)."""
    kept, at = bytearray(), 0
    while at < len(response):
        start = at
        tag, at = _varint(response, at)
        if tag & 7 != 2:  # every field of ServerMetadataResponse is a string
            raise errors.Internal("a node sent a ServerMetadataResponse that does not parse")
        size, at = _varint(response, at)
        end = at + size
        if end > len(response):
            raise errors.Internal("a node sent a ServerMetadataResponse that does not parse")
        value = response[at:end]
        at = end
        name = value.decode("utf-8", "replace")
        if tag >> 3 == _EXTENSIONS_FIELD and name in UNSERVED_EXTENSIONS:
            continue
        kept += response[start:end]
    return bytes(kept)


def served_rest(body: bytes) -> bytes:
    """GET /v2's JSON without the unserved extensions; a body that is not that JSON is kept."""
    try:
        document = json.loads(body)
    except ValueError:
        return body
    if not isinstance(document, dict) or not isinstance(document.get("extensions"), list):
        return body
    document["extensions"] = [
        e for e in document["extensions"] if e not in UNSERVED_EXTENSIONS]
    return json.dumps(document, separators=(",", ":")).encode()


async def grpc_server_metadata(router, path: str, key: RouteKey | None, request: bytes, metadata,
                               deadline: float | None, forwarded: bool) -> bytes:
    """ServerMetadata's ``Method.send``: a node's answer, less the unserved extensions."""
    return served_grpc(await router.grpc(path, key, request, metadata, deadline, forwarded))
