"""Consul membership: the local agent's HTTP API through py-consul.

Calls (all with a deadline; ``X-Consul-Token`` when a token is given), made with
py-consul's ``consul.Consul`` (requests underneath):

* ``agent.service.register``, i.e. ``PUT /v1/agent/service/register?replace-existing-checks=true``:
  service ``<service>``, ID ``<service>-<peer name>``, Address/Port = the gRPC address,
  ``Meta`` = peer name, gRPC and REST addresses (``Tags`` carry ``grpc`` and ``rest``), and
  one TTL check registered passing, with ``DeregisterCriticalServiceAfter``.
* ``agent.check.ttl_pass``: ``PUT /v1/agent/check/pass/service:<id>`` every TTL/3 (sooner,
  with back-off, after a failure). A 404 (py-consul answers False) means the agent lost the
  registration (restarted without state): register again.
* ``agent.service.deregister``: ``PUT /v1/agent/service/deregister/<id>`` on ``deregister``.
* ``health.service(passing=True, index=N, wait=W)``: ``GET /v1/health/service/<service>``,
  blocking queries. ``X-Consul-Index`` is the next ``index``; per Consul's blocking-query
  guidance an index that goes backwards resets to 0 and one below 1 becomes 1. After any
  failure the next query starts from index 0 (answered at once), so a restarted agent is
  re-read immediately. A response with ``X-Consul-Results-Filtered-By-ACLs`` is treated
  as a failure (``_AclCheckedHttp``): the token cannot read every instance, and a partial
  set must not shrink the ring.

py-consul's calls block, so each runs in a thread of its own, off the event loop. A
daemon thread, not ``asyncio.to_thread``: a blocking query cannot be interrupted, and on
shutdown the watch is cancelled at once and the query's thread left to end by itself
(within ``wait_s`` and its jitter, its answer dropped) instead of holding up the
executor's shutdown, and so the process's exit, for up to ``wait_s``. Registration and
keep-alive use one client, the watch another; ``stop()`` closes both.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import consul
import requests
from consul import std

from tfscache.discovery import DiscoveryError, Peer, WatchingDiscovery, describe_error
from tfscache.tasks import cancel

log = logging.getLogger("tfscache.discovery.consul")

T = TypeVar("T")
_STATUS = {consul.ACLPermissionDenied: 403, consul.ACLDisabled: 401, consul.NotFound: 404}


class ConsulError(Exception):
    """A Consul call failed: unreachable, timed out, or answered with an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AclFiltered(consul.ConsulException):
    """A read answered with ``X-Consul-Results-Filtered-By-ACLs``: some instances are hidden."""


class _AclCheckedHttp(std.HTTPClient):
    """py-consul's requests client: a GET whose results ACLs filtered is an error; close() closes."""

    def get(self, callback, path, params=None, headers=None, raw=False):
        def checked(response):
            if response.headers.get("X-Consul-Results-Filtered-By-ACLs", "").lower() == "true":
                raise AclFiltered("results filtered by ACLs")
            return callback(response)
        return super().get(checked, path, params=params, headers=headers, raw=raw)

    def close(self) -> None:
        self.session.close()


class _Client(std.Consul):
    def http_connect(self, host, port, scheme, verify=True, cert=None):
        return _AclCheckedHttp(
            host, port, scheme, verify, cert, connections_timeout=self.connections_timeout
        )


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a new daemon thread; cancelling the await abandons the thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(outcome: tuple[bool, Any]) -> None:
        if not future.done():
            future.set_result(outcome[1]) if outcome[0] else future.set_exception(outcome[1])

    def work() -> None:
        try:
            outcome = (True, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop closed while this call ran: nobody is waiting
            pass

    threading.Thread(
        target=work, name=f"consul-{getattr(fn, '__name__', 'call')}", daemon=True
    ).start()
    return await future


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"  # Go's time.ParseDuration accepts "1.5s"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _status(exc: consul.ConsulException) -> int | None:
    """The HTTP status of a py-consul error: by its class, else its message's leading "400 "."""
    for kind, status in _STATUS.items():
        if isinstance(exc, kind):
            return status
    head = str(exc).split(" ", 1)[0]
    return int(head) if head.isdigit() else None


class ConsulDiscovery(WatchingDiscovery):
    """Registers with a Consul agent under a TTL check and follows the passing instances."""

    name = "consul"

    def __init__(
        self,
        address: str = "http://127.0.0.1:8500",
        service: str = "tfscache",
        token: str = "",
        ttl_s: float = 10.0,
        wait_s: float = 30.0,
        deregister_critical_after_s: float = 600.0,
        request_timeout_s: float = 5.0,
        **options,
    ) -> None:
        super().__init__(**options)
        self.address = (address if "://" in address else f"http://{address}").rstrip("/")
        self.service, self.token = service, token
        self.ttl_s, self.wait_s = ttl_s, wait_s
        self.deregister_critical_after_s = deregister_critical_after_s
        self.request_timeout_s = request_timeout_s
        self._registration: dict[str, Any] | None = None
        self._watch_state = self._state_log(f"watch of {service!r} at {self.address}", log)
        self._check_state = self._state_log(f"TTL check of {service!r} at {self.address}", log)
        self.index = 0  # the blocking-query index (exposed for tests and debugging)
        self._agent = self._client()    # registration, TTL passes, deregistration
        self._watcher = self._client()  # blocking queries

    # -- py-consul -------------------------------------------------------------------------

    def _client(self) -> _Client:
        url = urllib.parse.urlsplit(self.address)
        return _Client(host=url.hostname, port=url.port or 8500, scheme=url.scheme, verify=True,
                       connections_timeout=self.request_timeout_s)

    async def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` (a py-consul call) off the event loop; ConsulError names ``what`` and the status."""
        try:
            return await in_thread(fn, *args, token=self.token or None, **kwargs)
        except AclFiltered as exc:
            raise ConsulError(f"{what}: results filtered by ACLs: the token needs service:read and "
                              f"node:read on {self.service!r}", 403) from exc
        except consul.ConsulException as exc:
            status = _status(exc)
            body = (
                str(exc).split(" ", 1)[1]
                if status and str(exc).startswith(f"{status} ")
                else str(exc)
            )
            raise ConsulError(f"{what}: HTTP {status} {body.strip()!r}", status) from exc
        except (requests.RequestException, ValueError) as exc:
            raise ConsulError(f"{what}: {describe_error(exc)}") from exc

    async def stop(self) -> None:
        await super().stop()
        for client in (self._agent, self._watcher):
            client.http.close()

    # -- registration ------------------------------------------------------------------------

    def _service_id(self, peer: Peer) -> str:
        return f"{self.service}-{peer.name}"

    def _definition(self, peer: Peer) -> dict[str, Any]:
        """agent.service.register's arguments: the service and its TTL check, registered passing."""
        host, port = _split(peer.grpc)
        service_id = self._service_id(peer)
        check = consul.Check.ttl(_duration(self.ttl_s))
        check.update(
            CheckID=f"service:{service_id}",
            Name=f"tfscache sidecar {peer.name} alive",
            Status="passing",
            DeregisterCriticalServiceAfter=_duration(self.deregister_critical_after_s),
        )
        return {"name": self.service, "service_id": service_id, "address": host, "port": port,
                "tags": ["grpc", "rest"] if peer.rest else ["grpc"],
                "meta": {"peer": peer.name, "grpc": peer.grpc, "rest": peer.rest,
                         **({"tier": peer.tier} if peer.tier != "gpu" else {})},
                "check": check, "replace_existing_checks": True}

    async def _register_once(self) -> None:
        await self._call("register", self._agent.agent.service.register, **self._registration)

    async def register(self, peer: Peer) -> None:
        """Register (retrying until ``start_timeout_s``), then keep the TTL check passing."""
        await cancel(self._keepalive_task)
        self.label, self._registration = peer.name, self._definition(peer)
        backoff, give_up = self._backoff(), time.monotonic() + self.start_timeout_s
        while True:
            try:
                await self._register_once()
                break
            except ConsulError as exc:
                delay = backoff.next_delay()
                if exc.status in (400, 403) or time.monotonic() + delay > give_up:
                    raise DiscoveryError(
                        f"consul discovery: cannot register {peer.name}: {exc}"
                    ) from exc
                await asyncio.sleep(delay)
        log.info(
            "consul: registered %s as %s (TTL %s s)",
            peer.name,
            self._registration["service_id"],
            self.ttl_s,
        )
        self._keepalive_task = asyncio.create_task(
            self._keepalive(), name=f"consul-ttl-{peer.name}"
        )

    async def _keepalive(self) -> None:
        check_id = self._registration["check"]["CheckID"]
        interval, backoff = self.ttl_s / 3, self._backoff()
        while True:
            try:
                try:  # False: 404, the agent does not know the check
                    lost = not await self._call(
                        f"TTL pass of {check_id}", self._agent.agent.check.ttl_pass, check_id
                    )
                except ConsulError as exc:
                    lost = exc.status == 500 and "TTL" in str(exc)
                    if not lost:
                        raise
                if lost:
                    log.warning(
                        "consul: the agent lost %s's registration; registering again", self.label
                    )
                    self._hold_removals(self.ttl_s)
                    await self._register_once()
            except ConsulError as exc:
                self._check_state.failed(exc)
                self._hold_removals(self.ttl_s)
                await asyncio.sleep(min(backoff.next_delay(), interval))
                continue
            self._check_state.ok()
            backoff.reset()
            await asyncio.sleep(interval)

    async def deregister(self) -> None:
        await cancel(self._keepalive_task)
        self._keepalive_task = None
        if self._registration is None:
            return
        service_id, self._registration = self._registration["service_id"], None
        try:
            if not await self._call("deregister", self._agent.agent.service.deregister, service_id):
                raise ConsulError(f"deregister: {service_id} unknown to the agent (HTTP 404)", 404)
            log.info("consul: deregistered %s", service_id)
        except ConsulError as exc:  # the TTL check expires on its own
            log.warning(
                "consul: could not deregister %s (%s); its TTL check will expire", service_id, exc
            )

    # -- watch ----------------------------------------------------------------------------------

    def _peer(self, entry: dict[str, Any]) -> Peer:
        service = entry["Service"]
        meta = service.get("Meta") or {}
        host = service.get("Address") or entry["Node"]["Address"]
        return Peer(
            meta.get("peer") or service["ID"],
            meta.get("grpc") or _join(host, int(service["Port"])),
            meta.get("rest", ""),
            "host" if meta.get("tier") == "host" else "gpu",
        )

    async def _query(self) -> tuple[int, list[Peer]]:
        blocking = {"index": self.index, "wait": _duration(self.wait_s)} if self.index else {}
        index, entries = await self._call(
            f"health of {self.service!r}",
            self._watcher.health.service,
            self.service,
            passing=True,
            **blocking,
        )
        try:
            return int(index), [self._peer(entry) for entry in entries or ()]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConsulError(f"malformed health response: {describe_error(exc)}") from exc

    async def _watch(self) -> None:
        backoff, last = self._backoff(), 0.0
        while True:
            # Consul asks blocking-query loops to be rate limited: at most 20 queries a second.
            await asyncio.sleep(max(0.0, last + 0.05 - time.monotonic()))
            last = time.monotonic()
            try:
                index, peers = await self._query()
            except ConsulError as exc:
                self._watch_state.failed(exc)
                self.index = 0  # start over with a non-blocking read once it answers
                await asyncio.sleep(backoff.next_delay())
                continue
            self._watch_state.ok()
            backoff.reset()
            self.index = 0 if index < self.index else max(index, 1)
            await self._apply(peers)
