"""Local node processes for the embedded default: start, watch, restart, stop.

Each node is a child process on 127.0.0.1, started as its kind's launcher says
(``Launch``: tfscache.kinds.<kind>.launcher), with nothing loaded: the node's CacheManager
alone decides what it serves. A child that can bind port 0 reports its ports in a file;
for one that cannot, ports are chosen for it (``free_ports``: bind port 0 for each, read,
close: a small race, the only place we accept one).

A node that exits unexpectedly is restarted (with a backoff if it keeps crashing);
``on_exit`` / ``on_start`` let the owner drop and rebuild the node's client and cache.
Children die with this process and only then: they run in their own session, so a
signal to the terminal's process group reaches only this process (which then stops
them in order, without restarting them first); PR_SET_PDEATHSIG (set by
setpriv) sends them SIGTERM if this process is killed; ``stop()`` sends SIGTERM, then SIGKILL after
a grace period.

A kind whose children are ``tfscache node`` (``Launch.forkable``) has them forked from one node
template (tfscache.modelserver.template, ``node.fork_nodes``): TensorFlow is imported once, when the
first node starts, and every later start or restart serves in ~0.1 s plus its models' loads. The
template is this process's child and dies with it; its nodes die with the template (and with this
process: tfscache.modelserver.template). ``node.template_socket`` names a template others started
and share instead, this instance's own started only if that one does not answer. A template
that cannot fork (it died, it never listened) costs no node: that node is exec'd as before and
the next start tries a fresh template.

``node.local_host_nodes`` more children, named ``host0``, ``host1``..., are the host tier
(docs/tiers.md): started as the others, with the GPU hidden from them (``CUDA_VISIBLE_DEVICES``
empty in their environment, which CUDA reads when it first starts in a process). The node
template itself keeps this process's environment.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Awaitable, Callable

from tfscache.modelserver import template
from tfscache.settings import NodeSection

log = logging.getLogger("tfscache.kinds.supervisor")



@dataclass
class NodeProcess:
    """One running (or restarting) node child."""

    index: int
    name: str
    tier: str = "gpu"  # "host": a host-tier node, the GPU hidden from it (docs/tiers.md)
    grpc_port: int = 0
    rest_port: int = 0
    pid: int = 0
    restarts: int = 0
    started_at: float = 0.0
    process: asyncio.subprocess.Process | template.AsyncChild | None = field(
        default=None, repr=False
    )

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def rest_address(self) -> str:
        return f"127.0.0.1:{self.rest_port}"


@dataclass(frozen=True)
class Launch:
    """How one node child starts: its command line and environment, and how it is seen serving."""

    argv: list[str]
    env: dict[str, str] | None = None  # None: this process's environment
    # A JSON file {"grpc": port, "rest": port} the child writes once it serves (ports 0 chosen by
    # it); None: the launcher set the node's ports, and the child serves once both accept.
    ports_file: Path | None = None
    # ``tfscache <forkable>`` is ``argv``: the node template may fork it instead (module docstring)
    forkable: list[str] | None = None


Launcher = Callable[[NodeProcess], Launch]  # a kind's: the launch of one node child, each (re)start


def _die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run under util-linux's ``setpriv --pdeathsig TERM``, when it is installed.

    The child must get SIGTERM if this process is killed (PR_SET_PDEATHSIG). Setting it
    from a ``preexec_fn`` would run Python in the forked child of a multi-threaded
    process (gRPC's threads), which crashed now and then; setpriv sets it after the
    fork, outside Python, and the setting survives its exec of ``argv``.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv not found: node processes will outlive this one if it is killed")
        return argv
    return [setpriv, "--pdeathsig", "TERM", "--", *argv]


def hide_gpu(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` (None: this process's) with every GPU hidden from CUDA: a host-tier node's."""
    return {**(os.environ if env is None else env), "CUDA_VISIBLE_DEVICES": ""}


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now on 127.0.0.1 (for servers that cannot report
    their own). All are held open together until each is known: ports picked one after the other
    can come back the same (the kernel hands out a just-closed one again), and Triton then
    refused to start, its HTTP and gRPC ports being one."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Supervisor:
    """K node children; ``start()`` returns once all serve, ``stop()`` ends them all."""

    def __init__(
        self,
        settings: NodeSection,
        state_dir: Path,
        *,
        on_start: Callable[[NodeProcess], Awaitable[None]] | None = None,
        on_exit: Callable[[NodeProcess], Awaitable[None]] | None = None,
        launcher: Launcher,
    ) -> None:
        """``launcher(node)``: how the node kind starts a child (tfscache.kinds.table's ``launcher``)."""
        self.settings = settings
        self._launcher = launcher
        self.state_dir = Path(state_dir)
        gpu = settings.local_nodes
        self.nodes = [NodeProcess(i, f"node{i}") for i in range(gpu)] + [
            NodeProcess(gpu + i, f"host{i}", tier="host")
            for i in range(settings.local_host_nodes)]
        self._on_start = on_start
        self._on_exit = on_exit
        self._watchers: list[asyncio.Task] = []
        self._stopping = False
        self._template: asyncio.subprocess.Process | None = None
        self._template_lock = asyncio.Lock()

    async def start(self) -> list[NodeProcess]:
        """Start every node and wait until all serve; then watch them."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.gather(*(self._spawn(node) for node in self.nodes))
        except BaseException:
            await self.stop(grace=1.0)
            raise
        self._watchers = [asyncio.create_task(self._watch(node), name=f"watch-{node.name}")
                          for node in self.nodes]
        return self.nodes

    async def _spawn(self, node: NodeProcess) -> None:
        launch = self._launcher(node)
        if node.tier == "host":
            launch = replace(launch, env=hide_gpu(launch.env))
        argv, env = launch.argv, launch.env
        if launch.ports_file is not None:
            launch.ports_file.unlink(missing_ok=True)
        node.process = (
            await self._fork(node, launch) if launch.forkable and self.settings.fork_nodes else None
        )
        if node.process is None:
            log.info("starting %s: %s", node.name, shlex.join(argv))
            node.process = await asyncio.create_subprocess_exec(
                *_die_with_parent(argv),
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        node.pid = node.process.pid
        node.started_at = time.monotonic()
        try:
            deadline = time.monotonic() + self.settings.start_timeout_s
            while not await _serving(node, launch.ports_file):
                if node.process.returncode is not None:
                    raise RuntimeError(
                        f"{node.name} exited with {node.process.returncode} before serving "
                        f"(command: {shlex.join(argv)})"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{node.name} did not serve within {self.settings.start_timeout_s} s"
                    )
                await asyncio.sleep(0.05)  # polling a condition with a deadline
            log.info("%s serving: pid %s, gRPC %s, REST %s", node.name, node.pid, node.grpc_port,
                     node.rest_port)
            if self._on_start is not None:
                await self._on_start(node)
        except BaseException:
            if node.process.returncode is None:
                _signal(node.process, signal.SIGKILL)
                await node.process.wait()
            raise

    async def _fork(self, node: NodeProcess, launch: Launch) -> template.AsyncChild | None:
        """``node`` forked from the node template; None if it cannot be. A template that does not
        answer (killed: its exit may not be reaped yet) is replaced once, first killed if still there.
        """
        shared = self.settings.template_socket
        if shared:
            try:
                child = await template.AsyncChild.fork(
                    shared, launch.forkable, env=launch.env, new_session=True
                )
            except (template.TemplateError, OSError) as exc:
                log.warning("the node template at %s did not fork %s (%s): starting this "
                            "instance's own", shared, node.name, exc)
            else:
                log.info("forked %s from the shared node template at %s: tfscache %s",
                         node.name, shared, shlex.join(launch.forkable))
                return child
        path = str(self.state_dir / "node-template.sock")
        failed = None  # the template that did not answer
        for _ in range(2):
            try:
                async with self._template_lock:
                    current = self._template
                    if current is None or current.returncode is not None or current is failed:
                        # (not one another start replaced)
                        await self._start_template(path, launch.env if node.tier != "host"
                                                   else None)
                    failed = self._template
                child = await template.AsyncChild.fork(
                    path, launch.forkable, env=launch.env, new_session=True
                )
            except (template.TemplateError, OSError) as exc:
                failure = exc
                continue
            log.info(
                "forked %s from the node template: tfscache %s",
                node.name,
                shlex.join(launch.forkable),
            )
            return child
        log.warning(
            "forking %s from the node template failed (%s): starting it as a process of its own",
            node.name,
            failure,
        )
        return None

    async def _start_template(self, path: str, env: dict[str, str] | None) -> None:
        argv = [sys.executable, "-m", "tfscache.modelserver.template", path]
        old = self._template
        if old is not None and old.returncode is None:
            _signal(old, signal.SIGKILL)
            await old.wait()
        Path(path).unlink(missing_ok=True)  # a crashed run's: the new one's appears once it listens
        log.info(
            "starting the node template (TensorFlow imported once for every node): %s",
            shlex.join(argv),
        )
        self._template = process = await asyncio.create_subprocess_exec(
            *_die_with_parent(argv),
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not os.path.exists(path):
            if process.returncode is not None:
                raise template.TemplateError(f"the node template exited with {process.returncode}")
            if time.monotonic() > deadline:
                _signal(process, signal.SIGKILL)
                raise template.TemplateError(
                    f"it did not listen within {self.settings.start_timeout_s} s"
                )
            await asyncio.sleep(0.05)  # polling a condition with a deadline

    async def _watch(self, node: NodeProcess) -> None:
        backoff = 0.5
        while True:
            rc = await node.process.wait()
            if self._stopping:
                return
            log.error("%s (pid %s) exited with %s; restarting it", node.name, node.pid, rc)
            _kill_group(node.pid)  # its children (Triton's python-backend stubs) may outlive it
            if time.monotonic() - node.started_at > 30:
                backoff = 0.5  # it ran a while: not a crash loop
            if self._on_exit is not None:
                await self._on_exit(node)
            while not self._stopping:
                try:
                    await self._spawn(node)
                    break
                except Exception as exc:  # noqa: BLE001 - keep trying; the node is needed
                    log.error(
                        "restarting %s failed: %s; retrying in %.1f s", node.name, exc, backoff
                    )
                    await asyncio.sleep(backoff)  # back off a crash loop
                    backoff = min(backoff * 2, 10.0)
            node.restarts += 1

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every node, SIGKILL what is left after ``grace`` seconds; wait for all."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        running = [
            n.process for n in self.nodes if n.process is not None and n.process.returncode is None
        ]
        for process in running:
            _signal(process, signal.SIGTERM)
        if running:
            done, pending = await asyncio.wait(
                [asyncio.create_task(p.wait()) for p in running], timeout=grace
            )
            for process in running:
                if process.returncode is None:
                    _signal(process, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in running))
        for node in self.nodes:
            if node.pid:
                _kill_group(node.pid)
        if self._template is not None and self._template.returncode is None:
            _signal(self._template, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._template.wait(), grace)
            except asyncio.TimeoutError:
                _signal(self._template, signal.SIGKILL)
                await self._template.wait()
        log.info("stopped %d node(s)", len(running))


def _kill_group(pid: int) -> None:
    """SIGKILL what is left of a node's process group (the node ran as its session leader)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(process: asyncio.subprocess.Process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


async def _serving(node: NodeProcess, ports_file: Path | None) -> bool:
    if ports_file is not None:
        try:
            ports = json.loads(ports_file.read_text())
        except (OSError, ValueError):
            return False
        node.grpc_port, node.rest_port = int(ports["grpc"]), int(ports["rest"])
        return True
    return await _accepts(node.grpc_port) and await _accepts(node.rest_port)


async def _accepts(port: int) -> bool:
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True
