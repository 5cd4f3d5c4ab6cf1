"""The pure planner: which loads start, which idle models are unloaded first, what waits and why.

``plan(ledger, caps, policy, now) -> Plan`` reads the ledger and changes nothing, so it is
tested in milliseconds with no node, and ``tfscache simulate`` calls the same function as
the live cache (the simulator and the cache cannot disagree). The rules:

1. already over a cap (the caps shrank, or a load measured above its estimate): idle
   models go in the policy's order until the node fits again;
2. pending loads in order of waiting requests (most first, ties: oldest), each admitted
   while the caps allow, taking idle victims in the policy's order; the first that cannot
   fit even with every idle model gone blocks itself and every load behind it (it waits
   for a lease to end, up to ``room_timeout_s``);
3. a load retried because the node ran out of memory on its first try (``Pending.room``)
   also takes idle victims, in the policy's order, until their bytes reach its own, whether
   or not a cap needs them (the node's memory, not a cap, ran out; docs/tiers.md);
4. only READY models without a lease or a pin are ever victims, and a model's bytes count
   until the node reports it gone, so the caps hold at every instant; after that, under a
   memory or GPU cap, they count until measured free (``waits_for_freed_memory``: the
   admitted loads wait for them, no further victim is taken).

With demotion on (``cache.demote = "host"``, docs/tiers.md), the caller names the idle
versions that may leave the GPU for host memory (``demotable``: on the GPU tier, a kind that can
run them on CPU, ``tiers.demote_pays``). A victim taken only for GPU room (the count and host
caps fit without it) that is demotable is demoted (``Plan.demote``) instead of unloaded: it
frees its GPU bytes and keeps its host bytes and its place under the count cap. A victim of
another cap, or of the host tier, is unloaded. ``promote`` names host-tier versions to bring
back to the GPU (``tiers.PromoteRule``): after the pending loads, each goes while GPU room can be
made for it (``Plan.promote``); one that cannot waits. With neither, the plan is today's.

A third cap, ``gpu_bytes``, bounds the GPU memory of the models (``Entry.gpu``, learned from
the growth across a load; tfscache.kinds.gpumem). A model never loaded before counts 0 GPU bytes
until its first load is measured; if that load takes the node over the GPU cap, rule 1
unloads idle models until it fits again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tfscache.cache.ledger import READY, UNLOADING, Key, Ledger, Pending
from tfscache.cache.policy import EvictionPolicy

_MAX_HOLDERS_NAMED = 20
OOM_GROWTH = 1.5  # a version the node ran out of memory with is taken to need this much more


@dataclass(frozen=True)
class Caps:
    """A node's caps; 0 is no cap."""

    max_models: int = 0
    memory_bytes: int = 0
    gpu_bytes: int = 0

    def fit(self, count: int, used: int, gpu: int = 0) -> bool:
        return (
            (not self.max_models or count <= self.max_models)
            and (not self.memory_bytes or used <= self.memory_bytes)
            and (not self.gpu_bytes or gpu <= self.gpu_bytes)
        )


@dataclass
class Plan:
    """What the reloader does next, in this order: unload ``victims``, then load ``admit``."""

    victims: list[Key] = field(default_factory=list)
    admit: list[Key] = field(default_factory=list)
    blocked: list[Key] = field(default_factory=list)  # pending loads waiting for room
    demote: list[Key] = field(default_factory=list)  # GPU victims that go to host memory instead
    promote: list[Key] = field(default_factory=list)  # host-tier versions to move to the GPU
    over_cap: bool = False  # still over a cap with nothing idle to unload: the next release matters


def plan(ledger: Ledger, caps: Caps, policy: EvictionPolicy, now: float, *,
         demotable: Collection[Key] = (), promote: Sequence[Key] = ()) -> Plan:
    """Choose victims and admit pending loads, in priority order, within ``caps``; demote the
    ``demotable`` victims taken for GPU room only, and promote ``promote`` where room is made."""
    entries = ledger.entries
    room = _Room(caps, entries, demotable, len(entries), ledger.used(), ledger.gpu_used())
    idle = [k for k in ledger.idle() if k not in promote]
    room.order = list(policy.victims(idle, now)) if idle else []
    result = Plan()
    while not room.fits() and room.more():  # over a cap already
        room.take()
    room.commit(result)
    result.over_cap = not room.fits()
    blocked = False
    for pending in ledger.queue():
        if not blocked:
            trial = room.trial(1, pending.estimate, ledger.gpu_estimate(pending.key))
            while (not trial.fits() or trial.freed < pending.room) and trial.more():
                trial.take(unload=trial.freed < pending.room and trial.fits())
            blocked = not trial.fits()
        if blocked:  # it, and everything behind it, waits for room
            result.blocked.append(pending.key)
            continue
        room = trial.commit(result)
        result.admit.append(pending.key)
    for key in promote if not blocked else ():
        trial = room.trial(0, 0, entries[key].gpu)
        while not trial.fits() and trial.more():
            trial.take()
        if trial.fits():
            room = trial.commit(result)
            result.promote.append(key)
    return result


class _Room:
    """What the node holds while a plan is made: count, host and GPU bytes, the victims taken so
    far (``order[:pos]``), and what one more load or promotion would add (``add``)."""

    def __init__(self, caps: Caps, entries, demotable, count: int, used: int, gpu: int) -> None:
        self.caps, self.entries, self.demotable = caps, entries, demotable
        self.count, self.used, self.gpu = count, used, gpu
        self.order: list[Key] = []
        self.pos, self.freed, self.add = 0, 0, (0, 0, 0)
        self.unloads: list[Key] = []
        self.demotes: list[Key] = []

    def trial(self, count: int, used: int, gpu: int) -> _Room:
        """A copy with nothing taken yet that would add ``count`` models and those bytes."""
        other = _Room(self.caps, self.entries, self.demotable, self.count, self.used, self.gpu)
        other.order, other.pos, other.add = self.order, self.pos, (count, used, gpu)
        return other

    def fits(self, gpu: bool = True) -> bool:
        c, u, g = self.add
        return self.caps.fit(self.count + c, self.used + u, self.gpu + g if gpu else 0)

    def more(self) -> bool:
        return self.pos < len(self.order)

    def take(self, unload: bool = False) -> None:
        """The next victim in the policy's order: demoted when only the GPU cap needs room and it
        may be (``unload``: never, the node's memory needs its bytes), else unloaded."""
        key = self.order[self.pos]
        victim, self.pos = self.entries[key], self.pos + 1
        if not unload and key in self.demotable and self.fits(gpu=False):
            self.demotes.append(key)
            self.gpu -= victim.gpu_held
            return
        self.unloads.append(key)
        self.count, self.used, self.gpu = (self.count - 1, self.used - victim.bytes,
                                           self.gpu - victim.gpu_held)
        self.freed += victim.bytes

    def commit(self, result: Plan) -> _Room:
        """Record the victims taken in ``result``; this room, with what it adds, from now on."""
        result.victims += self.unloads
        result.demote += self.demotes
        c, u, g = self.add
        self.count, self.used, self.gpu = self.count + c, self.used + u, self.gpu + g
        self.add, self.unloads, self.demotes = (0, 0, 0), [], []
        return self


def plan_prefetch(ledger: Ledger, caps: Caps, policy: EvictionPolicy, now: float, *,
                  victims: bool) -> tuple[Key, list[Key]] | None:
    """The prefetch to load now and its victims, or None: only with idle room (docs/prefetch.md).

    Idle room: no real load waits for room (``ledger.queue``, once this step's loads are
    admitted), and no unloaded memory is still counted (``ledger.freeing``). The first queued
    prefetch that fits goes, taking free room, else (``victims``) idle victims in the policy's
    order among only those it ranks colder than the prefetched model would be once requested
    (``EvictionPolicy.colder_than``): never a leased, pinned or loading model, and never one
    hotter than it by the policy's own measure. Versions already leaving (UNLOADING: this step
    unloads them before it loads) do not count.
    """
    if ledger.queue() or ledger.freeing():
        return None
    staying = [e for e in ledger.entries.values() if e.state != UNLOADING]
    base = (len(staying), sum(e.bytes for e in staying), sum(e.gpu_held for e in staying))
    for pending in ledger.prefetches():
        count, used, gpu = (
            base[0] + 1,
            base[1] + pending.estimate,
            base[2] + ledger.gpu_estimate(pending.key),
        )
        take = []
        colder = iter(policy.colder_than(ledger.idle(), pending.key, now) if victims else ())
        while not caps.fit(count, used, gpu):
            victim = next(colder, None)
            if victim is None:
                break
            take.append(victim)
            entry = ledger.entries[victim]
            count, used, gpu = count - 1, used - entry.bytes, gpu - entry.gpu_held
        if caps.fit(count, used, gpu):
            return pending.key, take
    return None


def waits_for_freed_memory(ledger: Ledger, caps: Caps) -> bool:
    """Whether loads admitted now must wait before going to the node: counting the memory of
    versions it reported gone but has not given back (``Ledger.freeing``), it is over a cap.

    ``plan`` itself leaves those bytes out: they leave without an unload, so taking more
    victims for them would evict models for nothing; the reloader holds the batch back
    instead until they are measured free (tfscache/cache/freeing.py)."""
    host, gpu = ledger.freeing_bytes()
    return bool(host or gpu) and not caps.fit(
        len(ledger.entries), ledger.used() + host, ledger.gpu_used() + gpu
    )


def room_message(ledger: Ledger, caps: Caps, pending: Pending, node: str, timeout_s: float) -> str:
    """RESOURCE_EXHAUSTED text for a load that waited ``timeout_s`` for room: which cap, what holds it."""
    entries = ledger.entries
    used = ledger.used()
    reached = []
    if caps.max_models and len(entries) + 1 > caps.max_models:
        reached.append(f"max_models={caps.max_models} reached")
    if caps.memory_bytes and used + pending.estimate > caps.memory_bytes:
        reached.append(f"memory_bytes={caps.memory_bytes} reached ({used} bytes in use, "
                       f"{pending.estimate} more needed)")
    need = ledger.gpu_estimate(pending.key)
    if caps.gpu_bytes and ledger.gpu_used() + need > caps.gpu_bytes:
        reached.append(f"gpu_bytes={caps.gpu_bytes} reached ({ledger.gpu_used()} GPU bytes in use, "
                       f"{need} more needed)")
    name, version = pending.key
    return (f"No room on node {node} to load model {name} version {version} "
            f"within {timeout_s} s: {' and '.join(reached) or 'a cap was reached'}; "
            f"held by {holders(ledger)}")


def room_victims(ledger: Ledger, policy: EvictionPolicy, key: Key, need: int,
                 now: float) -> list[Key]:
    """Idle versions other than ``key``, in the policy's order, until their bytes reach ``need``
    (at least one, if any is idle): the room made when the node ran out of memory serving
    ``key`` (tfscache.cache.manager.CacheManager.out_of_memory)."""
    idle = [k for k in ledger.idle() if k != key]
    taken, freed = [], 0
    for victim in policy.victims(idle, now) if idle else ():
        if taken and freed >= need:
            break
        taken.append(victim)
        freed += ledger.entries[victim].bytes
    return taken


def grown(size: int) -> int:
    """The bytes a version is taken to need after the node ran out of memory with ``size``."""
    return int(size * OOM_GROWTH) + 1


def oom_message(ledger: Ledger, caps: Caps, key: Key, node: str, doing: str,
                unloaded: list[Key] | None) -> str:
    """RESOURCE_EXHAUSTED text when the node ran out of memory ``doing`` ``key`` a second time,
    after ``unloaded`` were unloaded to make room (None: idle versions, as planner rule 3 took
    them): the caps and what holds the node, never the node's own (CUDA) text."""
    name, version = key
    if unloaded is None:
        made = "after idle models were unloaded to make room"
    elif unloaded:
        made = f"after unloading {', '.join(f'{n} version {v}' for n, v in unloaded)}"
    else:
        made = "with no idle model to unload"
    limits = ", ".join(f"{field}={value}" for field, value in (
        ("max_models", caps.max_models), ("memory_bytes", caps.memory_bytes),
        ("gpu_bytes", caps.gpu_bytes)) if value) or "none set"
    return (f"Out of memory on node {node} {doing} model {name} version {version}: it ran out "
            f"again {made}; caps: {limits}; held by {holders(ledger)}")


def holders(ledger: Ledger) -> str:
    """The versions on the node and what holds each, the first 20 by name."""
    entries = ledger.entries
    named = [
        f"{n} version {v} ({_holding(e)})"
        for (n, v), e in list(entries.items())[:_MAX_HOLDERS_NAMED]
    ]
    if len(entries) > _MAX_HOLDERS_NAMED:
        named.append(f"and {len(entries) - _MAX_HOLDERS_NAMED} more")
    named += [
        f"{', '.join(f'{n} version {v}' for n, v in f.keys)} (unloaded, {f.bytes} bytes not yet "
        f"measured free)"
        for f in ledger.freeing()
    ]
    return ", ".join(named) or "nothing"


def _holding(entry) -> str:
    if entry.state == READY:
        return f"{entry.leases} lease{'s' if entry.leases != 1 else ''}, {entry.bytes} bytes"
    return f"{entry.state}, {entry.bytes} bytes"


def share_growth(
    weights: Mapping[Key, int], before: int | None, after: int | None
) -> dict[Key, int]:
    """The GPU growth across one load batch, shared by ``weights`` (their host bytes); {} when unknown.

    A model whose load freed more than it took (an allocator returning a cache) is 0, not
    negative. Equal weights (all 0 included) share the growth equally.
    """
    if before is None or after is None or not weights:
        return {}
    growth = max(after - before, 0)
    total = sum(weights.values())
    if total <= 0:
        return {key: growth // len(weights) for key in weights}
    return {key: int(growth * weight / total) for key, weight in weights.items()}
