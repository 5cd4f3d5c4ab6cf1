"""A FAKE Consul agent for tests: only the HTTP endpoints tfscache calls, nothing else.

No Consul agent can be installed on the build machines, so the Consul discovery
backend (tfscache/discovery/consul.py) is tested against this aiohttp app instead.
It is not Consul. It models one agent on one node (``fake-node``, address
127.0.0.1, its ``serfHealth`` check always passing) with its catalog in memory, and
follows Consul's documented behaviour for exactly these endpoints:

* Request bodies are decoded as Consul decodes them: field names match whatever their
  case, and snake_case spellings too (Go's encoding/json matches names case-insensitively,
  and Consul translates snake_case keys), so ``{"name": ..., "checks": [{"ttl": ...}]}``, what
  py-consul sends, is ``{"Name": ..., "Checks": [{"TTL": ...}]}``. ``Meta`` keys are data, kept
  as sent.
* ``PUT /v1/agent/service/register[?replace-existing-checks]``: ``Name`` required (400
  "Missing service name"), ``ID`` defaults to ``Name``, ``Address``, ``Port``, ``Tags``,
  ``Meta`` (keys checked as Consul does), one ``Check`` or a ``Checks`` list of TTL checks
  (``CheckID`` defaults to ``service:<ID>``, or ``service:<ID>:<n>`` for several; ``Name``
  to ``Service '<name>' check``; ``Status`` to ``critical``); re-registering an ID replaces
  the service; with ``replace-existing-checks`` its checks missing from the new
  definition are removed.
* ``PUT /v1/agent/service/deregister/<id>``: removes the service and its checks; 404
  ``Unknown service ID "<id>". Ensure that the service ID is passed, not the service name.``
* ``PUT /v1/agent/check/pass|warn|fail/<id>[?note=]``: sets the status and output and
  restarts the TTL; 404 ``Unknown check ID "<id>". ...`` for an unknown check.
* TTL expiry: a check not updated within its TTL turns ``critical`` with output
  ``TTL expired``. ``DeregisterCriticalServiceAfter``: a service whose check stays
  critical that long is deregistered by a reaper; as in Consul the timeout is at least
  one minute and the reaper runs every 30 s (both adjustable here, for tests:
  ``deregister_minimum_s``, ``reap_interval_s``).
* ``GET /v1/health/service/<name>[?passing][&index=N&wait=D]``: one entry per instance
  (``Node``, ``Service``, ``Checks``: the node's check and the service's), ``passing``
  keeps only instances whose every check is passing; ``X-Consul-Index`` is the index of
  the last change to that service (the catalog's index for an unknown service);
  ``X-Consul-KnownLeader``, ``X-Consul-LastContact``. With ``index`` > 0 the request
  blocks until the index moves past it (any register, deregister or status change of
  the service; a TTL pass that changes nothing does not count) or ``wait`` passes
  (default 5m, at most 10m, plus up to wait/16 of jitter), then answers with the
  current state. A bad index is 400 "Invalid index"; a bad wait is 400.
* ACLs: with ``acl_token`` set, the token comes from ``X-Consul-Token``, ``Authorization:
  Bearer`` or ``?token=``. An unknown token is 403 ``ACL not found`` on every endpoint. No
  token means the anonymous token with default deny: writes are 403 ``Permission denied``,
  and the health read answers 200 with the instances filtered out and
  ``X-Consul-Results-Filtered-By-ACLs: true``.
* Outages: ``stop()`` closes the listener and drops open connections (blocking queries
  in flight see the connection close, as when an agent dies); ``start()`` listens again
  on the same port. The state survives (an agent with a data dir restores its services
  and checks), with TTL timers restarting from the restart; ``start(reset=True)`` starts
  empty with the index back at 1, as a dev-mode agent does.

Not modelled: datacenters, namespaces, other check kinds, ``/v1/catalog``, anti-entropy,
KV, sessions, and the rest of Consul.

    consul = FakeConsul(acl_token="s3cret")
    await consul.start()        # -> port; consul.url == "http://127.0.0.1:<port>"
    await consul.stop()         # outage
    await consul.start()        # back, same port

``python -m fakes.consul [--port N] [--token T]`` (from tests/) runs it on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from typing import Any

from aiohttp import web

_DURATION = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_META_KEY = re.compile(r"^[a-zA-Z0-9_-]+$")
NODE = "fake-node"
ANONYMOUS = web.RequestKey("anonymous", bool)


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration for what Consul accepts ("10s", "1.5s", "1m30s"); ValueError otherwise."""
    text = str(text).strip()
    if text in ("0", ""):
        return 0.0
    parts = _DURATION.findall(text)
    if not parts or "".join(p[0] for p in parts) != text:
        raise ValueError(f"time: invalid duration {text!r}")
    return sum(float(p[0][: -len(p[1])]) * _UNITS[p[1]] for p in parts)


class FakeConsul:
    """In-process fake of a Consul agent's HTTP API (see the module docstring for what it models)."""

    def __init__(self, *, acl_token: str | None = None, host: str = "127.0.0.1",
                 deregister_minimum_s: float = 60.0, reap_interval_s: float = 30.0) -> None:
        self.acl_token = acl_token
        self.host = host
        self.port = 0
        self.deregister_minimum_s, self.reap_interval_s = deregister_minimum_s, reap_interval_s
        self.services: dict[str, dict[str, Any]] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for tests
        self.queries: list[tuple[str, dict[str, str]]] = []  # (path, query) of every GET, for tests
        # every request as sent: method, path, query, token header, JSON body (None when empty)
        self.calls: list[dict[str, Any]] = []
        self._reset_state()
        self._runner: web.AppRunner | None = None
        self._changed = asyncio.Condition()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._reaper: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()

    def _reset_state(self) -> None:
        self.services.clear()
        self.checks.clear()
        self.index = 1  # the raft index; Consul's start above 0
        self._service_index: dict[str, int] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, reset: bool = False) -> int:
        """Listen (port 0 the first time, the same port after an outage); returns the port."""
        if reset:
            self._reset_state()
        app = web.Application(middlewares=[self._middleware])
        app.router.add_put("/v1/agent/service/register", self._register)
        app.router.add_put("/v1/agent/service/deregister/{id}", self._deregister)
        app.router.add_put("/v1/agent/check/{status:pass|warn|fail}/{id}", self._update_check)
        app.router.add_get("/v1/health/service/{name}", self._health)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, shutdown_timeout=0.1)
        await site.start()
        self.port = self._runner.addresses[0][1]
        for check_id, check in self.checks.items():
            self._arm(check_id, check)
        self._reaper = asyncio.create_task(self._reap_loop())
        return self.port

    async def stop(self) -> None:
        """An outage: stop listening, drop connections; blocking queries in flight never answer."""
        if self._runner is None:
            return
        self._reaper.cancel()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in list(self._inflight):
            task.cancel()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    # -- ACL ---------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        self.requests.append((request.method, request.path))
        if request.method == "GET":
            self.queries.append((request.path, dict(request.query)))
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.calls.append({"method": request.method, "path": request.path, "query": dict(request.query),
                           "token": request.headers.get("X-Consul-Token"), "body": body})
        task = asyncio.current_task()
        self._inflight.add(task)
        try:
            if self.acl_token is not None:
                token = (request.headers.get("X-Consul-Token") or request.query.get("token")
                         or request.headers.get("Authorization", "").removeprefix("Bearer ").strip())
                if token and token != self.acl_token:
                    return _text(403, "ACL not found")
                request[ANONYMOUS] = not token
                if not token and request.method != "GET":
                    return _text(403, "Permission denied")
            return await handler(request)
        finally:
            self._inflight.discard(task)

    # -- state changes ------------------------------------------------------------------------

    async def _bump(self, service_name: str) -> None:
        self.index += 1
        self._service_index[service_name] = self.index
        async with self._changed:
            self._changed.notify_all()

    def _arm(self, check_id: str, check: dict[str, Any]) -> None:
        old = self._timers.pop(check_id, None)
        if old is not None:
            old.cancel()
        if check["TTL"] > 0 and self._runner is not None:
            loop = asyncio.get_running_loop()
            self._timers[check_id] = loop.call_later(
                check["TTL"], lambda: loop.create_task(self._set_status(check_id, "critical", "TTL expired")))

    async def _set_status(self, check_id: str, status: str, output: str) -> None:
        check = self.checks.get(check_id)
        if check is None:
            return
        changed = (check["Status"], check["Output"]) != (status, output)
        if status == "critical" and check["Status"] != "critical":
            check["critical_since"] = time.monotonic()
        elif status != "critical":
            check["critical_since"] = None
        check["Status"], check["Output"] = status, output
        if changed:
            check["ModifyIndex"] = self.index + 1
            await self._bump(check["ServiceName"])

    async def _remove_service(self, service_id: str) -> None:
        service = self.services.pop(service_id)
        for check_id in [c for c, check in self.checks.items() if check["ServiceID"] == service_id]:
            del self.checks[check_id]
            handle = self._timers.pop(check_id, None)
            if handle is not None:
                handle.cancel()
        await self._bump(service["Service"])

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            now = time.monotonic()
            for check in list(self.checks.values()):
                after = check["DeregisterCriticalServiceAfter"]
                since = check.get("critical_since")
                if (after and since is not None and now - since >= max(after, self.deregister_minimum_s)
                        and check["ServiceID"] in self.services):
                    await self._remove_service(check["ServiceID"])

    # -- endpoints -------------------------------------------------------------------------------

    async def _register(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _text(400, "Request decode failed: invalid JSON")
        if not isinstance(body, dict):
            return _text(400, "Request decode failed: expected an object")
        body = _fields(body)
        name = body.get("Name")
        if not name:
            return _text(400, "Missing service name")
        meta = body.get("Meta") or {}
        for key, value in meta.items():
            if not _META_KEY.match(key) or len(key) > 128 or len(str(value)) > 512:
                return _text(400, f"Invalid Service Meta: Couldn't load metadata pair ('{key}', '{value}')")
        service_id = body.get("ID") or name
        definitions = ([body["Check"]] if body.get("Check") else []) + list(body.get("Checks") or [])
        checks = {}
        definitions = [_fields(d) if isinstance(d, dict) else {} for d in definitions]
        for n, definition in enumerate(definitions, 1):
            if not definition.get("TTL"):
                return _text(400, "Check is not valid: this fake models TTL checks only")
            try:
                ttl = parse_duration(definition["TTL"])
                after = parse_duration(definition.get("DeregisterCriticalServiceAfter") or "0")
            except ValueError as exc:
                return _text(400, f"Invalid check: {exc}")
            default_id = f"service:{service_id}" + (f":{n}" if len(definitions) > 1 else "")
            check_id = definition.get("CheckID") or definition.get("ID") or default_id
            status = definition.get("Status") or "critical"
            if status not in ("passing", "warning", "critical"):
                return _text(400, f"Invalid initial status: {status!r}")
            checks[check_id] = {"Node": NODE, "CheckID": check_id,
                                "Name": definition.get("Name") or f"Service '{name}' check",
                                "Status": status, "Notes": definition.get("Notes", ""), "Output": "",
                                "ServiceID": service_id, "ServiceName": name,
                                "ServiceTags": list(body.get("Tags") or []), "Type": "ttl", "TTL": ttl,
                                "DeregisterCriticalServiceAfter": after,
                                "critical_since": time.monotonic() if status == "critical" else None,
                                "CreateIndex": self.index + 1, "ModifyIndex": self.index + 1}
        old = self.services.get(service_id)
        if old is not None and old["Service"] != name:
            await self._remove_service(service_id)
        if "replace-existing-checks" in request.query:
            for check_id in [c for c, ch in self.checks.items() if ch["ServiceID"] == service_id]:
                if check_id not in checks:
                    del self.checks[check_id]
                    handle = self._timers.pop(check_id, None)
                    if handle is not None:
                        handle.cancel()
        self.services[service_id] = {
            "ID": service_id, "Service": name, "Tags": list(body.get("Tags") or []),
            "Address": body.get("Address", ""), "Meta": dict(meta), "Port": int(body.get("Port") or 0),
            "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": False,
            "CreateIndex": self.index + 1, "ModifyIndex": self.index + 1}
        for check_id, check in checks.items():
            self.checks[check_id] = check
            self._arm(check_id, check)
        await self._bump(name)
        return web.Response(status=200)

    async def _deregister(self, request: web.Request) -> web.Response:
        service_id = request.match_info["id"]
        if service_id not in self.services:
            return _text(404, f'Unknown service ID "{service_id}". Ensure that the service ID is passed, '
                              "not the service name.")
        await self._remove_service(service_id)
        return web.Response(status=200)

    async def _update_check(self, request: web.Request) -> web.Response:
        check_id = request.match_info["id"]
        check = self.checks.get(check_id)
        if check is None:
            return _text(404, f'Unknown check ID "{check_id}". Ensure that the check ID is passed, '
                              "not the check name.")
        status = {"pass": "passing", "warn": "warning", "fail": "critical"}[request.match_info["status"]]
        self._arm(check_id, check)
        await self._set_status(check_id, status, request.query.get("note", ""))
        return web.Response(status=200)

    def _service_idx(self, name: str) -> int:
        return self._service_index.get(name, self.index)

    async def _health(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        passing = request.query.get("passing", "false" if "passing" not in request.query else "")
        passing_only = passing.lower() in ("", "1", "t", "true")
        try:
            min_index = int(request.query.get("index", "0"))
            if min_index < 0:
                raise ValueError
        except ValueError:
            return _text(400, "Invalid index")
        try:
            wait = parse_duration(request.query["wait"]) if "wait" in request.query else 300.0
        except ValueError as exc:
            return _text(400, f"Invalid wait time: {exc}")
        wait = min(wait or 300.0, 600.0)
        if min_index > 0:
            wait += random.uniform(0, wait / 16)
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._service_idx(name) > min_index),
                                           wait)
                except asyncio.TimeoutError:
                    pass
        entries = [self._entry(s) for s in self.services.values() if s["Service"] == name]
        if passing_only:
            entries = [e for e in entries if all(c["Status"] == "passing" for c in e["Checks"])]
        headers = {"X-Consul-Index": str(max(self._service_idx(name), 1)), "X-Consul-KnownLeader": "true",
                   "X-Consul-LastContact": "0"}
        if request.get(ANONYMOUS) and entries:
            entries, headers["X-Consul-Results-Filtered-By-ACLs"] = [], "true"
        return web.json_response(entries, headers=headers)

    def _entry(self, service: dict[str, Any]) -> dict[str, Any]:
        node = {"ID": "00000000-0000-0000-0000-000000000001", "Node": NODE, "Address": "127.0.0.1",
                "Datacenter": "dc1", "TaggedAddresses": {"lan": "127.0.0.1", "wan": "127.0.0.1"},
                "Meta": {}, "CreateIndex": 1, "ModifyIndex": 1}
        serf = {"Node": NODE, "CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing",
                "Notes": "", "Output": "Agent alive and reachable", "ServiceID": "", "ServiceName": "",
                "ServiceTags": [], "Type": "", "CreateIndex": 1, "ModifyIndex": 1}
        checks = [serf] + [{k: v for k, v in c.items() if k not in ("TTL", "DeregisterCriticalServiceAfter",
                                                                      "critical_since")}
                           for c in self.checks.values() if c["ServiceID"] == service["ID"]]
        return {"Node": node, "Service": dict(service), "Checks": checks}


# The fields this fake reads, by the name Go's case-insensitive match (and Consul's
# snake_case translation) folds every spelling to.
_FIELDS = ("ID", "Name", "Address", "Port", "Tags", "Meta", "Check", "Checks", "CheckID", "TTL", "Status",
           "Notes", "DeregisterCriticalServiceAfter")
_FOLDED = {name.lower(): name for name in _FIELDS}


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    """A decoded object with its known field names in Consul's spelling (as in Go, the last spelling wins)."""
    fields: dict[str, Any] = {}
    for key, value in body.items():
        fields[_FOLDED.get(key.lower().replace("_", ""), key)] = value
    return fields


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain")


def main() -> None:  # pragma: no cover - manual use
    parser = argparse.ArgumentParser(description="Run the FAKE Consul agent (tests only).")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()

    async def run() -> None:
        fake = FakeConsul(acl_token=args.token)
        fake.port = args.port
        await fake.start()
        print(fake.url, flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
