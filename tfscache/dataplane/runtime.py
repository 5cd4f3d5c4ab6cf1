"""HAProxy's runtime API over its unix socket: one command per connection, async.

The management guide's commands used here: ``add map``, ``set map``, ``del map``, ``show map``,
``show table``, ``clear table``, ``show stat`` and ``show info``. HAProxy answers a command and
closes the connection (no ``prompt``); commands joined by ``;`` on one line run in order, each
answer ending in an empty line.

During a reload an old worker may still accept on the socket for a moment, and its answer is
not the new worker's: a route it drops stays in the new one. So once ``worker`` is set (the
supervisor sets it to the worker it started), each command goes as ``show info; COMMAND`` and
counts only if that worker answered (its ``Pid``); another's answer is a RuntimeApiError, and
the caller asks again as it would a HAProxy restarting.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

_ENTRY = re.compile(r"^0x[0-9a-f]+: key=(\S+) use=\d+ exp=\d+(?: shard=\d+)?(.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_PID = re.compile(r"^Pid: (\d+)$", re.MULTILINE)
# A stick-table key ``clear_keys`` may name: one word that needs no escaping on the command line.
_KEY = re.compile(r"^[A-Za-z0-9._-]{1,256}$")
# clear_keys' commands per connection: well under the CLI's line (tune.bufsize, 16k by default)
CLEAR_LINE_MAX = 8192
# ``clear table ... key`` of an entry a request in flight still tracks: it stays
_IN_USE = "Entry currently in use, cannot remove"


class RuntimeApiError(Exception):
    """HAProxy refused a runtime command, or its socket did not answer."""


@dataclass(frozen=True)
class Usage:
    """One stick-table entry: requests in flight now, and requests counted since it was made."""

    in_flight: int
    requests: int


def parse_table(answer: str) -> dict[str, Usage]:
    """``show table``'s answer: each key with its ``conn_cur`` and ``http_req_cnt``."""
    usage = {}
    for line in answer.splitlines():
        match = _ENTRY.match(line.strip())
        if match:
            fields = {k: int(v) for k, v in _FIELD.findall(match.group(2))}
            usage[match.group(1)] = Usage(fields.get("conn_cur", 0), fields.get("http_req_cnt", 0))
    return usage


class Runtime:
    def __init__(self, socket_path: Path, timeout_s: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self.worker: int | None = None  # the worker whose answers count (None: any)

    async def command(self, line: str) -> str:
        """Send one command and return HAProxy's whole answer (``worker``'s, when it is set)."""
        if "\n" in line or ";" in line:
            raise ValueError(f"one runtime command at a time: {line!r}")
        return await self._counted(line)

    async def _counted(self, line: str) -> str:
        """``line``'s answer if ``worker`` (when set) gave it."""
        worker = self.worker
        if worker is None:
            return await self._ask(line)
        info, _, answer = (await self._ask(f"show info; {line}")).partition("\n\n")
        pid = _pid(info)
        if pid != worker:
            raise RuntimeApiError(f"haproxy worker {pid} answered {line!r}, not worker {worker} "
                                  "(a reload under way)")
        return answer

    async def worker_pid(self) -> int | None:
        """The pid of the worker that answers now."""
        return _pid(await self._ask("show info"))

    async def _ask(self, line: str) -> str:
        try:
            return await asyncio.wait_for(self._send(line), self.timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise RuntimeApiError(f"haproxy runtime API {self.socket_path}: {e!r}") from e

    async def _send(self, line: str) -> str:
        reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await reader.read()).decode(errors="replace")
        finally:
            writer.close()
            await writer.wait_closed()

    async def set_map(self, map_path: Path, key: str, value: str) -> None:
        """``key`` -> ``value`` in the map, in one step whether or not ``key`` was there."""
        answer = await self.command(f"set map {map_path} {key} {value}")
        if "entry not found" in answer.lower():
            answer = await self.command(f"add map {map_path} {key} {value}")
        _check(answer, f"map {map_path} {key} -> {value}")

    async def del_map(self, map_path: Path, key: str) -> None:
        """Drop ``key`` from the map; nothing to do if it is not there."""
        answer = await self.command(f"del map {map_path} {key}")
        if "not found" not in answer.lower():
            _check(answer, f"del map {map_path} {key}")

    async def show_map(self, map_path: Path) -> dict[str, str]:
        entries = {}
        for line in (await self.command(f"show map {map_path}")).splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith("0x"):
                entries[parts[1]] = parts[2]
        return entries

    async def table(self, name: str) -> dict[str, Usage]:
        """Each key of stick table ``name`` with its ``conn_cur`` and ``http_req_cnt``."""
        return parse_table(await self.command(f"show table {name}"))

    async def clear_keys(self, name: str, keys: list[str]) -> None:
        """Drop ``keys`` from stick table ``name``, a few hundred to a connection. A key not
        there is nothing to do; one that a request in flight still tracks stays (HAProxy
        refuses to drop it): the caller finds it again at its next read. Raises ValueError for
        a key that is not one plain word (``[A-Za-z0-9._-]``), RuntimeApiError for any other
        refusal."""
        for key in keys:
            if not _KEY.match(key):
                raise ValueError(f"not a plain stick-table key: {key!r}")
        batch: list[str] = []
        for key in keys:
            batch.append(f"clear table {name} key {key}")
            if sum(len(line) + 2 for line in batch) >= CLEAR_LINE_MAX:
                await self._clear(batch)
                batch = []
        if batch:
            await self._clear(batch)

    async def _clear(self, lines: list[str]) -> None:
        answer = await self._counted("; ".join(lines))
        refused = {text for text in answer.splitlines() if text.strip() and text != _IN_USE}
        if refused:
            raise RuntimeApiError(f"haproxy refused {lines[0]!r}...: {'; '.join(sorted(refused))}")

    async def response_times(self) -> dict[tuple[str, str], float]:
        """Each server's mean response time over its last 1,024 requests, in seconds, by
        (backend, server), from ``show stat`` (its ``rtime``, in ms); servers with no request yet
        are left out."""
        rows = (await self.command("show stat")).splitlines()
        if not rows or not rows[0].startswith("# "):
            return {}
        header = rows[0][2:].split(",")
        backend, server, rtime, total = (header.index(c) for c in ("pxname", "svname", "rtime",
                                                                   "stot"))
        times = {}
        for row in rows[1:]:
            cells = row.split(",")
            if len(cells) < len(header) or cells[server] in ("FRONTEND", "BACKEND"):
                continue
            if cells[total] not in ("", "0") and cells[rtime] != "":
                times[(cells[backend], cells[server])] = int(cells[rtime]) / 1000
        return times


def _pid(info: str) -> int | None:
    found = _PID.search(info)
    return int(found.group(1)) if found else None


def _check(answer: str, what: str) -> None:
    text = answer.strip()
    if text and not text.lower().startswith("done"):
        raise RuntimeApiError(f"haproxy refused {what}: {text}")
