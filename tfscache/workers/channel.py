"""The channel between the control process and one worker: a Unix socket in the state directory,
messages as length-prefixed JSON (4 bytes, big-endian) on asyncio streams at both ends.

Every message is a JSON object with an ``op``. Worker -> control: ``hello`` (its index and pid),
``want`` (a delegation for a name and version asked), ``report`` (usage every <= 100 ms), ``ack``
(a revocation is done). Control -> worker: ``grant``, ``refuse``, ``revoke``, ``health``, ``stop``.
Messages on one channel arrive in the order sent, which the delegation protocol relies on: a grant
sent before a revoke of the same version is applied before that revoke (tfscache.workers.delegation).
"""

from __future__ import annotations

import asyncio
import json
import struct

_HEADER = struct.Struct(">I")
MAX_MESSAGE_BYTES = 64 << 20


class ChannelClosed(ConnectionError):
    """The other end went away."""


class Channel:
    """One end of the channel: ``send`` a message, ``receive`` the next (``ChannelClosed`` at the end)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    def send(self, message: dict) -> None:
        """Queue ``message`` (no wait: the stream's buffer takes it; ``drain`` waits for it to go)."""
        if self._writer.is_closing():
            raise ChannelClosed("channel closed")
        body = json.dumps(message, separators=(",", ":")).encode()
        self._writer.write(_HEADER.pack(len(body)) + body)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise ChannelClosed(str(exc)) from exc

    async def receive(self) -> dict:
        try:
            header = await self._reader.readexactly(_HEADER.size)
            (size,) = _HEADER.unpack(header)
            if size > MAX_MESSAGE_BYTES:
                raise ChannelClosed(f"message of {size} bytes over the limit")
            return json.loads(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ChannelClosed("channel closed") from exc

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def connect(path: str) -> Channel:
    reader, writer = await asyncio.open_unix_connection(path)
    return Channel(reader, writer)
