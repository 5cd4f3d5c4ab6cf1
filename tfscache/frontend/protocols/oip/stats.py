"""Model statistics gathered from every node that holds the model (ModelStatistics, ``.../stats``).

Triton counts per node; a model may be resident on several (replicas, or nodes that held it
in turn and still do). A statistics request that names a model is asked, without a lease,
of every local node whose cache holds it now, and the answers are merged:

* entries are matched by (name, version); each count and each duration (``count``, ``ns``)
  is summed: ``inference_count``, ``execution_count``, every ``inference_stats`` and
  ``response_stats`` entry, and ``batch_stats`` matched by ``batch_size``;
* ``last_inference`` is the latest of the nodes';
* ``memory_usage`` lists every node's entries, one after the other (devices of different
  nodes are different devices even where their ids are the same).

One node's answer is passed on unchanged. When no node holds the model, the request is
served as before: one node, under a lease, so the model loads (Triton's own answer,
zeros). A node that stopped holding it between the look and the answer (NOT_FOUND) or
that does not answer is left out.

Sidecar mode: a sidecar knows only its own node's cache, so it also asks every peer
sidecar, marked as forwarded (the peer serves it from its own node, never from its
peers: one hop) and as held-only (``HELD_ONLY_KEY``: the peer answers from its node if
that node holds the model now, else NOT_FOUND / 404, and never loads it). Peers are asked
in parallel, bounded by the request's deadline (``PEER_TIMEOUT_S`` when it has none); a
peer that fails or does not answer in time is left out and named in a warning, the request
itself does not fail. Peers' answers are merged with the local one as above.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time

from google.protobuf.json_format import MessageToDict, ParseDict

from tfscache import errors
from tfscache.frontend.backends import remaining
from tfscache.frontend.methods import RouteKey
from tfscache.frontend.router import Router
from tfscache.frontend.upstream import RestReply
from tfscache.wire import oip_stats_pb2

log = logging.getLogger("tfscache.frontend.protocols.oip.stats")

# gRPC metadata key / HTTP header: answer only if the node holds it
HELD_ONLY_KEY = "x-tfscache-held-only"
PEER_TIMEOUT_S = 30.0  # how long peers are asked when the request has no deadline
_KEYED_LISTS = {"batch_stats": "batch_size"}


def merge(answers: list[dict]) -> dict:
    """ModelStatisticsResponses (as dicts, Triton's JSON field names) merged as the docstring says."""
    merged: dict[tuple, dict] = {}
    for answer in answers:
        for stats in answer.get("model_stats", []):
            key = (stats.get("name", ""), str(stats.get("version", "")))
            merged[key] = (
                copy.deepcopy(stats) if key not in merged else _merge_model(merged[key], stats)
            )
    return {"model_stats": list(merged.values())}


def _merge_model(into: dict, other: dict) -> dict:
    for field, value in other.items():
        if field in ("name", "version"):
            continue
        if field == "last_inference":
            into[field] = max(int(into.get(field, 0)), int(value))
        elif field == "memory_usage":
            into[field] = [*into.get(field, []), *copy.deepcopy(value)]
        elif field in _KEYED_LISTS:
            into[field] = _merge_keyed(into.get(field, []), value, _KEYED_LISTS[field])
        else:
            into[field] = _sum(into.get(field), value)
    return into


def _merge_keyed(into: list, other: list, key: str) -> list:
    by_key = {str(item.get(key)): item for item in into}
    for item in other:
        found = by_key.get(str(item.get(key)))
        if found is None:
            into.append(by_key.setdefault(str(item.get(key)), copy.deepcopy(item)))
        else:
            for field, value in item.items():
                if field != key:
                    found[field] = _sum(found.get(field), value)
    return into


def _sum(into, other):
    if into is None:
        return copy.deepcopy(other)
    if isinstance(other, dict):
        return {field: _sum(into.get(field), other[field]) if field in other else into[field]
                for field in {**into, **other}}
    return int(into) + int(other)


def _holders(router: Router, key: RouteKey, forwarded: bool) -> list:
    """The backends whose own cache holds ``key`` now (a peer sidecar never says it does)."""
    backends = (
        [router.backends[router.local]] if forwarded and router.local else router.backends.values()
    )
    return [b for b in backends if b.upstream is not None and b.holds(key)]


def _peers(router: Router, forwarded: bool) -> list:
    """Sidecar mode, a request not forwarded: every peer sidecar (each answers for its own node)."""
    if forwarded or router.local is None:
        return []
    return [b for name, b in router.backends.items() if name != router.local]


def is_held_only(pairs) -> bool:
    """Whether gRPC metadata pairs (or HTTP header names) carry ``HELD_ONLY_KEY``."""
    return any((k[0] if isinstance(k, tuple) else k).lower() == HELD_ONLY_KEY for k in pairs)


async def _gather(holders: list, ask) -> list:
    answers = await asyncio.gather(*(ask(b.upstream) for b in holders), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(
            answer, (errors.NotFound, errors.Unavailable, errors.DeadlineExceeded)
        ):
            raise answer
    return [a for a in answers if not isinstance(a, BaseException)]


async def _gather_peers(peers: list, ask) -> list:
    """Each peer's answer; a peer whose node does not hold the model (NOT_FOUND) is left out
    quietly, one that fails otherwise is left out and named in a warning."""
    answers = await asyncio.gather(*(ask(peer) for peer in peers), return_exceptions=True)
    kept = []
    for peer, answer in zip(peers, answers):
        if isinstance(answer, errors.NotFound):
            continue
        if isinstance(answer, Exception):
            log.warning("statistics: peer %s left out of the merged answer: %s", peer.name,
                        getattr(answer, "message", None) or repr(answer))
        elif isinstance(answer, BaseException):
            raise answer
        else:
            kept.append(answer)
    return kept


def _merged_grpc(answers: list[bytes]) -> bytes:
    if len(answers) == 1:
        return answers[0]
    dicts = [
        MessageToDict(
            oip_stats_pb2.ModelStatisticsResponse.FromString(a), preserving_proto_field_name=True
        )
        for a in answers
    ]
    return ParseDict(merge(dicts), oip_stats_pb2.ModelStatisticsResponse()).SerializeToString()


async def grpc_statistics(router: Router, path: str, key: RouteKey | None, request: bytes, metadata,
                          deadline: float | None, forwarded: bool) -> bytes:
    """ModelStatistics' ``Method.send``: every holding node's answer, merged."""
    held_only = forwarded and is_held_only(metadata)
    holders = [] if key is None else _holders(router, key, forwarded)
    peers = [] if key is None else _peers(router, forwarded)
    peer_deadline = deadline if deadline is not None else time.monotonic() + PEER_TIMEOUT_S
    asked = (*(k for k in metadata if k[0] != HELD_ONLY_KEY), (HELD_ONLY_KEY, "1"))

    async def ask_peer(peer) -> bytes:
        return await peer.grpc(key, path, request, asked, peer_deadline)

    local, remote = await asyncio.gather(
        _gather(
            holders,
            lambda upstream: upstream.unary(
                path, request, metadata=metadata, timeout=remaining(deadline)
            ),
        ),
        _gather_peers(peers, ask_peer),
    )
    answers = [*local, *remote]
    if answers:
        return _merged_grpc(answers)
    if held_only:
        raise errors.NotFound(
            f"model '{key.name if key else ''}' is not held by this sidecar's node"
        )
    return await router.grpc(path, key, request, metadata, deadline, forwarded)


async def rest_statistics(
    router: Router,
    key: RouteKey,
    path_qs: str,
    headers: dict[str, str],
    timeout: float,
    forwarded: bool,
    held_only: bool = False,
) -> RestReply:
    """``GET .../stats``: every holding node's answer, merged (Triton's JSON)."""
    deadline = time.monotonic() + timeout

    async def ask(upstream) -> RestReply:
        reply = await upstream.rest(
            "GET", path_qs, b"", headers, timeout=max(0.001, deadline - time.monotonic())
        )
        if reply.status != 200:
            raise errors.NotFound(reply.body[:200].decode("utf-8", "replace"))
        return reply

    async def ask_peer(peer) -> RestReply:
        reply = await peer.rest(key, "GET", path_qs, b"", {**headers, HELD_ONLY_KEY: "1"},
                                max(0.001, deadline - time.monotonic()))
        if reply.status == 404:
            raise errors.NotFound(reply.body[:200].decode("utf-8", "replace"))
        if reply.status != 200:
            raise errors.Unavailable(
                f"HTTP {reply.status}: {reply.body[:200].decode('utf-8', 'replace')}"
            )
        return reply

    holders = _holders(router, key, forwarded)
    local, remote = await asyncio.gather(
        _gather(holders, ask), _gather_peers(_peers(router, forwarded), ask_peer)
    )
    answers = [*local, *remote]
    if len(answers) == 1:
        return answers[0]
    if answers:
        body = json.dumps(
            merge([json.loads(a.body) for a in answers]), separators=(",", ":")
        ).encode()
        return RestReply(200, body, "application/json")
    if held_only and forwarded:
        raise errors.NotFound(f"model '{key.name}' is not held by this sidecar's node")
    return await router.rest(key, "GET", path_qs, b"", headers, timeout, forwarded=forwarded)
