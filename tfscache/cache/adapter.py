"""The node adapter: how the cache's reloader drives one kind of model server.

The reloader decides which model versions a node should serve; an adapter makes the
node do it, in the node's own API, and reports what the node did. The reloader never
sees a config file or an RPC. Each node kind has one adapter class, named by its row in
``tfscache.kinds.table.KINDS``.

Contract (every method may raise ``tfscache.errors.TfscacheError``; ``Unavailable`` and
``DeadlineExceeded`` mean the node cannot be reached or did not answer in time, and the
reloader then marks it unhealthy and recovers it):

* ``target``: the node's name in logs and errors.
* ``client``: the node's client (the kind's), for the cache's and the admin's questions.
* ``lost_texts``: how the node's NOT_FOUND message starts for a model it does not serve
  (it restarted and lost it): a request under a lease that gets one makes the cache recheck.
* ``missing(error) -> ModelNotFound``: the repository's neutral NOT_FOUND (``error.neutral``;
  ``error.name``, ``error.version``) in the words this kind's server uses for a model or version
  it does not have; any other error unchanged. The CacheManager words every NOT_FOUND it raises
  so (its requests, preloads, pins and probes), so clients of the kind hear their server's text.
* ``sizes_on_disk``: whether a model's size on disk predicts its memory (TF Serving: its
  variables; a Triton Python-backend model allocates in ``initialize()``). When False, a model
  never loaded before is estimated at least at the node's typical learned size.
* ``loads_apart``: whether ``load`` calls for different keys run concurrently on the node, each
  returning when its own keys settled (Triton, MLServer: a load call per model). Then a prefetch
  loads beside a real load without delaying it (tfscache.cache.reloader); TF Serving's reload waits
  for every model it adds, so there a prefetch loads only when the node has nothing else to load.
* ``demotes_in_place``: whether the node moves a loaded model between the GPU and host tiers
  without unloading it (Triton, with ``cache.demote = host``: tfscache.kinds.triton.tiers). Only
  then does the reloader call ``can_demote(key) -> bool`` (whether ``key`` may leave the GPU: its
  backend runs on CPU) and ``await move(key, tier, deadline_s)`` (``tier``: ``host`` to demote,
  ``gpu`` to promote; returns once the node serves ``key`` from there; it answers throughout).
* ``await wait_ready(timeout) -> bool``: wait until the node accepts connections.
* ``await sync(wanted, deadline_s)``: make the node serve exactly ``wanted`` (keys), and
  nothing else, without waiting for loads (start-up re-adoption, recovery, restore).
* ``await load(keys, wanted, deadline_s) -> {key: error or None}``: the node serves
  ``wanted`` (which contains ``keys``); returns once each of ``keys`` is AVAILABLE (None)
  or failed (its error, as a request would get it). A failed key must not stay wanted on
  the node (TF Serving keeps a failed version sticky; its adapter removes it).
* ``await unload(keys, wanted, deadline_s)``: the node serves ``wanted`` (without ``keys``);
  returns once the node reports each of ``keys`` gone: the caps hold at every instant. Every
  unload the reloader carries out is this one call (``Reloader.unload``), after the cache's
  ``before_unload`` hook, if any, was awaited (tfscache.workers revokes its delegations there).
* ``await available(key, deadline_s) -> bool``: whether the node serves ``key`` now.
* ``memory() -> int | None``: bytes resident in the node's process tree now (blocking:
  the reloader calls it in a worker thread); None when it cannot be measured.
* ``restarted() -> bool``: whether the node's process was replaced since the last call
  (blocking, as ``memory``); False when the process is not known.
* ``await close()``, optional: the cache manager stopped (its node exited, or tfscache is
  stopping); the adapter ends its own tasks (OipAdapter: the loads it still watches past their
  deadline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tfscache import errors
from tfscache.cache.ledger import Key


class NodeAdapter(Protocol):
    """One node of one kind, as the reloader sees it."""

    target: str
    client: object
    lost_texts: tuple[str, ...]
    sizes_on_disk: bool
    loads_apart: bool
    demotes_in_place: bool

    async def wait_ready(self, timeout: float) -> bool: ...

    async def sync(self, wanted: Sequence[Key], deadline_s: float) -> None: ...

    async def load(self, keys: Sequence[Key], wanted: Sequence[Key],
                   deadline_s: float) -> dict[Key, Exception | None]: ...

    async def unload(self, keys: Sequence[Key], wanted: Sequence[Key],
                     deadline_s: float) -> None: ...

    async def available(self, key: Key, deadline_s: float) -> bool: ...

    def memory(self) -> int | None: ...

    def restarted(self) -> bool: ...

    def missing(self, error: errors.ModelNotFound) -> errors.ModelNotFound: ...

