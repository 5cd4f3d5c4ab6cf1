"""One asyncio.Lock per model name: loads and unloads of one name take turns.

Neither server serializes a load and an unload of one name the way the cache needs: Triton lets
an unload queued behind a load undo it (docs/upstream/triton.md, "Concurrency between calls"),
MLServer has no per-model lock at all (docs/mlserver.md, "Behaviour").
"""

from __future__ import annotations

import asyncio


class ModelTurns:
    """One asyncio.Lock per model name; a lock is dropped once nobody holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    async def acquire(self, name: str, timeout: float) -> None:
        """Take ``name``'s turn within ``timeout`` s; TimeoutError if it did not come."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._users[name] = self._users.get(name, 0) + 1
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await lock.acquire()
        except BaseException:
            self._drop(name)
            raise

    def release(self, name: str) -> None:
        self._locks[name].release()
        self._drop(name)

    def _drop(self, name: str) -> None:
        self._users[name] -= 1
        if not self._users[name]:
            del self._users[name], self._locks[name]
