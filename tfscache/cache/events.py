"""What a node's cache reports as it works (tfscache.observe.metrics counts it)."""

from __future__ import annotations

from tfscache.cache.ledger import Key


class CacheEvents:
    """What a CacheManager reports as it works; these do nothing (tfscache.observe.metrics counts them).

    Called synchronously on the event loop: implementations must not block or raise.
    """

    def hit(self, key: Key) -> None:
        """An acquire found ``key`` resident."""

    def miss(self, key: Key) -> None:
        """An acquire had to wait for ``key``'s load (or was refused it)."""

    def prefetch_used(self, key: Key) -> None:
        """The running request is the first for ``key`` since a prefetch loaded it (in its task)."""

    def loaded(self, key: Key, seconds: float, size: int, measured: bool) -> None:
        """``key`` is AVAILABLE after a reload of ``seconds``; ``size`` bytes (measured or estimated)."""

    def load_failed(self, key: Key, seconds: float, error: Exception) -> None:
        """Loading ``key`` failed with ``error``."""

    def room_waited(self, key: Key, seconds: float) -> None:
        """``key``'s load waited ``seconds`` for room under the caps (admitted, or timed out)."""

    def evicted(self, key: Key, reason: str, size: int) -> None:
        """``key`` leaves the node's config: capacity, vanished, node_lost, ..."""

    def unloaded(self, key: Key, seconds: float, size: int) -> None:
        """The node reported END for ``key``, ``seconds`` after its config went out."""
