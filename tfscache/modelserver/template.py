"""A node template: one process that imported TensorFlow and the node once, forking each node.

A ``tfscache node`` spends ~4-5 s of CPU importing TensorFlow before it serves (and ~600 MB
of memory it never writes). The template pays that once: ``python -m tfscache.modelserver.template
SOCKET`` imports everything a node imports, then listens on the UNIX socket ``SOCKET``; each
connection asks for one node (a JSON line: argv, env, cwd, an optional output file, whether the
child leads a session of its own; the asker's standard output and error come with it, SCM_RIGHTS,
and are the node's unless an output file is named) and gets ``{"pid": N}`` back at once, then
``{"returncode": RC}`` when that node exits (a negative RC: the signal that ended it, as
subprocess reports it). The child is forked from the template (no exec): it starts serving in
~0.1 s plus its models' loads, and shares the imported modules' pages with the template and its
sibling nodes until one writes them. A child runs in its asker's network namespace, as one the
asker exec'd would: it joins that namespace (setns, which needs CAP_SYS_ADMIN) when the asker's
is not the template's, and the asker gets an error instead of a pid if it cannot.

Forking is safe because the template never runs TensorFlow: importing it starts no session, no
op thread pool and no CUDA context, and the template starts no thread of its own (the import
leaves one idle native thread, which a fork does not copy). tests/modelserver/test_template.py runs
forked nodes side by side, each computing its own answers. Variables read during TensorFlow's
import (TF_CPP_MIN_LOG_LEVEL and the like) are the template's: every node it forks gets the
template's environment at import, then its own ``env``. A forked node's command line is the
template's; its process name (``ps -o comm``) is ``tfscache-node``. Each child gets SIGTERM
when the template dies (PR_SET_PDEATHSIG), and when the process that asked for it ends (a thread
waits on that process's pidfd); the template ends within 0.5 s of its owner (the process that
started it). So a killed owner leaves no node behind, also when its nodes came from a template
that others share (``node.template_socket``: a template started once for several instances, as
the test suite does). (Not PR_SET_PDEATHSIG for the template itself: that signal follows the
owner's *thread* that started it, and a test's start in a pool thread would end with the thread.)

``Child`` (blocking) and ``AsyncChild`` (asyncio) are the owner's handles of a forked node with
the subset of subprocess.Popen and asyncio.subprocess.Process the tests and the supervisor use.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import select
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
CLONE_NEWNET = 0x40000000
NAME = b"tfscache-node"  # a forked node's process name (ps -o comm, top, psutil's name())


# sun_path holds 108 bytes with its NUL; a longer path is reached through its directory's fd
_SUN_PATH = 107


@contextlib.contextmanager
def addressable(path: str):
    """``path`` as a UNIX socket address that fits: itself, or (a long state directory's) the
    same file through a descriptor of its directory, ``/proc/self/fd/N/NAME``."""
    if len(os.fsencode(path)) <= _SUN_PATH:
        yield path
        return
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{os.path.basename(path)}"
    finally:
        os.close(directory)


def preload() -> None:
    """Import what a node imports before it serves (tfscache.modelserver.main's lazy imports)."""
    from tfscache.modelserver.main import no_plotting

    no_plotting()
    import tensorflow  # noqa: F401
    from aiohttp import web  # noqa: F401

    import tfscache.modelserver.grpc_api  # noqa: F401
    import tfscache.modelserver.server_core  # noqa: F401
    import tfscache.modelserver.rest_api  # noqa: F401
    import tfscache.modelserver.server_configs  # noqa: F401
    import tfscache.webserver  # noqa: F401


def _prctl(option: int, value) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _die_with_owner(owner_fd: int) -> None:
    """SIGTERM this process when the owner (the process that asked for it; ``owner_fd``, its
    pidfd) ends, as PR_SET_PDEATHSIG does for the template: a template that several owners
    share (``node.template_socket``) outlives each of them, and a killed owner's nodes must not."""

    def watch() -> None:
        select.select([owner_fd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _owner_pidfd(conn: socket.socket) -> tuple[int, int]:
    """The pid of the process at the other end of ``conn`` (SO_PEERCRED) and a pidfd of it;
    OSError if it is gone."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", creds)[0]
    return pid, os.pidfd_open(pid)


def _foreign_netns(pid: int) -> int | None:
    """An fd of process ``pid``'s network namespace if it is not this process's; else None."""
    theirs, ours = os.stat(f"/proc/{pid}/ns/net"), os.stat("/proc/self/ns/net")
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        return None
    return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)


def _join_netns(netns_fd: int) -> None:
    """Move this (single-threaded, forked) process into the network namespace ``netns_fd``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(netns_fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def _run_child(request: dict, template_pid: int, owner_fd: int, outputs: list[int]) -> None:
    """In the forked child: become the node ``request`` asks for, then exit with its status.
    ``outputs``: the owner's standard output and error, passed with the request (or none)."""
    rc = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if request.get("new_session", True):
            os.setsid()
        _die_with_parent()
        _prctl(PR_SET_NAME, ctypes.c_char_p(NAME))  # its command line stays the template's
        if os.getppid() != template_pid:  # the template died between the fork and prctl
            os._exit(1)
        _die_with_owner(owner_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout.flush()  # (the template's, still buffered: to the template's own output)
        sys.stderr.flush()
        if request.get("output"):
            out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
        elif len(outputs) == 2:  # the owner's standard output and error, as an exec'd child's
            os.dup2(outputs[0], 1)
            os.dup2(outputs[1], 2)
        for fd in outputs:
            os.close(fd)
        os.chdir(request.get("cwd") or os.getcwd())
        os.environ.clear()
        os.environ.update(request["env"])
        argv = list(request["argv"])
        sys.argv = [sys.executable, "-m", "tfscache", *argv]
        from tfscache.modelserver.main import main

        rc = int(main(argv[1:]) or 0)  # argv[0] is "node" (checked by the template)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must not return into the template's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the owner went away: the node lives on, the owner's handle is gone


def serve(path: str) -> int:
    """The template's loop: fork a node per request, report each one's exit. Single-threaded."""
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(path).unlink(missing_ok=True)
    with addressable(path + ".binding") as address:
        listener.bind(address)
    os.chmod(path + ".binding", 0o600)  # only its owner's user may ask for nodes
    listener.listen(64)
    os.rename(path + ".binding", path)  # the socket appears once it accepts
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    stop = {"now": False}

    def stopping(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (owner's connection, pidfd)
    parent = os.getppid()
    try:
        # the owner gone (killed): the template goes
        while not stop["now"] and os.getppid() == parent:
            for key, _ in selector.select(timeout=0.5):
                if key.data == "listen":
                    conn, _ = listener.accept()
                    selector.register(conn, selectors.EVENT_READ, "request")
                elif key.data == "request":
                    conn = key.fileobj
                    selector.unregister(conn)
                    _fork_for(conn, selector, children, listener)
                else:  # a child's pidfd: it exited
                    pid = key.data
                    owner, pidfd = children.pop(pid)
                    selector.unregister(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(pid, 0)
                    _send(owner, {"returncode": os.waitstatus_to_exitcode(status)})
                    owner.close()
    finally:
        Path(path).unlink(missing_ok=True)
    return 0


def _fork_for(conn: socket.socket, selector, children: dict, listener: socket.socket) -> None:
    conn.settimeout(10.0)
    outputs: list[int] = []
    try:
        data, outputs, _, _ = socket.recv_fds(conn, 65536, 2)
        while data and not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        request = json.loads(data)
    except (OSError, ValueError) as exc:
        _send(conn, {"error": f"unreadable request: {exc}"})
        _close(conn, outputs)
        return
    if not isinstance(request, dict) or request.get("argv", [None])[:1] != ["node"]:
        _send(conn, {"error": 'a template forks `tfscache node` only: argv must start with "node"'})
        _close(conn, outputs)
        return
    try:
        owner_pid, owner_fd = _owner_pidfd(conn)
        netns = _foreign_netns(owner_pid)
    except OSError as exc:  # the owner went away already
        _send(conn, {"error": f"the owner is gone: {exc}"})
        _close(conn, outputs)
        return
    joined = os.pipe() if netns is not None else None  # the child says whether it joined
    template = os.getpid()
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        selector.close()
        for owner, pidfd in children.values():
            owner.close()
            os.close(pidfd)
        if joined is not None:
            _join_owners_netns(netns, *joined)
        _run_child(request, template, owner_fd, outputs)
    os.close(owner_fd)
    for fd in outputs:
        os.close(fd)
    if joined is not None:
        os.close(netns)
        os.close(joined[1])
        with os.fdopen(joined[0], "rb") as said:
            failure = said.read().decode(errors="replace")  # ends when the child closes it
        if failure:
            os.waitpid(pid, 0)
            _send(conn, {"error": f"the node cannot join its asker's network namespace: {failure}"})
            conn.close()
            return
    pidfd = os.pidfd_open(pid)
    children[pid] = (conn, pidfd)
    selector.register(pidfd, selectors.EVENT_READ, pid)
    _send(conn, {"pid": pid})


def _join_owners_netns(netns: int, read_end: int, write_end: int) -> None:
    """In the forked child: into the asker's network namespace, as a child it exec'd would be;
    the template hears "" (joined) or why not, and a child that could not join exits."""
    os.close(read_end)
    try:
        _join_netns(netns)
    except OSError as exc:
        os.write(write_end, str(exc).encode() or b"failed")
        os._exit(1)
    finally:
        os.close(netns)
    os.close(write_end)


def _close(conn: socket.socket, fds: list[int]) -> None:
    conn.close()
    for fd in fds:
        os.close(fd)


def _outputs() -> list[int]:
    """This process's standard output and error, to pass with a request (none if one is closed)."""
    try:
        for fd in (1, 2):
            os.fstat(fd)
    except OSError:
        return []
    return [1, 2]


def _ask(sock: socket.socket, line: bytes) -> None:
    """Send the request ``line`` on a connected (blocking) ``sock``, this process's standard
    output and error with it: the node writes where an exec'd child of this process would."""
    sent = socket.send_fds(sock, [line], _outputs())
    if sent < len(line):  # (not sendall(b""): the template may have answered and closed already)
        sock.sendall(line[sent:])


def request(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
            output: str | None = None, new_session: bool = True) -> bytes:
    """The JSON line asking a template for the node ``tfscache <argv>``."""
    return json.dumps({"argv": argv, "env": dict(os.environ if env is None else env), "cwd": cwd,
                       "output": output, "new_session": new_session}).encode() + b"\n"


def _returncode(line: bytes) -> int:
    """The exit status in the template's last line; -SIGKILL when the template died first."""
    if not line:
        return -signal.SIGKILL
    return int(json.loads(line)["returncode"])


class TemplateError(RuntimeError):
    """The template did not fork the node (it is not running, or refused the request)."""


def _forked_pid(line: bytes | None) -> int:
    """The pid in the template's first answer; TemplateError if it refused or said nothing."""
    try:
        answer = json.loads(line) if line else {}
    except ValueError:
        answer = {}
    if "pid" not in answer:
        raise TemplateError(
            f"the node template did not fork the node: {answer.get('error', 'no answer')}"
        )
    return int(answer["pid"])


class Child:
    """A forked node, as subprocess.Popen's subset: pid, args, poll, wait, send_signal, kill, terminate."""

    def __init__(self, socket_path: str, argv: list[str], **options) -> None:
        self.args = [sys.executable, "-m", "tfscache", *argv]
        self.returncode: int | None = None
        self._buffer = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with addressable(socket_path) as address:
                self._sock.connect(address)
            _ask(self._sock, request(argv, **options))
            self.pid = _forked_pid(self._line(timeout=30.0))
        except OSError as exc:
            self._sock.close()
            raise TemplateError(f"node template at {socket_path}: {exc}") from exc
        except TemplateError:
            self._sock.close()
            raise

    def _line(self, timeout: float | None) -> bytes | None:
        """The template's next line; b"" if it closed the connection; None if ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._sock], [], [], left)[0]:
                return None
            chunk = self._sock.recv(4096)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        if self.returncode is None:
            line = self._line(timeout=0)
            if line is not None:
                self._ended(line)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                import subprocess

                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended(line)
        return self.returncode

    def _ended(self, line: bytes) -> None:
        self.returncode = _returncode(line)
        self._sock.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class AsyncChild:
    """A forked node, as asyncio.subprocess.Process's subset the supervisor uses."""

    def __init__(
        self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._reader, self._writer = reader, writer
        self._ended = asyncio.ensure_future(self._wait_for_end())

    @classmethod
    async def fork(cls, socket_path: str, argv: list[str], **options) -> AsyncChild:
        line = request(argv, **options)

        def connect() -> socket.socket:  # a local socket's connect and send: quick, yet off the loop
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with addressable(socket_path) as address:
                    sock.connect(address)
                _ask(sock, line)
            except BaseException:
                sock.close()
                raise
            return sock

        try:
            sock = await asyncio.to_thread(connect)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except OSError as exc:
            raise TemplateError(f"node template at {socket_path}: {exc}") from exc
        try:
            pid = _forked_pid(await reader.readline())
        except TemplateError:
            writer.close()
            raise
        return cls(pid, reader, writer)

    async def _wait_for_end(self) -> int:
        try:
            line = await self._reader.readline()
        except OSError:
            line = b""
        self.returncode = _returncode(line)
        self._writer.close()
        return self.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def wait_for_socket(path: str, alive, timeout: float) -> None:
    """Block until the template at ``path`` accepts; ``alive()`` False (it exited): TemplateError."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if not alive():
            raise TemplateError("the node template exited before it listened")
        if time.monotonic() > deadline:
            raise TemplateError(f"the node template did not listen within {timeout} s")
        time.sleep(0.02)  # polling a condition with a deadline


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m tfscache.modelserver.template SOCKET_PATH", file=sys.stderr)
        raise SystemExit(2)
    code = serve(sys.argv[1])
    sys.stderr.flush()
    # at once: an interpreter's shutdown with TensorFlow loaded can hang, its nodes alive
    os._exit(code)
