"""Routes are leases: the control plane's side of ``routes.map`` and the ``inflight`` table.

A route sends a model's warm requests from HAProxy straight to one node, or to a group of nodes
that hold copies of it (HAProxy picks one per request; config.py). ``grant`` adds or changes it
once a version is READY on each; ``revoke`` takes one node out of it before that version may be
unloaded there (the route shrinks to the group's other nodes, or goes), and returns only when
HAProxy counts no request in flight for MODEL@NODE, so an unload that waits for ``revoke`` never
cuts a request short. Requests are counted under the node they went to, whatever group they
found, so MODEL@NODE is the one key to wait for. The map file on disk is rewritten on each
change, so a restarted or reloaded HAProxy starts from the routes in force (config.py says why
no request can slip between a lookup and its count).

``current`` is what HAProxy confirmed: a route is added to it once ``set map`` answered, and
leaves it once ``del map`` did. The file is written ahead of each command (a HAProxy that
restarts meanwhile reads the change), and back as it was when a grant or withdrawal fails. A
revocation keeps the route out of the file and asks again until HAProxy agrees: an unload waits
on it, so it never returns while HAProxy may still route the model there.

Across a reload: no route changes while it runs (``held``), so the new worker starts from the
file as it stands; a command an old worker answered does not count (runtime.py); and a
revocation also takes the model's route out of the old workers' maps (``unroute_elsewhere``),
and waits until no old worker carries a request under its key (``elsewhere``), since the
requests they carry are counted in their own tables, not the new worker's. It asks them rather
than wait for them to be gone: an old worker lives on while a client keeps a connection to it
open (an idle TLS one, measured), which would hold every unload, and it routes what still
reaches it on that connection by its own map.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from tfscache.dataplane.config import TABLE, group, members
from tfscache.dataplane.runtime import Runtime, RuntimeApiError, Usage

log = logging.getLogger("tfscache.dataplane")

# A map key is one word on the runtime API; other names simply take the slow path.
_ROUTABLE = re.compile(r"^[A-Za-z0-9._-]{1,256}$")


def routable(model: str) -> bool:
    return bool(_ROUTABLE.match(model))


class Routes:
    def __init__(self, runtime: Runtime, map_path: Path, poll_s: float = 0.01,
                 elsewhere: Callable[[str], Awaitable[int]] | None = None,
                 unroute_elsewhere: Callable[[Path, str], Awaitable[None]] | None = None) -> None:
        """``elsewhere(key)``: the requests under ``key`` that old HAProxy workers still carry
        (``Supervisor.old_in_flight``); ``unroute_elsewhere(map_path, model)``: drop ``model``'s
        route from the old workers' maps (``Supervisor.unroute_old``)."""
        self.runtime = runtime
        self.map_path = Path(map_path)
        self.poll_s = poll_s
        self._elsewhere = elsewhere
        self._unroute_elsewhere = unroute_elsewhere
        self._routes: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._closed = False  # HAProxy stopped for good: nothing is routed any more

    def close(self) -> None:
        """HAProxy was stopped for good (the data plane's stop): no route is in force any more,
        and a revocation waiting for HAProxy to answer returns."""
        self._closed = True
        self._routes.clear()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No route is granted, withdrawn or revoked while the body runs (a reload)."""
        async with self._lock:
            yield

    @property
    def current(self) -> dict[str, str]:
        return dict(self._routes)

    def _without(self, model: str) -> dict[str, str]:
        return {m: n for m, n in self._routes.items() if m != model}

    async def write_file(self, routes: dict[str, str] | None = None) -> None:
        """The map file as ``routes`` (default: the routes in force) say, for HAProxy to read when
        it starts or reloads."""
        routes = self._routes if routes is None else routes
        text = "".join(f"{m} {n}\n" for m, n in sorted(routes.items()))
        await asyncio.to_thread(_replace, self.map_path, text)

    async def grant(self, model: str, node: str,
                    still: Callable[[], bool] = lambda: True) -> bool:
        """Send ``model``'s warm requests to ``node`` (a node, or a group of them: ``group``), in
        place of any route it had, if ``still()`` holds once the routes are this caller's (a
        revocation that came first has the last word); False if not routed. Raises
        RuntimeApiError if HAProxy did not take it (then the route is as it was)."""
        if not routable(model):
            return False
        async with self._lock:
            if self._closed or not still():
                return False
            try:
                await self.write_file({**self._routes, model: node})
                await self.runtime.set_map(self.map_path, model, node)
            except BaseException:
                await self.write_file()
                raise
            self._routes[model] = node
        log.debug("route %s -> %s granted", model, node)
        return True

    async def withdraw(self, model: str) -> None:
        """No route for ``model`` (its requests in flight finish where they are). Raises
        RuntimeApiError if HAProxy did not drop it (then it is still routed)."""
        async with self._lock:
            if model not in self._routes:
                return
            try:
                await self.write_file(self._without(model))
                await self.runtime.del_map(self.map_path, model)
            except BaseException:
                await self.write_file()
                raise
            node = self._routes.pop(model)
        log.debug("route %s -> %s withdrawn", model, node)

    async def revoke(self, model: str, node: str, deadline_s: float | None = None) -> None:
        """No route for ``model`` to ``node``, and none of its routed requests still in flight.

        Raises TimeoutError after ``deadline_s`` (a request held longer than that, or a HAProxy
        that does not answer, is the caller's to judge); the route is out of the map file then.
        """
        await asyncio.wait_for(self._revoke(model, node), deadline_s)

    async def _revoke(self, model: str, node: str) -> None:
        async with self._lock:
            route = self._routes.get(model)
            if route is not None and node in members(route):
                rest = revoked(route, node)
                routes = self._without(model) if rest is None else {**self._routes, model: rest}
                await self.write_file(routes)
                while not self._closed:
                    try:
                        if rest is None:
                            await self.runtime.del_map(self.map_path, model)
                        else:
                            await self.runtime.set_map(self.map_path, model, rest)
                        if self._unroute_elsewhere is not None:  # old workers: the slow path
                            await self._unroute_elsewhere(self.map_path, model)
                        break
                    except RuntimeApiError as e:  # restarting: the new one reads the file
                        log.warning("revoking the route of %s to %s: %s; asking again", model,
                                    node, e)
                        await asyncio.sleep(self.poll_s)
                if not self._closed:  # closed: nothing is routed any more
                    self._routes = routes
                log.debug("route %s -> %s revoked (now %s)", model, node, rest)
        await self._drained(f"{model}@{node}")

    async def _drained(self, key: str) -> None:
        while not self._closed:
            try:
                if await self.in_flight(key) == 0 and (
                        self._elsewhere is None or await self._elsewhere(key) == 0):
                    return
            except RuntimeApiError as e:  # restarting: the new one starts with an empty table
                log.warning("waiting for %s's requests in flight: %s; asking again", key, e)
            await asyncio.sleep(self.poll_s)

    async def in_flight(self, key: str) -> int:
        usage = (await self.runtime.table(TABLE)).get(key)
        return usage.in_flight if usage else 0

    async def usage(self) -> dict[tuple[str, str], Usage]:
        """(model, node) -> its in-flight count and requests counted, from the stick table."""
        table = await self.runtime.table(TABLE)
        return {tuple(key.rsplit("@", 1)): use for key, use in table.items() if "@" in key}


def revoked(route: str, node: str) -> str | None:
    """A route (a map value) once ``node`` is out of it: the group's other nodes, in their order,
    or None when none is left (the route goes). What a revocation then waits for is MODEL@NODE
    alone: every request is counted under the node it went to."""
    rest = [n for n in members(route) if n != node]
    return group(rest) if rest else None


def _replace(path: Path, text: str) -> None:
    scratch = path.with_name(path.name + ".new")
    scratch.write_text(text)
    os.replace(scratch, path)
