"""Routes are leases: the control plane's side of ``routes.map`` and the ``inflight`` table.

A route sends a model's warm requests from HAProxy straight to one node. ``grant`` adds it once
a version is READY there; ``revoke`` takes it away before that version may be unloaded, and
returns only when HAProxy counts no request in flight for MODEL@NODE, so an unload that waits
for ``revoke`` never cuts a request short. The map file on disk is rewritten on each change, so
a restarted or reloaded HAProxy starts from the routes in force (config.py says why no request
can slip between a lookup and its count).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from pathlib import Path

from tfscache.dataplane.config import TABLE
from tfscache.dataplane.runtime import Runtime, Usage

# A map key is one word on the runtime API; other names simply take the slow path.
_ROUTABLE = re.compile(r"^[A-Za-z0-9._-]{1,256}$")


def routable(model: str) -> bool:
    return bool(_ROUTABLE.match(model))


class Routes:
    def __init__(self, runtime: Runtime, map_path: Path, poll_s: float = 0.01) -> None:
        self.runtime = runtime
        self.map_path = Path(map_path)
        self.poll_s = poll_s
        self._routes: dict[str, str] = {}
        self._lock = asyncio.Lock()

    @property
    def current(self) -> dict[str, str]:
        return dict(self._routes)

    async def write_file(self) -> None:
        """The map file as the routes stand (what HAProxy reads when it starts or reloads)."""
        text = "".join(f"{m} {n}\n" for m, n in sorted(self._routes.items()))
        await asyncio.to_thread(_replace, self.map_path, text)

    async def grant(self, model: str, node: str,
                    still: Callable[[], bool] = lambda: True) -> bool:
        """Send ``model``'s warm requests to ``node``, if ``still()`` holds once the routes are
        this caller's (a revocation that came first has the last word); False if not routed."""
        if not routable(model):
            return False
        async with self._lock:
            if not still():
                return False
            self._routes[model] = node
            await self.write_file()
            await self.runtime.set_map(self.map_path, model, node)
        return True

    async def withdraw(self, model: str) -> None:
        """No route for ``model`` (its requests in flight finish where they are)."""
        async with self._lock:
            if self._routes.pop(model, None) is not None:
                await self.write_file()
                await self.runtime.del_map(self.map_path, model)

    async def revoke(self, model: str, node: str, deadline_s: float | None = None) -> None:
        """No route for ``model`` to ``node``, and none of its routed requests still in flight.

        Raises TimeoutError after ``deadline_s`` with the route already gone (a request held
        longer than that is the caller's to judge).
        """
        async with self._lock:
            if self._routes.get(model) == node:
                del self._routes[model]
                await self.write_file()
                await self.runtime.del_map(self.map_path, model)
        await asyncio.wait_for(self._drained(f"{model}@{node}"), deadline_s)

    async def _drained(self, key: str) -> None:
        while (await self.in_flight(key)) > 0:
            await asyncio.sleep(self.poll_s)

    async def in_flight(self, key: str) -> int:
        usage = (await self.runtime.table(TABLE)).get(key)
        return usage.in_flight if usage else 0

    async def usage(self) -> dict[tuple[str, str], Usage]:
        """(model, node) -> its in-flight count and requests counted, from the stick table."""
        table = await self.runtime.table(TABLE)
        return {tuple(key.rsplit("@", 1)): use for key, use in table.items() if "@" in key}


def _replace(path: Path, text: str) -> None:
    scratch = path.with_name(path.name + ".new")
    scratch.write_text(text)
    os.replace(scratch, path)
