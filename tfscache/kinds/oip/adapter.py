"""The node adapter both Open Inference Protocol kinds build on: the cache's wanted set as
per-model repository loads and unloads, one name at a time.

What Triton and MLServer share, and what this base does about it:

* a key is ``(name, version)``, but both servers load and unload whole names: ``sync`` unloads
  every name none of whose READY versions is wanted, then loads the wanted keys not READY;
* neither serializes a load and an unload of one name: each takes the name's turn (``ModelTurns``),
  held until the load is confirmed or the unload awaited; names are taken in order, so two batches
  never wait on each other;
* a load has no timeout on the node and cannot be cancelled there: past the cache's deadline the key
  is DEADLINE_EXCEEDED and a background task keeps the name's turn until the load ends on the node,
  then unloads it (a failed key must not stay on the node); a new load of the name waits for that
  task within its own deadline;
* a key whose directory vanished from the repository is not sent to the node.

A kind subclasses ``OipAdapter`` with its dialect: ``_load_one`` (send the load, confirm the
version), ``unload`` (and how its end is awaited), ``available``, ``_vanished`` (the error of a key
whose directory is gone), ``product`` (its name in texts) and ``log`` (its logger).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any

from tfscache import errors
from tfscache.cache.ledger import Key
from tfscache.kinds.nodepid import NodeMemory
from tfscache.kinds.oip.repository import OipRepositoryChannel
from tfscache.kinds.oip.turns import ModelTurns
from tfscache.repository.local import ModelRepository


class OipAdapter:
    """One node behind its gRPC repository API (an ``OipRepositoryChannel`` of its kind)."""

    sizes_on_disk = False  # whether a model's size on disk predicts its memory (cache.adapter)
    # each model loads by its own call: a batch's loads end apart (cache.adapter)
    loads_apart = True
    demotes_in_place = False  # moves models between the GPU and host tiers in place (cache.adapter)
    product = "the node"  # the server's name in texts ("... cannot cancel a load")
    log = logging.getLogger("tfscache.kinds.oip.adapter")  # a kind keeps its own logger name

    def __init__(self, client: OipRepositoryChannel, repository: ModelRepository, *,
                 rpc_deadline_s: float = 10.0, memory: NodeMemory | None = None) -> None:
        self.client = client
        self.target = client.target
        self.repository = repository
        self.rpc_deadline_s = rpc_deadline_s
        self._memory = memory or NodeMemory(None)
        self._turns = ModelTurns()
        self._abandoned: dict[str, asyncio.Task] = {}

    async def wait_ready(self, timeout: float) -> bool:
        return await self.client.wait_ready(timeout)

    async def sync(self, wanted: Sequence[Key], deadline_s: float) -> None:
        """Unload every name none of whose READY versions is wanted (waiting until gone), then load
        the wanted keys not READY; a load that fails is logged (``available`` tells)."""
        deadline = time.monotonic() + deadline_s
        index = await self.client.index(ready=True, deadline_s=self._rpc_left(deadline))
        ready = await self._index_keys(index)
        want = set(wanted)
        kept = {name for name, version in ready if (name, version) in want}
        extra = sorted(key for key in ready if key[0] not in kept)
        if extra:
            await self.unload(extra, wanted, left(deadline))
        missing = sorted(want - ready)
        if not missing:
            return
        for (name, version), error in (await self.load(missing, wanted, left(deadline))).items():
            if error is None:
                continue
            if isinstance(error, errors.Unavailable) or not isinstance(error, errors.TfscacheError):
                raise error
            self.log.warning(
                "node %s: loading %s version %s again failed: %s: %s",
                self.target,
                name,
                version,
                error.grpc_code.name,
                error.message,
            )

    async def _index_keys(self, index) -> set[Key]:
        """The keys of index entries (versions named by their numbers; a kind with version names
        reads them through the repository)."""
        return {(e.name, int(e.version)) for e in index if e.version.isdigit()}

    async def load(self, keys: Sequence[Key], wanted: Sequence[Key],
                   deadline_s: float) -> dict[Key, Exception | None]:
        deadline = time.monotonic() + deadline_s
        # A key's directory may have gone since the cache chose it.
        gone = set(await asyncio.to_thread(self.repository.vanished, keys))
        results: dict[Key, Exception | None] = {key: self._vanished(key) for key in gone}
        keys = [k for k in keys if k not in gone]
        outcomes = await asyncio.gather(
            *(self._load_one(k, wanted, deadline, deadline_s) for k in keys), return_exceptions=True
        )
        results.update(zip(keys, outcomes))
        return results

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key], deadline_s: float) -> None:
        raise NotImplementedError

    async def available(self, key: Key, deadline_s: float) -> bool:
        raise NotImplementedError

    @property
    def node_pid(self) -> int | None:
        """The server process measured (found again when it was replaced), if known."""
        return self._memory.pid

    def memory(self) -> int | None:
        """RSS of the server plus its children (Triton's Python-backend stubs, MLServer's inference
        workers: they hold the models); finds a replaced server again."""
        return self._memory.rss(children=True)

    def restarted(self) -> bool:
        return self._memory.replaced()

    async def close(self) -> None:
        """Stop watching loads that passed their deadline (the node keeps whatever they load)."""
        tasks = list(self._abandoned.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _load_one(
        self, key: Key, wanted: Sequence[Key], deadline: float, within: float
    ) -> None:
        """Load ``key``'s model in its turn and confirm its version; raises the key's error. The
        turn is given back here, unless the kind handed it to a task that keeps it."""
        name = key[0]
        await self._turn(name, deadline, within)
        handed_over = [False]
        try:
            await self._load_in_turn(key, wanted, deadline, within, handed_over)
        finally:
            if not handed_over[0]:
                self._turns.release(name)

    async def _load_in_turn(self, key: Key, wanted: Sequence[Key], deadline: float,
                            within: float, handed_over: list[bool]) -> None:
        """The kind's load of ``key`` with its name's turn held; ``handed_over[0] = True`` once
        a task (``_abandon``) keeps the turn."""
        raise NotImplementedError

    def _vanished(self, key: Key) -> errors.TfscacheError:
        """The error of a key whose directory vanished from the repository."""
        raise NotImplementedError

    @staticmethod
    def missing(error: errors.ModelNotFound) -> errors.ModelNotFound:
        """The repository's NOT_FOUND as it is: the Open Inference Protocol's methods word a model
        or version the repository lacks for their clients (tfscache.frontend.protocols.oip)."""
        return error

    def _late(self, name: str, version: int, within: float) -> errors.DeadlineExceeded:
        """The error of a load that passed its deadline (and was handed to ``_abandon``)."""
        return errors.DeadlineExceeded(
            f"model {name} version {version} did not load on node {self.target} within {within} s; "
            f"{self.product} cannot cancel a load: it is unloaded once it ends")

    def _abandon(self, name: str, watch: Coroutine[Any, Any, None]) -> bool:
        """Hand ``name``'s turn to a task that runs ``watch`` (it unloads the name once its load
        ends on the node), then gives the turn back; True: the caller must not release it."""
        self.log.warning(
            "node %s: the load of model %s passed its deadline; %s cannot cancel it, so it "
            "is unloaded once it ends (a load that never ends needs a node restart)",
            self.target,
            name,
            self.product,
        )
        task = asyncio.create_task(self._keep_turn(name, watch),
                                   name=f"tfscache-{self.product.lower()}-abandon-{name}")
        self._abandoned[name] = task
        return True

    async def _keep_turn(self, name: str, watch: Coroutine[Any, Any, None]) -> None:
        try:
            await watch
        finally:
            self._abandoned.pop(name, None)
            self._turns.release(name)

    async def _turn(self, name: str, deadline: float, within: float) -> None:
        """Take ``name``'s turn by ``deadline``; DEADLINE_EXCEEDED if it did not come."""
        try:
            await self._turns.acquire(name, deadline - time.monotonic())
        except TimeoutError:
            late = " (a load that passed its deadline)" if name in self._abandoned else ""
            raise errors.DeadlineExceeded(
                f"model {name}: an earlier load or unload of it on node "
                f"{self.target} did not end within {within} s{late}"
            ) from None

    @asynccontextmanager
    async def _turns_of(
        self, names: Sequence[str], deadline: float, within: float
    ) -> AsyncIterator[None]:
        """Hold the turns of ``names``, taken in order (two batches never wait on each other)."""
        held: list[str] = []
        try:
            for name in names:
                await self._turn(name, deadline, within)
                held.append(name)
            yield
        finally:
            for name in held:
                self._turns.release(name)

    def _rpc_left(self, deadline: float) -> float:
        return min(self.rpc_deadline_s, left(deadline))


def left(deadline: float) -> float:
    """Seconds until ``deadline``; a millisecond at least, so a late call fails by its own deadline."""
    return max(0.001, deadline - time.monotonic())
