"""HAProxy as tfscache's child: started, restarted when it dies, reloaded, stopped.

tfscache binds the public sockets itself and hands them over (``bind fd@N``; config.py), so the
ports exist before HAProxy does and stay open while it restarts: the kernel queues connections
until the new HAProxy accepts them. HAProxy runs in master-worker mode in the foreground
(``-W -db``); a reload is SIGUSR2 to the master, which starts new workers on the new
configuration and lets the old ones finish their requests.

A master takes SIGUSR2 only once it is in its wait loop: after forking its worker it re-executes
itself, and the new image sets SIGUSR2 to SIG_IGN until its loop registers the handler, which
discards a SIGUSR2 pending meanwhile (HAProxy 2.6's src/haproxy.c, ``main`` and
``mworker_loop``). So a reload is sent only once the master CLI (``-S``, which only that loop
serves) has answered, after every start and every reload alike.

The supervisor knows which worker serves now (``Runtime.worker``): the one it started, and after
a reload the new one, once it answers the runtime API. An old worker still carrying requests is
a child of the master until they are done (``old_workers_gone``): the routes it has counted are
not in the new worker's table, so a revocation asks the old workers' own tables through the
master CLI (``old_in_flight``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

import psutil

from tfscache.dataplane import config
from tfscache.dataplane.runtime import Runtime, RuntimeApiError, parse_table
from tfscache.tasks import cancel

log = logging.getLogger(__name__)


class HaproxyStartError(Exception):
    """HAProxy exited, or its runtime socket did not appear, while starting."""


class HaproxyConfigError(Exception):
    """``haproxy -c`` refused a configuration; the message is its first alert."""


class Supervisor:
    def __init__(self, binary: str, state_dir: Path, plan: config.Plan,
                 start_timeout_s: float = 30.0, runtime: Runtime | None = None) -> None:
        """``runtime``: the runtime API client to tell which worker serves (the routes')."""
        self.binary = binary
        self.runtime = runtime if runtime is not None else Runtime(plan.runtime_socket)
        # the master CLI, beside the runtime socket (the same limit on its path)
        self.master = Runtime(plan.runtime_socket.with_name("master.sock"))
        self.state_dir = Path(state_dir)
        self.plan = plan
        self.start_timeout_s = start_timeout_s
        self.config_path = self.state_dir / "haproxy.cfg"
        self.log_path = self.state_dir / "haproxy.log"
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._watch: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        await asyncio.to_thread(self._write_files)
        await self._spawn()
        self._watch = asyncio.create_task(self._watch_loop(), name="haproxy-watch")

    def _write_files(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        maps = [self.plan.map_path]
        if self.plan.mark is not None:
            maps.append(self.plan.peer_map_path)
        for path in maps:
            if not path.exists():
                path.write_text("")
        scratch = self.config_path.with_suffix(".new")
        scratch.write_text(config.render(self.plan))
        os.replace(scratch, self.config_path)

    async def _spawn(self) -> None:
        for path in (self.plan.runtime_socket, self.master.socket_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        logfile = await asyncio.to_thread(open, self.log_path, "ab")
        try:
            self.process = await asyncio.create_subprocess_exec(
                self.binary, "-W", "-db", "-f", str(self.config_path),
                "-S", f"{self.master.socket_path},mode,600",
                stdin=asyncio.subprocess.DEVNULL, stdout=logfile, stderr=logfile,
                pass_fds=tuple(fd for fd in (self.plan.grpc_fd, self.plan.rest_fd)
                               if fd is not None), start_new_session=True)
        finally:
            logfile.close()
        self.runtime.worker = None
        self.runtime.worker = await self._new_worker(None, "while starting")

    async def _new_worker(self, old: int | None, doing: str) -> int:
        """The pid of the worker answering the runtime API (its socket there), once it is not
        ``old``; HaproxyStartError naming ``doing`` if HAProxy exits or none answers in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        while True:
            with contextlib.suppress(RuntimeApiError):
                pid = await self.runtime.worker_pid()
                if pid is not None and pid != old:
                    return pid
            if self.process.returncode is not None:
                raise HaproxyStartError(f"haproxy exited with {self.process.returncode} {doing}; "
                                        f"see {self.log_path}")
            if loop.time() > deadline:
                raise HaproxyStartError(f"no haproxy worker answered its runtime socket "
                                        f"{doing} in {self.start_timeout_s} s; see "
                                        f"{self.log_path}")
            await asyncio.sleep(0.01)

    async def _master_waits(self, doing: str) -> None:
        """Return once the master answers its CLI: in its wait loop, it takes SIGUSR2 (module
        docstring); HaproxyStartError naming ``doing`` if HAProxy exits or it does not in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        while True:
            with contextlib.suppress(RuntimeApiError):
                if "master" in await self.master._ask("show proc;quit"):
                    return
            if self.process.returncode is not None:
                raise HaproxyStartError(f"haproxy exited with {self.process.returncode} {doing}; "
                                        f"see {self.log_path}")
            if loop.time() > deadline:
                raise HaproxyStartError(f"the haproxy master did not answer its CLI {doing} in "
                                        f"{self.start_timeout_s} s; see {self.log_path}")
            await asyncio.sleep(0.01)

    async def old_workers_gone(self) -> bool:
        """No worker but the current one is left (an old one finishes its requests first)."""
        return not await self._old_workers()

    async def _old_workers(self) -> list[int]:
        """The workers but the current one (none once HAProxy has exited)."""
        process = self.process
        if process is None or process.returncode is not None:
            return []
        return await asyncio.to_thread(_other_children, process.pid, self.runtime.worker)

    async def old_in_flight(self, key: str) -> int:
        """The requests under ``key`` (in the table ``inflight``) that workers other than the
        current one still carry, summed: each worker counts in its own tables, and an old one
        lives on while a client keeps a connection to it open (an idle TLS one, say), so a
        revocation asks them rather than wait for them to be gone. Asked through the master CLI
        (``@!PID``); a worker gone meanwhile counts none. RuntimeApiError if the master does
        not answer."""
        total = 0
        for pid in await self._old_workers():
            answer = await self.master._ask(f"@!{pid} show table {config.TABLE};quit")
            usage = parse_table(answer).get(key)
            total += usage.in_flight if usage else 0
        return total

    async def unroute_old(self, map_path: Path, model: str) -> None:
        """Drop ``model``'s route from the map of every worker but the current one, through the
        master CLI: an old worker routes what still reaches it (a stream on a connection a client
        keeps open) by its own map, which no runtime command to the current worker changes.
        Without the route it sends those requests to the slow path. A worker gone meanwhile has
        nothing to drop. RuntimeApiError if the master does not answer."""
        for pid in await self._old_workers():
            await self.master._ask(f"@!{pid} del map {map_path} {model};quit")

    async def _watch_loop(self) -> None:
        while not self._stopping:
            code = await self.process.wait()
            if self._stopping:
                return
            self.restarts += 1
            log.warning("haproxy exited with %s; restarting it (restart %d)", code, self.restarts)
            try:
                await self._spawn()
            except HaproxyStartError as e:
                log.error("%s", e)
                await asyncio.sleep(1.0)

    async def check(self, plan: config.Plan) -> None:
        """Have the binary check ``plan``'s configuration, and the files it names, without
        serving it (``haproxy -c``, with the public sockets it binds); HaproxyConfigError
        naming HAProxy's first alert if it would refuse it."""
        path = self.state_dir / "haproxy.cfg.check"
        await asyncio.to_thread(path.write_text, config.render(plan))
        checker = await asyncio.create_subprocess_exec(
            self.binary, "-c", "-f", str(path), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            pass_fds=tuple(fd for fd in (plan.grpc_fd, plan.rest_fd) if fd is not None))
        output, _ = await checker.communicate()
        if checker.returncode != 0:
            alerts = [line.split(":", 1)[-1].strip() for line in output.decode(errors="replace")
                      .splitlines() if "[ALERT]" in line]
            raise HaproxyConfigError(alerts[0] if alerts else f"haproxy -c exited with "
                                     f"{checker.returncode}")

    async def reload(self, plan: config.Plan) -> None:
        """Serve ``plan`` from now on, without closing a port or failing a request; returns once
        the new worker answers the runtime API (HaproxyStartError if none does: the old one
        serves on). The routes must not change meanwhile (``Routes.held``): the new worker
        reads the map file as it starts, and a change sent to the old one would not reach it."""
        self.plan = plan
        await asyncio.to_thread(self._write_files)
        if self.process is not None and self.process.returncode is None:
            old = self.runtime.worker
            await self._master_waits("before reloading")
            self.process.send_signal(signal.SIGUSR2)
            self.runtime.worker = await self._new_worker(old, "reloading")
            # the master re-executes itself: its CLI, through which old workers are asked
            # (old_in_flight, unroute_old), answers again once it is back in its loop
            await self._master_waits("after reloading")

    async def stop(self, grace: float = 0.0) -> None:
        """A soft stop (SIGUSR1: no new connections, the requests in flight finish) for
        ``grace`` s, then a hard one."""
        self._stopping = True
        if self._watch is not None:
            await cancel(self._watch)
        process = self.process
        if process is None or process.returncode is not None:
            return
        for sig, wait_s in ((signal.SIGUSR1, grace), (signal.SIGTERM, 10.0)):
            if wait_s > 0:
                process.send_signal(sig)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(process.wait(), wait_s)
                if process.returncode is not None:
                    return
        process.kill()
        await process.wait()


def _other_children(parent: int, child: int | None) -> list[int]:
    """The children of ``parent`` but ``child`` (none once ``parent`` is gone)."""
    try:
        return [c.pid for c in psutil.Process(parent).children() if c.pid != child]
    except psutil.NoSuchProcess:
        return []
