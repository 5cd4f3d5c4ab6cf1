"""Delegated leases, as pure bookkeeping (no I/O): what a worker holds, and what the control
process granted (docs/workers.md).

A *delegation* lets a worker serve one model version on one node with a local in-flight count
instead of a lease from the control process's cache. The worker side (``Delegations``) maps the
key a request asks for (``(name, version)``, version None for "latest") to a ``Grant``; the
control side (``Grants``) remembers which worker holds which node version, so that it can revoke
them before the version leaves its node.

Revocation, on the worker: ``Delegations.revoke`` takes the matching grants out of the table at
once (new requests for them take the cold path through the control process) and returns them;
``Grant.idle`` is set once their in-flight requests have finished, and only then does the worker
acknowledge. On the control side ``Grants.revoke`` returns a ``Revocation`` whose ``done`` event is
set once every holder acknowledged or died (``worker_gone`` drops a dead worker's grants at once and
stops every revocation waiting for it).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

# (node, name, version): a model version resident on one node of the control process
Held = tuple[str, str, int]
# (name, version asked): version None is "latest"
Asked = tuple[str, int | None]


@dataclass(eq=False)
class Grant:
    """One delegation a worker holds: requests for ``asked`` go to ``node`` (``held``) directly."""

    asked: Asked
    held: Held
    grpc: str  # the node's gRPC address
    rest: str | None  # the node's REST address (None: it has none)
    # monotonic; "latest" grants expire (the repository's rescan interval)
    expires: float | None = None
    in_flight: int = 0
    revoked: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


@dataclass
class Usage:
    """What a worker did with one node version since its last report."""

    requests: int = 0
    used_at: float = 0.0  # wall clock: the last use
    in_flight: int = 0


class Delegations:
    """The worker's table: asked key -> grant, in-flight counts, and usage for the next report."""

    def __init__(self, clock=time.monotonic, wall=time.time) -> None:
        self._grants: dict[Asked, Grant] = {}
        self._usage: dict[Held, Usage] = {}
        self._clock = clock
        self._wall = wall
        self.wanted: set[Asked] = set()  # asked of the control process, no answer yet

    def __len__(self) -> int:
        return len(self._grants)

    def add(self, grant: Grant) -> None:
        """The control process granted ``grant`` (it replaces an older one for the same key)."""
        self.wanted.discard(grant.asked)
        self._grants[grant.asked] = grant

    def refused(self, asked: Asked) -> None:
        """The control process would not delegate ``asked`` now; the next cold request asks again."""
        self.wanted.discard(asked)

    def want(self, asked: Asked) -> bool:
        """Whether to ask the control process for ``asked`` (not held, not already asked)."""
        if asked in self._grants or asked in self.wanted:
            return False
        self.wanted.add(asked)
        return True

    def begin(self, asked: Asked) -> Grant | None:
        """A request for ``asked`` starts: its grant with the in-flight count taken, or None (cold path)."""
        grant = self._grants.get(asked)
        if grant is None:
            return None
        if grant.expires is not None and self._clock() >= grant.expires:
            del self._grants[asked]
            return None
        grant.in_flight += 1
        grant.idle.clear()
        usage = self._usage.get(grant.held)
        if usage is None:
            usage = self._usage[grant.held] = Usage()
        usage.requests += 1
        usage.in_flight += 1
        usage.used_at = self._wall()
        return grant

    def end(self, grant: Grant) -> None:
        """A request ``begin`` let through finished (whatever its outcome)."""
        grant.in_flight -= 1
        usage = self._usage.get(grant.held)
        if usage is not None:
            usage.in_flight -= 1
        if grant.in_flight == 0:
            grant.idle.set()

    def drop(self, grant: Grant) -> None:
        """The node did not serve ``grant`` (it went away or lost the model): cold path from now on."""
        if self._grants.get(grant.asked) is grant:
            del self._grants[grant.asked]

    def revoke(self, held: Held) -> list[Grant]:
        """Stop starting requests on ``held``; the grants to wait for (``Grant.idle``) before the ack."""
        gone = [g for g in self._grants.values() if g.held == held]
        for grant in gone:
            grant.revoked = True
            del self._grants[grant.asked]
        return gone

    def revoke_all(self) -> list[Grant]:
        """Every grant (the worker is stopping, or the control process asked)."""
        gone = list(self._grants.values())
        for grant in gone:
            grant.revoked = True
        self._grants.clear()
        return gone

    def report(self) -> list[list]:
        """``[node, name, version, requests, last_use, in_flight]`` per node version used since the
        last report (or with requests still in flight); the counts start again from zero."""
        rows = [[*held, u.requests, u.used_at, u.in_flight] for held, u in self._usage.items()
                if u.requests or u.in_flight]
        for held, usage in list(self._usage.items()):
            if usage.in_flight == 0:
                del self._usage[held]
            else:
                usage.requests = 0
        return rows


@dataclass(eq=False)
class Revocation:
    """One revocation of ``held``: ``done`` once every worker in ``waiting`` acknowledged or died."""

    held: Held
    id: int
    waiting: set[int]
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if not self.waiting:
            self.done.set()


class Grants:
    """The control process's table: which worker holds which node version, and revocations pending."""

    def __init__(self) -> None:
        self._holders: dict[Held, set[int]] = {}
        self._pending: dict[int, Revocation] = {}
        self._ids = itertools.count(1)

    def granted(self, worker: int, held: Held) -> None:
        """``worker`` was sent a grant on ``held``."""
        self._holders.setdefault(held, set()).add(worker)

    def holders(self, held: Held) -> set[int]:
        return set(self._holders.get(held, ()))

    def held_by(self, worker: int) -> list[Held]:
        return [held for held, workers in self._holders.items() if worker in workers]

    def held_for(self, node: str, name: str) -> list[Held]:
        """Every version of ``name`` on ``node`` some worker holds."""
        return [held for held in self._holders if held[0] == node and held[1] == name]

    def revoke(self, held: Held) -> Revocation:
        """Revoke ``held`` from every holder (who then holds it no more): send each a revoke with
        ``Revocation.id`` and wait for ``done``."""
        revocation = Revocation(held, next(self._ids), self._holders.pop(held, set()))
        if not revocation.done.is_set():
            self._pending[revocation.id] = revocation
        return revocation

    def acked(self, worker: int, revocation_id: int) -> None:
        """``worker`` has no request in flight on the revoked version any more."""
        revocation = self._pending.get(revocation_id)
        if revocation is not None:
            self._settle(revocation, worker)

    def worker_gone(self, worker: int) -> None:
        """``worker`` died or stopped: its grants go, and no revocation waits for it any more."""
        for held in [h for h, workers in self._holders.items() if worker in workers]:
            self._holders[held].discard(worker)
            if not self._holders[held]:
                del self._holders[held]
        for revocation in list(self._pending.values()):
            self._settle(revocation, worker)

    def pending(self) -> list[Revocation]:
        return list(self._pending.values())

    def _settle(self, revocation: Revocation, worker: int) -> None:
        revocation.waiting.discard(worker)
        if not revocation.waiting:
            revocation.done.set()
            self._pending.pop(revocation.id, None)
