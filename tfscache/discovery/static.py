"""Static membership: the peer list of the TOML config file, re-read on demand (SIGHUP).

Nothing registers: every sidecar reads the same ``[ring] peers`` list, so
``register`` and ``deregister`` only remember this sidecar's own entry. The
caller's SIGHUP handler calls ``reload()``; a file that cannot be read or
parsed, or whose list is empty, leaves the membership as it was (logged once
per change of state) and ``reload()`` returns False.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable
from pathlib import Path

from tfscache.discovery import Discovery, DiscoveryError, Peer, parse_peers

log = logging.getLogger("tfscache.discovery.static")


def peers_from_file(path: str | Path) -> list[Peer]:
    """``[ring] peers`` of a TOML settings file, validated as at start-up (ValueError, OSError)."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    ring = data.get("ring", {})
    if not isinstance(ring, dict):
        raise ValueError("[ring] must be a table")
    raw = ring.get("peers", [])
    return parse_peers(raw)  # the same validation as settings.load


class StaticDiscovery(Discovery):
    """Membership = a fixed list of peers, or the list in ``config_file`` (re-read by ``reload``)."""

    name = "static"
    registration_note = (
        "static discovery: nothing to register; this sidecar is on the others' rings once "
        "their peers files list it (edit them, then SIGHUP)"
    )

    def __init__(self, peers: list[Peer] | None = None, config_file: str | Path | None = None,
                 loader: Callable[[], list[Peer]] | None = None, **options) -> None:
        super().__init__(**options)
        if loader is None and config_file:
            loader = lambda: peers_from_file(config_file)  # noqa: E731
        self._loader = loader
        self._initial = None if peers is None else list(peers)
        self._state = self._state_log(f"reading {config_file or 'the peer list'}", log)
        self.self_peer: Peer | None = None

    async def start(self) -> None:
        """The given list (even empty: a sidecar alone), else the file's; DiscoveryError if neither."""
        if self._initial is not None:
            await self._apply(self._initial)
        elif not await self.reload():
            raise DiscoveryError("static discovery: no peer list (give peers or a config file with "
                                 "[ring] peers)")

    async def reload(self) -> bool:
        """Re-read the config file's peer list (SIGHUP); False keeps the last known list."""
        if self._loader is None:
            return bool(self._members)
        try:
            peers = self._loader()
        except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
            self._state.failed(exc)
            return False
        if not peers:
            self._state.failed("the peer list is empty")
            return False
        self._state.ok()
        await self._apply(peers)
        return True

    async def register(self, peer: Peer) -> None:
        self.self_peer, self.label = peer, peer.name
        if self._members and peer.name not in {p.name for p in self._members}:
            log.warning("static discovery: this sidecar (%s) is not in the peer list", peer.name)

    async def deregister(self) -> None:
        self.self_peer = None

    async def stop(self) -> None:
        return None
