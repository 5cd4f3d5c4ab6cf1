"""tfscache as the control plane of HAProxy (``server.data_plane = "haproxy"``; docs/data-plane.md).

``DataPlane`` binds the public gRPC and REST ports, hands them to HAProxy (process.py), and
keeps tfscache's own front ends on internal ports as HAProxy's fallback: the slow path for
every request HAProxy does not route. Every ``POLL_S`` it

* reads HAProxy's stick table and gives the caches what their policies need, as workers'
  reports are given (tfscache.workers.usage): each routed request as a lease taken and given
  back, and the requests in flight (a version busy on the data plane is no victim);
* routes each model that local nodes serve warm now to them (targets.py): the node a request
  would go to alone, or, with copies on, the model's copies that hold it AVAILABLE (HAProxy
  balances over them) while the copies rule would send a request to one of them; and
  withdraws the routes of the others;
* follows the nodes' addresses (a restarted node child has new ports) with a reload;
* sidecar mode: routes each model that HAProxy was asked for without a route (the table
  ``missed``, read every ``MISSED_EVERY_S``) and that the router sends to a peer sidecar
  (targets.py, ``peer_target``) to that peer's public port, marked as forwarded (config.py);
  follows the peers discovery reports with a reload, a peer's routes withdrawn before it leaves
  the configuration.

The table ``missed`` can hold many models, so it is read once a second, not at each poll, and
each model read from it is then cleared from it (``clear table``): the table holds the models
not handled yet. A model routed to a peer is remembered here instead (``ASKED_S``, the tables'
own expiry, from its last use), across reloads too, and looked at again at each poll, so a
change of the ring moves or withdraws its route at once. Clearing loses nothing: a model that
has no route (none was granted, or it was withdrawn) and is asked for again is counted in
``missed`` again (config.py).

A peer's route is no lease: the peer guards its own unloads with its own data plane, and a
request it gets for a model it is unloading waits for the unload and loads it again, as one from
any client would. So no revocation waits for a peer's route.

With [tls] (``tls.cert_file``), HAProxy terminates TLS on the public ports from files written
into the data plane's state directory (certs.py), and in sidecar mode reaches the peers over TLS
as the Python path does, with the same certificate and the peer CAs written there too; a peer
whose address is an IP address, with no ``tls.peer_server_name``, gets no routes (HAProxy cannot
check an IP address in a certificate: config.peer_name), so its models take the slow path.
``reload_tls`` (SIGHUP) writes the files again, has HAProxy check them, and reloads it; files
that do not load change nothing.

Before a cache unloads a version, its ``revoker`` hook takes that node out of the model's route
(the route keeps the group's other nodes, if any) and waits until HAProxy counts none of its
requests in flight there (routes.py). A version being unloaded is UNLOADING in its ledger
already, so the next poll does not route it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import re
import shutil
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tfscache.dataplane import binary, certs, config
from tfscache.dataplane.process import HaproxyConfigError, HaproxyStartError, Supervisor
from tfscache.dataplane.requests import RequestLog, Routed
from tfscache.dataplane.routes import Routes, routable
from tfscache.dataplane.runtime import Runtime, RuntimeApiError
from tfscache.dataplane.targets import Target, peer_target, target
from tfscache.frontend.backends import FORWARDED_KEY, LOAD_KEY, VIA_DATA_PLANE, VIA_KEY
from tfscache.workers.usage import Usage
from tfscache.tasks import cancel

log = logging.getLogger("tfscache.dataplane")

POLL_S = 0.1
TIMES_EVERY = 10  # polls between two reads of HAProxy's response times (show stat): 1 s
MISSED_EVERY_S = 1.0  # between two reads of HAProxy's table ``missed`` (sidecar mode)
# how long a model routed to a peer stays routed after it was last read from ``missed`` or seen
# routed there in the table ``inflight``: the tables' expiry (config.py)
ASKED_S = 3600.0
# Usage.apply's rows are per reporter; the data plane reports as one (workers are 0..N-1).
REPORTER = -1
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def listening(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port) for HAProxy to inherit."""
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host
                                else socket.AF_INET, backlog=1024, reuse_port=False)
    sock.set_inheritable(True)
    return sock


class DataPlane:
    def __init__(self, settings, *, nodes: Callable[[], dict], router: Callable[[], object],
                 spread=None, rules: config.Rules,
                 routed: Callable[..., None] | None = None,
                 answered: Callable[[Routed, str, int | None], None] | None = None,
                 peers: Callable[[], dict] | None = None,
                 forwarded_as: str | None = None,
                 timed: Callable[[str, str, float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``nodes()``: local node backends by name; ``router()``: the router (which backend a
        request goes to first); ``spread``: copies that follow load, None when off;
        ``rules``: how the node kind's protocol names a hot request's model (its data_plane);
        ``routed(node, requests, peer=)``: told of the requests HAProxy routed, at each poll
        (metrics; ``peer``: sent to a peer sidecar, a forward);
        ``answered(request, node, version)``: told of each routed request as HAProxy logs it
        (the request metrics and the request log; ``version`` None: sent to a peer sidecar);
        sidecar mode: ``peers()``, the peer sidecars' backends by name, and ``forwarded_as``,
        this sidecar's name, the forwarded mark on what HAProxy sends them (over TLS with
        ``tls.cert_file``, as the Python path's hop: config.py, ``_to_peer``);
        ``timed(node, protocol, seconds)``: HAProxy's mean response time of what it routed to a
        node or peer lately, every ``TIMES_EVERY`` polls (metrics); ``clock``: seconds, for the
        cadence of reads of the table ``missed`` (``MISSED_EVERY_S``; tests move a fake one,
        set here or on ``clock`` before the start)."""
        self.settings = settings
        self.rules = rules
        self._nodes = nodes
        self._router = router
        self._routed = routed
        self._answered = answered
        self._timed = timed
        self._polls = 0
        self.request_log: RequestLog | None = None
        self.usage = Usage(nodes, spread)
        self._spread = spread
        sidecar = peers is not None and forwarded_as is not None
        self._peers = peers if sidecar else None
        self._forwarded_as = _UNSAFE.sub("_", forwarded_as) if sidecar else None
        self.supervisor: Supervisor | None = None
        self.routes: Routes | None = None
        self.peer_routes: Routes | None = None  # sidecar mode: models -> the peer that owns them
        self._peer_used: set[str] = set()  # models with requests routed to a peer (stick table)
        self.clock = clock
        self._missed_at: float | None = None  # when the table missed was last read (clock)
        # routed to a peer: model -> when last read from missed or seen routed there (clock)
        self._asked: dict[str, float] = {}
        self.ports: dict[str, int | None] = {}
        self._sockets: list[socket.socket] = []
        self._ids: dict[str, str] = {}  # node name -> its name in haproxy.cfg
        self._versions: dict[tuple[str, str], int] = {}  # (node, model) -> version routed
        self._counted: dict[str, int] = {}  # stick-table key -> http_req_cnt last read
        self._last_use: dict[tuple[str, str], float] = {}
        self._task: asyncio.Task | None = None
        self._tls: config.Tls | None = None  # the files HAProxy serves [tls] from
        self._unverifiable: set[str] = set()  # peers kept on the slow path (logged once each)

    async def start(self, internal_grpc: int, internal_rest: int | None, *,
                    state_dir: Path) -> tuple[int, int | None]:
        """Bind the public ports, start HAProxy on them with the internal front ends behind it;
        returns the public (gRPC, REST) ports."""
        server = self.settings.server
        grpc = listening(server.bind_address, server.grpc_port)
        self._sockets.append(grpc)
        rest = None
        if internal_rest is not None:
            rest = listening(server.bind_address, server.rest_port)
            self._sockets.append(rest)
        self.ports = {"grpc": grpc.getsockname()[1], "rest": rest.getsockname()[1] if rest else None}
        self._internal = (f"127.0.0.1:{internal_grpc}",
                          f"127.0.0.1:{internal_rest}" if internal_rest else None)
        self._fds = (grpc.fileno(), rest.fileno() if rest else None)
        self._state = Path(state_dir) / "dataplane"
        self._runtime_socket = config.runtime_socket_for(self._state)
        if self._runtime_socket.parent != self._state:  # a deep state directory: kept apart
            await asyncio.to_thread(config.private_dir, self._runtime_socket.parent)
        await asyncio.to_thread(self._state.mkdir, parents=True, exist_ok=True)
        if self.settings.tls.cert_file:
            self._tls = certs.files(self._state, self.settings.tls,
                                    peers=self._forwarded_as is not None)
            await asyncio.to_thread(certs.write, self.settings.tls, self._tls)
        if self._answered is not None:
            self.request_log = RequestLog(self._runtime_socket.parent / "requests.sock",
                                          dict(self.rules.rest_methods), self._told)
            await self.request_log.start()
        plan = self._plan()
        runtime = Runtime(plan.runtime_socket)
        executable = binary.locate(server.haproxy_binary) or server.haproxy_binary
        self.supervisor = Supervisor(executable, self._state, plan, runtime=runtime)
        self.routes = Routes(runtime, plan.map_path, elsewhere=self.supervisor.old_in_flight,
                             unroute_elsewhere=self.supervisor.unroute_old)
        await self.routes.write_file()  # none yet: a map left from a previous run is dropped
        if self._forwarded_as is not None:
            self.peer_routes = Routes(runtime, plan.peer_map_path)
            await self.peer_routes.write_file()
        await self.supervisor.start()
        self._task = asyncio.create_task(self._loop(), name="dataplane")
        log.info("data plane haproxy serving gRPC port %s, REST port %s", self.ports["grpc"],
                 self.ports["rest"])
        return self.ports["grpc"], self.ports["rest"]

    def _plan(self) -> config.Plan:
        nodes = []
        for name, backend in sorted(self._nodes().items()):
            upstream = getattr(backend, "upstream", None)
            if upstream is None or not upstream.rest_address:
                continue
            node_id = self._ids.setdefault(name, _UNSAFE.sub("_", name))
            nodes.append(config.Node(node_id, upstream.grpc_address,
                                     upstream.rest_address.removeprefix("http://")))
        peers = []
        for name, backend in sorted((self._peers() if self._peers else {}).items()):
            upstream = backend.upstream
            if not self._verifiable(name, upstream.grpc_address):
                continue
            node_id = self._ids.setdefault(name, _UNSAFE.sub("_", name))
            peers.append(config.Node(node_id, upstream.grpc_address,
                                     (upstream.rest_address or "").removeprefix("http://")))
        return config.Plan(grpc_fd=self._fds[0], rest_fd=self._fds[1],
                           fallback_grpc=self._internal[0], fallback_rest=self._internal[1],
                           nodes=tuple(nodes), state_dir=self._state,
                           runtime_socket=self._runtime_socket, rules=self.rules,
                           log_socket=self.request_log.path if self.request_log else None,
                           max_body=self.settings.server.max_receive_message_bytes,
                           group_width=self._group_width(), peers=tuple(peers),
                           mark=(FORWARDED_KEY, self._forwarded_as) if self._forwarded_as else None,
                           peer_private=(LOAD_KEY,), via=(VIA_KEY, VIA_DATA_PLANE),
                           tls=self._tls,
                           shared_connections=self.settings.server.node_connections == "shared")

    def _verifiable(self, peer: str, address: str) -> bool:
        """Whether HAProxy can check peer ``peer``'s certificate at ``address`` as the Python
        path does (always without [tls]); a peer it cannot is left out of the configuration, so
        its models get no route from HAProxy and take the slow path (config.peer_name)."""
        if self._tls is None or config.peer_name(self._tls, address) is not None:
            return True
        if peer not in self._unverifiable:
            self._unverifiable.add(peer)
            log.info("data plane: peer %s at %s takes the slow path: HAProxy cannot check its "
                     "certificate for that address (an IP address: set tls.peer_server_name)",
                     peer, address)
        return False

    def _group_width(self) -> int | None:
        """The most nodes a route names: 1 with copies off (targets.py), a model's most copies
        with copies on (None: every node)."""
        if self._spread is None:
            return 1
        rule = self._spread.rule
        return max(rule.min_copies, rule.max_copies) if rule.max_copies else None

    async def stop(self, grace: float) -> None:
        """Stop routing and let HAProxy finish the requests it carries (``grace`` s at most)."""
        if self._task is not None:
            await cancel(self._task)
        if self.supervisor is not None:
            await self.supervisor.stop(grace)
        if self.routes is not None:
            self.routes.close()  # a revocation waiting for HAProxy to answer returns
        if self.peer_routes is not None:
            self.peer_routes.close()
        if self.request_log is not None:
            await self.request_log.close()
        if self.supervisor is not None and self._runtime_socket.parent != self._state:
            await asyncio.to_thread(shutil.rmtree, self._runtime_socket.parent, True)
        for sock in self._sockets:
            sock.close()

    async def reload_tls(self) -> bool:
        """SIGHUP: serve [tls]'s files as they are now, without closing a port or failing a
        request (a reload: new workers take the new certificate, old ones finish their
        connections); new connections to peers present it too, and check the peers against the
        peer CAs as they are now. Files that do not load, or that HAProxy refuses, change
        nothing: logged, False."""
        section = self.settings.tls
        if self._tls is None or self.supervisor is None:
            return False
        staged = certs.staged(self._tls)
        async with self.routes.held():  # one reload at a time; the new worker reads the map file
            try:
                await asyncio.to_thread(certs.write, section, staged)
                await self.supervisor.check(dataclasses.replace(self._plan(), tls=staged))
            except (OSError, ssl.SSLError, ValueError, HaproxyConfigError) as exc:
                await asyncio.to_thread(certs.discard, staged)
                log.error("TLS reload failed, keeping the certificate in use: %s", exc)
                return False
            await asyncio.to_thread(certs.install, staged, self._tls)
            try:
                await self.supervisor.reload(self._plan())
            except HaproxyStartError as exc:  # the old worker serves on
                log.error("TLS reload failed, haproxy did not take the new certificate: %s", exc)
                return False
        log.info("TLS certificate reloaded from %s", section.cert_file)
        return True

    # -- the poll ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except RuntimeApiError as e:  # HAProxy restarting: the next poll finds it again
                log.debug("data plane poll: %s", e)
            except Exception:
                log.exception("data plane poll failed")
            await asyncio.sleep(POLL_S)

    async def poll(self) -> None:
        """One round: usage back to the caches, the plan's nodes, the routes."""
        await self._report()
        plan = self._plan()
        old = self.supervisor.plan
        if (plan.nodes, plan.peers) != (old.nodes, old.peers):
            await self._withdraw_gone({peer.name for peer in plan.peers})
            log.info("data plane: nodes or peers changed, reloading haproxy")
            async with self.routes.held(), self._peers_held():  # new workers read the map files
                await self.supervisor.reload(plan)
        await self._route()
        if self.peer_routes is not None:
            await self._route_to_peers()
        self._polls += 1
        if self._timed is not None and self._polls % TIMES_EVERY == 0:
            await self._times()

    async def _times(self) -> None:
        """HAProxy's mean response time per node (or peer) and protocol, to ``timed``."""
        by_id = {v: k for k, v in self._ids.items()}
        for (backend, server), seconds in (await self.routes.runtime.response_times()).items():
            protocol = backend.partition("_")[0]
            if server in by_id and backend == config.backend(protocol, server):
                self._timed(by_id[server], protocol, seconds)

    def _peers_held(self):
        return (self.peer_routes.held() if self.peer_routes is not None
                else contextlib.nullcontext())

    async def _withdraw_gone(self, peers: set[str]) -> None:
        """The routes to peers that left the ring, before their backends leave the configuration:
        their requests take the slow path (or a local route) from now on."""
        if self.peer_routes is None:
            return
        for name, peer in self.peer_routes.current.items():
            if peer not in peers:
                await self.peer_routes.withdraw(name)

    async def _report(self) -> None:
        by_id = {v: k for k, v in self._ids.items()}
        peers = {peer.name for peer in self.supervisor.plan.peers}
        rows, now, peer_used = [], time.time(), set()
        for (model, node_id), use in (await self.routes.usage()).items():
            node = by_id.get(node_id)
            peer = node_id in peers
            # a peer's route names no version: the peer serves what it serves (0 in the rows;
            # the copies rule alone reads them, a peer has no cache here)
            version = 0 if peer else self._versions.get((node, model))
            if node is None or version is None:
                continue
            if peer:
                peer_used.add(model)
            key = f"{model}@{node_id}"
            counted = self._counted.get(key, 0)
            # a restarted HAProxy starts its table from zero
            requests = use.requests - counted if use.requests >= counted else use.requests
            self._counted[key] = use.requests
            if requests:
                self._last_use[(node, model)] = now
                if self._routed is not None:
                    self._routed(node, requests, peer=peer)
            rows.append([node, model, version, requests, self._last_use.get((node, model), now),
                         use.in_flight])
        self.usage.apply(REPORTER, rows)
        self._peer_used = peer_used

    def _told(self, request: Routed) -> None:
        """A routed request HAProxy logged: to the request metrics, under its node's name, and to
        its node's cache, whose co-access prefetch learns from requests in the order they came."""
        node = next((n for n, i in self._ids.items() if i == request.node_id), None)
        if node is None:
            return
        if any(peer.name == request.node_id for peer in self.supervisor.plan.peers):
            self._answered(request, node, None)  # a forward: no lease here, no request-log row
            return
        version = self._versions.get((node, request.model), 0)
        cache = getattr(self._nodes().get(node), "cache", None)
        if cache is not None and version:
            cache.served_elsewhere(request.model, version)
        self._answered(request, node, version)

    async def _route(self) -> None:
        router = self._router()
        if router is None:
            return
        wanted: dict[str, Target] = {}
        nodes = self._nodes()
        await self._look_again(nodes)
        for backend in nodes.values():
            cache = getattr(backend, "cache", None)
            if cache is None:
                continue
            for resident in cache.snapshot():
                name = resident.name
                if name in wanted or not routable(name) or resident.state != "available":
                    continue
                found = target(router, self.usage, self._spread, name)
                if found is not None and all(b.name in self._ids for b in found.nodes):
                    wanted[name] = found
        current = self.routes.current
        for name in current:
            if name not in wanted:
                await self.routes.withdraw(name)
        for name, found in wanted.items():
            for backend in found.nodes:
                self._versions[(backend.name, name)] = found.version
            value = config.group([self._ids[backend.name] for backend in found.nodes])
            if current.get(name) != value:  # a new route, or one over other nodes: in one step
                held = [(backend, backend.cache) for backend in found.nodes]
                await self.routes.grant(name, value, still=functools.partial(
                    _still_resident, held, name, found.version))

    async def _route_to_peers(self) -> None:
        """Route to a peer each model that was asked for here without a route (read from the
        table ``missed`` at most every ``MISSED_EVERY_S``) or was routed to a peer (the table
        ``inflight``), within ``ASKED_S``, and that the router sends to that peer now
        (``peer_target``); withdraw the other peer routes, and forget their models. Then clear
        the models read from ``missed``: each has its peer route, or has none to have now. A
        model with a route to a local node is not looked up in the peers' map at all
        (config.py)."""
        router = self._router()
        if router is None:
            return
        now, read = self.clock(), []
        if self._missed_at is None or now - self._missed_at >= MISSED_EVERY_S:
            # a name that is no map key takes the slow path: left to expire from the table
            read = [name for name in await self.peer_routes.runtime.table(config.MISSED)
                    if routable(name)]
            self._missed_at = now
        asked = {**{n: t for n, t in self._asked.items() if now - t < ASKED_S},
                 **dict.fromkeys(read, now), **dict.fromkeys(self._peer_used, now)}
        current = self.peer_routes.current
        peers = {peer.name for peer in self.supervisor.plan.peers}
        local = self.routes.current
        wanted: dict[str, str] = {}
        for name in asked:
            if name in local or not routable(name):
                continue
            found = peer_target(router, self._spread, name)
            node_id = self._ids.get(found.name) if found is not None else None
            if node_id in peers:
                wanted[name] = node_id
        # the others are forgotten: asked for again with no route, they are in missed again
        self._asked = {name: t for name, t in asked.items() if name in wanted}
        for name in current:
            if name not in wanted:
                await self.peer_routes.withdraw(name)
        for name, node_id in wanted.items():
            if current.get(name) != node_id:
                await self.peer_routes.grant(name, node_id)
        if read:  # handled: what stays in missed (a request in flight tracks it) is read again
            await self.peer_routes.runtime.clear_keys(config.MISSED, read)

    async def _look_again(self, nodes: dict) -> None:
        """Models whose latest version is no longer remembered (``rescan_s``) are listed again,
        off the loop, as a slow-path request would list them: the routed ones, so a route lasts
        while its version is the latest on disk and a new version on disk ends it; and the
        resident ones, so a model loaded a while before its next request is routed all the same."""
        by_id = {v: k for k, v in self._ids.items()}
        stale: dict[tuple[str, str], Awaitable] = {}

        def look(node: str | None, name: str) -> None:
            cache = getattr(nodes.get(node), "cache", None)
            if (cache is not None and (node, name) not in stale
                    and cache.resident_version(name) is None):
                stale[(node, name)] = cache.version_on_disk(name)

        for name, route in self.routes.current.items():
            for node_id in config.members(route):
                look(by_id.get(node_id), name)
        for node, backend in nodes.items():
            cache = getattr(backend, "cache", None)
            for resident in cache.snapshot() if cache is not None else ():
                if resident.state == "available" and routable(resident.name):
                    look(node, resident.name)
        # a model gone from the repository raises here; its route goes below
        await asyncio.gather(*stale.values(), return_exceptions=True)

    # -- before an unload ------------------------------------------------------------------------

    def revoker(self, node: str) -> Callable[[list], Awaitable[None]]:
        """The hook ``node``'s cache awaits before an unload (``CacheManager(before_unload=)``)."""
        return functools.partial(self.revoke, node)

    async def revoke(self, node: str, keys) -> None:
        """Before ``keys`` leave ``node``: their models' routes no longer name it (a group keeps
        its other nodes) and none of their routed requests is still in flight there."""
        node_id = self._ids.get(node)
        if node_id is None or self.routes is None:
            return
        names = sorted({name for name, _ in keys if routable(name)})
        await asyncio.gather(*(self.routes.revoke(name, node_id) for name in names))


def _still_resident(held: list, name: str, version: int) -> bool:
    """The version routed is still AVAILABLE on each of the same caches (not retired meanwhile):
    ``held``, (backend, its cache) pairs."""
    return all(backend.cache is cache and cache.is_resident(name, version)
               for backend, cache in held)
