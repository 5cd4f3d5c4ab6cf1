"""Consul membership: the local agent's HTTP API, spoken directly with aiohttp.

Calls (all with a deadline; ``X-Consul-Token`` when a token is given):

* ``PUT /v1/agent/service/register?replace-existing-checks=true``: service ``<service>``,
  ID ``<service>-<peer name>``, Address/Port = the gRPC address, ``Meta`` = peer name,
  gRPC and REST addresses (``Tags`` carry ``grpc`` and ``rest``), and one TTL check
  registered passing, with ``DeregisterCriticalServiceAfter``.
* ``PUT /v1/agent/check/pass/service:<id>`` every TTL/3 (sooner, with back-off, after a
  failure). A 404 means the agent lost the registration (restarted without state):
  register again.
* ``PUT /v1/agent/service/deregister/<id>`` on ``deregister``.
* ``GET /v1/health/service/<service>?passing=true&index=N&wait=Ws``: blocking queries.
  ``X-Consul-Index`` is the next ``index``; per Consul's blocking-query guidance an index
  that goes backwards resets to 0 and one below 1 becomes 1. After any failure the next
  query starts from index 0 (answered at once), so a restarted agent is re-read
  immediately. A response with ``X-Consul-Results-Filtered-By-ACLs`` is treated as a
  failure: the token cannot read every instance, and a partial set must not shrink the ring.

py-consul 1.8.0 covers the same endpoints, but its asyncio adapter builds its aiohttp
connector with arguments aiohttp 3.14 deprecates (``verify_ssl``, ``ssl_context``) and
offers no per-call deadline, so the handful of calls is made here directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp

from tfscache.discovery import DiscoveryError, Peer, WatchingDiscovery, cancel, describe_error

log = logging.getLogger("tfscache.discovery.consul")


class ConsulError(Exception):
    """A Consul call failed: unreachable, timed out, or answered with an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"  # Go's time.ParseDuration accepts "1.5s"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ConsulDiscovery(WatchingDiscovery):
    """Registers with a Consul agent under a TTL check and follows the passing instances."""

    name = "consul"

    def __init__(self, address: str = "http://127.0.0.1:8500", service: str = "tfscache", token: str = "",
                 ttl_s: float = 10.0, wait_s: float = 30.0, deregister_critical_after_s: float = 600.0,
                 request_timeout_s: float = 5.0, **options) -> None:
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

    # -- HTTP ------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"X-Consul-Token": self.token} if self.token else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    async def _call(self, method: str, path: str, *, params: dict | None = None, body: Any = None,
                    timeout: float | None = None) -> tuple[int, Any, Any]:
        """(status, headers, decoded JSON or text); ConsulError unless 2xx."""
        deadline = aiohttp.ClientTimeout(total=timeout or self.request_timeout_s)
        try:
            async with self._http().request(method, self.address + path, params=params, json=body,
                                            timeout=deadline) as resp:
                text = await resp.text()
                if resp.status >= 300:
                    raise ConsulError(f"{method} {path}: HTTP {resp.status} {text.strip()!r}", resp.status)
                is_json = resp.content_type == "application/json" and text
                return resp.status, resp.headers, json.loads(text) if is_json else text
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise ConsulError(f"{method} {path}: {describe_error(exc)}") from exc

    # -- registration ------------------------------------------------------------------------

    def _service_id(self, peer: Peer) -> str:
        return f"{self.service}-{peer.name}"

    def _definition(self, peer: Peer) -> dict[str, Any]:
        host, port = _split(peer.grpc)
        service_id = self._service_id(peer)
        meta = {"peer": peer.name, "grpc": peer.grpc, "rest": peer.rest}
        return {
            "ID": service_id, "Name": self.service, "Address": host, "Port": port,
            "Tags": ["grpc", "rest"] if peer.rest else ["grpc"], "Meta": meta,
            "Check": {"CheckID": f"service:{service_id}", "Name": f"tfscache sidecar {peer.name} alive",
                      "TTL": _duration(self.ttl_s), "Status": "passing",
                      "DeregisterCriticalServiceAfter": _duration(self.deregister_critical_after_s)},
        }

    async def _register_once(self) -> None:
        await self._call("PUT", "/v1/agent/service/register", params={"replace-existing-checks": "true"},
                         body=self._registration)

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
                    raise DiscoveryError(f"consul discovery: cannot register {peer.name}: {exc}") from exc
                await asyncio.sleep(delay)
        log.info("consul: registered %s as %s (TTL %s s)", peer.name, self._registration["ID"], self.ttl_s)
        self._keepalive_task = asyncio.create_task(self._keepalive(), name=f"consul-ttl-{peer.name}")

    async def _keepalive(self) -> None:
        check_id = self._registration["Check"]["CheckID"]
        interval, backoff = self.ttl_s / 3, self._backoff()
        while True:
            try:
                try:
                    await self._call("PUT", f"/v1/agent/check/pass/{check_id}")
                except ConsulError as exc:
                    lost = exc.status == 404 or (exc.status == 500 and "TTL" in str(exc))
                    if not lost:
                        raise
                    log.warning("consul: the agent lost %s's registration; registering again", self.label)
                    await self._register_once()
            except ConsulError as exc:
                self._check_state.failed(exc)
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
        service_id, self._registration = self._registration["ID"], None
        try:
            await self._call("PUT", f"/v1/agent/service/deregister/{service_id}")
            log.info("consul: deregistered %s", service_id)
        except ConsulError as exc:  # the TTL check expires on its own
            log.warning("consul: could not deregister %s (%s); its TTL check will expire", service_id, exc)

    # -- watch ----------------------------------------------------------------------------------

    def _peer(self, entry: dict[str, Any]) -> Peer:
        service = entry["Service"]
        meta = service.get("Meta") or {}
        host = service.get("Address") or entry["Node"]["Address"]
        return Peer(meta.get("peer") or service["ID"], meta.get("grpc") or _join(host, int(service["Port"])),
                    meta.get("rest", ""))

    async def _query(self) -> tuple[int, list[Peer]]:
        params = {"passing": "true"}
        if self.index:
            params.update(index=str(self.index), wait=_duration(self.wait_s))
        # Consul adds up to wait/16 to spread wake-ups; the deadline allows for it.
        timeout = self.wait_s * 17 / 16 + self.request_timeout_s if self.index else None
        _, headers, entries = await self._call("GET", f"/v1/health/service/{self.service}", params=params,
                                               timeout=timeout)
        if headers.get("X-Consul-Results-Filtered-By-ACLs", "").lower() == "true":
            raise ConsulError("results filtered by ACLs: the token needs service:read and node:read on "
                              f"{self.service!r}", 403)
        try:
            index = int(headers["X-Consul-Index"])
            return index, [self._peer(entry) for entry in entries]
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
