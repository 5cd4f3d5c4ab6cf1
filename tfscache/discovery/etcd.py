"""etcd membership: etcd v3's JSON gRPC gateway over HTTP, spoken with aiohttp.

Each sidecar owns the key ``<prefix>/<service>/<peer name>``, whose value is
``{"name", "grpc", "rest"}`` as JSON, attached to a lease of ``ttl_s`` seconds that a
background task keeps alive every TTL/3 (``/v3/lease/keepalive``). A keep-alive that
finds the lease gone (TTL 0: it expired during an outage) grants a new lease and
writes the key again. ``deregister`` revokes the lease, which deletes the key.

Following the membership: ``/v3/kv/range`` over the prefix, then ``/v3/watch`` from
that read's revision + 1 as a streaming response (one JSON object per line); a
broken, cancelled or compacted watch is followed by a fresh read and a new watch.

Several endpoints (one per cluster member) may be given: every call starts at the
endpoint that last answered and moves on to the next when one is unreachable, times
out or answers 5xx. Requests carry gRPC metadata ``hasleader=true`` (the gateway
forwards ``Grpc-Metadata-*`` headers), as etcd's own client does for watches, so a
member cut off from its leader cancels the watch instead of leaving it silent.

Keys and values travel base64-encoded; 64-bit integers (revisions, lease IDs) as strings.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Sequence

import aiohttp

from tfscache.discovery import DiscoveryError, Peer, WatchingDiscovery, describe_error
from tfscache.tasks import cancel

log = logging.getLogger("tfscache.discovery.etcd")


class EtcdError(Exception):
    """An etcd call failed on every endpoint, or was answered with an error."""


class _Unreachable(EtcdError):
    """This endpoint did not answer usefully (connection, timeout, 5xx): try the next."""


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(data: str) -> bytes:
    return base64.b64decode(data)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key starting with ``prefix`` (etcd's range_end for a prefix)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class EtcdDiscovery(WatchingDiscovery):
    """Registers under a leased key in etcd and watches the prefix for the others."""

    name = "etcd"

    def __init__(
        self,
        endpoints: Sequence[str] | str = ("http://127.0.0.1:2379",),
        prefix: str = "/tfscache",
        service: str = "tfscache",
        ttl_s: float = 10.0,
        request_timeout_s: float = 5.0,
        **options,
    ) -> None:
        super().__init__(**options)
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e]
        if not endpoints:
            raise ValueError("etcd discovery needs at least one endpoint")
        self.endpoints = [(e if "://" in e else f"http://{e}").rstrip("/") for e in endpoints]
        self.key_prefix = f"{prefix.rstrip('/')}/{service}/".encode()
        self.ttl_s = max(1, round(ttl_s))  # etcd leases are whole seconds
        self.request_timeout_s = request_timeout_s
        self._current = 0
        self._self: Peer | None = None
        self._lease: str | None = None
        self._written = False  # this sidecar's key is written under self._lease
        self._watch_state = self._state_log(f"watch of {self.key_prefix.decode()!r}", log)
        self._lease_state = self._state_log("lease keep-alive", log)

    # -- HTTP ---------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"Grpc-Metadata-hasleader": "true"},
                                                  read_bufsize=1 << 22)
        return self._session

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._current + i) % n for i in range(n)]

    async def _post_one(self, endpoint: str, path: str, body: dict) -> dict:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with self._http().post(endpoint + path, json=body, timeout=timeout) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _Unreachable(f"{endpoint}{path}: {describe_error(exc)}") from exc
        if resp.status >= 500:
            raise _Unreachable(f"{endpoint}{path}: HTTP {resp.status} {text.strip()[:200]!r}")
        try:
            reply = json.loads(text.splitlines()[0]) if text.strip() else {}
        except ValueError as exc:
            raise _Unreachable(f"{endpoint}{path}: not JSON: {text[:200]!r}") from exc
        if resp.status >= 300 or "error" in reply:
            raise EtcdError(
                f"{endpoint}{path}: HTTP {resp.status} {reply.get('message') or reply.get('error')}"
            )
        return reply.get("result", reply)  # streaming endpoints wrap each message in "result"

    async def _post(self, path: str, body: dict) -> dict:
        """POST to the first endpoint that answers, starting with the last one that did."""
        errors = []
        for i in self._order():
            try:
                reply = await self._post_one(self.endpoints[i], path, body)
            except _Unreachable as exc:
                errors.append(str(exc))
                continue
            self._current = i
            return reply
        raise EtcdError("no etcd endpoint answered: " + "; ".join(errors))

    # -- registration -------------------------------------------------------------------------

    def _key(self, peer: Peer) -> bytes:
        return self.key_prefix + peer.name.encode()

    async def _put_self(self) -> None:
        """Grant a lease if there is none, and write this sidecar's key under it."""
        if self._lease is None:
            self._written = False
            reply = await self._post("/v3/lease/grant", {"TTL": self.ttl_s})
            self._lease = str(reply["ID"])
        entry = {"name": self._self.name, "grpc": self._self.grpc, "rest": self._self.rest}
        if self._self.tier != "gpu":  # a host-tier sidecar says so (docs/tiers.md)
            entry["tier"] = self._self.tier
        value = json.dumps(entry)
        try:
            await self._post(
                "/v3/kv/put",
                {"key": _b64(self._key(self._self)), "value": _b64(value), "lease": self._lease},
            )
        except EtcdError:
            # The lease may be gone by the next try (a put that timed out, tried again after the TTL:
            # "requested lease not found" for ever). Grant a new one then; an unused lease expires by itself.
            self._lease = None
            raise
        self._written = True

    async def register(self, peer: Peer) -> None:
        """Write the leased key (retrying until ``start_timeout_s``), then keep the lease alive."""
        await cancel(self._keepalive_task)
        self.label, self._self = peer.name, peer
        backoff, give_up = self._backoff(), time.monotonic() + self.start_timeout_s
        while True:
            try:
                await self._put_self()
                break
            except (EtcdError, KeyError) as exc:
                delay = backoff.next_delay()
                if time.monotonic() + delay > give_up:
                    raise DiscoveryError(
                        f"etcd discovery: cannot register {peer.name}: {exc}"
                    ) from exc
                await asyncio.sleep(delay)
        log.info(
            "etcd: registered %s under lease %s (TTL %s s)", peer.name, self._lease, self.ttl_s
        )
        self._keepalive_task = asyncio.create_task(
            self._keepalive(), name=f"etcd-lease-{peer.name}"
        )

    async def _keepalive(self) -> None:
        interval, backoff = self.ttl_s / 3, self._backoff()
        while True:
            try:
                if self._lease is None or not self._written:  # a re-registration was cut short
                    await self._put_self()
                else:
                    reply = await self._post("/v3/lease/keepalive", {"ID": self._lease})
                    if int(reply.get("TTL", 0)) <= 0:
                        log.warning(
                            "etcd: lease %s of %s expired; registering again",
                            self._lease,
                            self.label,
                        )
                        self._hold_removals(self.ttl_s)  # the others' leases may have expired too
                        self._lease = None
                        await self._put_self()
            except (EtcdError, KeyError, ValueError) as exc:
                self._lease_state.failed(exc)
                self._hold_removals(self.ttl_s)
                await asyncio.sleep(min(backoff.next_delay(), interval))
                continue
            self._lease_state.ok()
            backoff.reset()
            await asyncio.sleep(interval)

    async def deregister(self) -> None:
        await cancel(self._keepalive_task)
        self._keepalive_task = None
        lease, self._lease, self._self = self._lease, None, None
        if lease is None:
            return
        try:
            await self._post("/v3/lease/revoke", {"ID": lease})
            log.info("etcd: deregistered %s (revoked lease %s)", self.label, lease)
        except EtcdError as exc:  # the lease expires on its own
            log.warning(
                "etcd: could not revoke lease %s of %s (%s); it will expire", lease, self.label, exc
            )

    # -- watch ----------------------------------------------------------------------------------

    def _decode(self, kv: dict) -> Peer | None:
        try:
            name = _unb64(kv["key"])[len(self.key_prefix):].decode()
            value = json.loads(_unb64(kv["value"]))
            return Peer(name, str(value["grpc"]), str(value.get("rest", "")),
                        "host" if value.get("tier") == "host" else "gpu")
        except (KeyError, ValueError, TypeError) as exc:
            log.debug("etcd: ignoring malformed entry %r: %r", kv, exc)
            return None

    async def _read(self) -> tuple[int, dict[str, Peer]]:
        reply = await self._post("/v3/kv/range", {"key": _b64(self.key_prefix),
                                                  "range_end": _b64(prefix_end(self.key_prefix))})
        peers = {p.name: p for p in map(self._decode, reply.get("kvs", [])) if p is not None}
        return int(reply["header"]["revision"]), peers

    async def _follow(self, revision: int, peers: dict[str, Peer]) -> None:
        """Stream watch events into ``peers`` until the watch breaks (EtcdError)."""
        request = {
            "create_request": {
                "key": _b64(self.key_prefix),
                "range_end": _b64(prefix_end(self.key_prefix)),
                "start_revision": str(revision + 1),
            }
        }
        endpoint = self.endpoints[self._current]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout_s)
        try:
            async with self._http().post(
                endpoint + "/v3/watch", json=request, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raise _Unreachable(
                        f"{endpoint}/v3/watch: HTTP {resp.status} {(await resp.text())[:200]!r}"
                    )
                async for line in resp.content:
                    if line.strip():
                        await self._on_watch_message(json.loads(line), peers)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise _Unreachable(f"{endpoint}/v3/watch: {describe_error(exc)}") from exc
        raise _Unreachable(f"{endpoint}/v3/watch: stream closed")

    async def _on_watch_message(self, message: dict, peers: dict[str, Peer]) -> None:
        if "error" in message:
            raise EtcdError(f"watch error: {message['error']}")
        result = message.get("result", {})
        if result.get("canceled") or result.get("compact_revision"):
            raise EtcdError(f"watch cancelled: {result.get('cancel_reason') or 'compacted'}")
        if result.get("created"):
            self._watch_state.ok()
        for event in result.get("events", []):
            name = _unb64(event["kv"]["key"])[len(self.key_prefix):].decode()
            if event.get("type") == "DELETE":  # PUT is the enum's zero value, so JSON omits it
                peers.pop(name, None)
            elif (peer := self._decode(event["kv"])) is not None:
                peers[name] = peer
        if result.get("events"):
            await self._apply(peers.values())

    async def _watch(self) -> None:
        backoff = self._backoff()
        while True:
            try:
                revision, peers = await self._read()
                await self._apply(peers.values())
                backoff.reset()
                await self._follow(revision, peers)
            except EtcdError as exc:
                self._watch_state.failed(exc)
                if isinstance(exc, _Unreachable):
                    self._current = (self._current + 1) % len(self.endpoints)
                await asyncio.sleep(backoff.next_delay())
