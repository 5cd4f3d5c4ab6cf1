"""Where a ``tfscache serve`` keeps its state by default, and the lock that makes it its own.

The state directory holds the node configs and the caches' state files (pins, measured
sizes), so it must outlive the process: pins survive a restart only if the directory does.
By default it follows the platform's conventions, one directory per instance:

* ``$XDG_STATE_HOME/tfscache/<instance>`` (XDG Base Directory spec; ``XDG_STATE_HOME``
  unset, empty or relative means ``~/.local/state``);
* as root, with no ``XDG_STATE_HOME`` and no writable home (a container whose ``/root``
  is missing or read-only), ``/var/lib/tfscache/<instance>`` (FHS).

``instance_name`` makes the ``<instance>`` slug: ``sidecar-127.0.0.1-8500`` for a sidecar
(from its node's address), ``embedded-1a2b3c4d`` for embedded mode (a hash of the
resolved model repository path). ``claim(path)`` takes an exclusive, non-blocking
``flock`` on ``path/.lock``, so two processes never share a state directory; it returns
None when another process holds it. The lock goes with the process (SIGKILL included).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path

log = logging.getLogger("tfscache.settings.statedir")

APP = "tfscache"
SYSTEM_STATE_ROOT = Path("/var/lib")  # FHS: variable state of system services
LOCK_NAME = ".lock"
_MAX_SLUG = 100  # well under NAME_MAX (255), with room for the prefix and a hash
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_PLAIN_ADDRESS = re.compile(r"[A-Za-z0-9.-]+:[0-9]+")


def default_state_dir(instance: str) -> Path:
    """The persistent directory of ``instance`` (a slug from ``instance_name``); not created here.

    Raises ValueError for a name that is not a slug, and OSError when there is no place at
    all (not root, no home, no ``XDG_STATE_HOME``); ``claim`` raises OSError when the place
    cannot be made.
    """
    if not instance or instance != _slug(instance) or instance in (".", ".."):
        raise ValueError(f"not a file-system-safe instance name: {instance!r}")
    return state_home() / APP / instance


def state_home() -> Path:
    """``$XDG_STATE_HOME``, else ``~/.local/state``; as root without a writable home, ``/var/lib``."""
    configured = os.environ.get("XDG_STATE_HOME", "")
    if configured and os.path.isabs(configured):  # the spec: a relative path is invalid, ignore it
        return Path(configured)
    home = _home()
    if home is not None and (os.geteuid() != 0 or _writable_under(home, Path(".local", "state"))):
        return home / ".local" / "state"
    if os.geteuid() == 0:
        return SYSTEM_STATE_ROOT
    raise OSError(
        errno.ENOENT,
        "no home directory and no XDG_STATE_HOME for the default state directory; "
        "set node.state_dir",
    )


def instance_name(
    *, node_address: str | None = None, model_repository: str | os.PathLike | None = None
) -> str:
    """A file-system-safe name for one serve: give exactly one of the two.

    ``node_address`` (sidecar mode, ``HOST:GRPC_PORT[,REST_PORT]``): ``sidecar-HOST-PORT``; the
    REST port is left out (it does not change which node this is). An address that does not
    map one-to-one onto a slug (IPv6, odd characters, very long) gets a hash appended.
    ``model_repository`` (embedded mode): ``embedded-`` and 8 hex digits of a SHA-256 of the
    resolved path, stable across restarts and working directories.
    """
    if (node_address is None) == (model_repository is None):
        raise TypeError("instance_name() takes exactly one of node_address and model_repository")
    if model_repository is not None:
        text = str(model_repository)  # a bucket URL (s3://...) is itself; a path is resolved
        resolved = text if "://" in text else str(Path(model_repository).expanduser().resolve())
        return f"embedded-{_digest(resolved)}"
    address = node_address.split(",", 1)[0].strip()
    if not address:
        raise ValueError(f"no node address in {node_address!r}")
    slug = _slug(address.replace(":", "-"))[:_MAX_SLUG]
    if not _PLAIN_ADDRESS.fullmatch(address) or len(address) > _MAX_SLUG or not slug:
        slug = f"{slug}-{_digest(address)}" if slug else _digest(address)
    return f"sidecar-{slug}"


class StateDirLock:
    """An exclusive ``flock`` on ``path/.lock``, held until ``release()`` (or the process ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock; calling it again does nothing. The lock file stays (removing it would race)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops the flock

    def __enter__(self) -> StateDirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"StateDirLock({str(self.path)!r}, held={self.held})"


def claim(path: str | os.PathLike) -> StateDirLock | None:
    """Create ``path`` (mode 0700, as XDG asks) and lock it; None when another holder has it.

    Non-blocking. Raises OSError when the directory or its lock file cannot be made (a
    read-only or foreign directory): the caller decides where to go instead.
    """
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            log.info("state directory %s is in use by another process", path)
            return None
        raise
    try:  # who holds it, for an operator looking at the directory
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return StateDirLock(path, fd)


def _home() -> Path | None:
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no $HOME and no passwd entry
        return None
    return home if home.is_absolute() and str(home) != "/" else None


def _writable_under(home: Path, relative: Path) -> bool:
    """Whether ``home/relative`` exists writable, or can be made in ``home`` (never above it)."""
    path = home / relative
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
        if candidate == home:
            return False  # no home directory at all
    return False


def _slug(text: str) -> str:
    return _SAFE.sub("-", text).strip("-.")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def choose(explicit: Path | None, instance: str) -> tuple[Path, StateDirLock | None, bool]:
    """The state directory a process uses: ``(path, its lock or None, whether it is temporary)``.

    ``explicit`` (``node.state_dir``) if given, else ``instance``'s persistent default. Another
    process holding the default gets this one a temporary directory (its pins then do not
    survive a restart), with a warning; an explicit one held elsewhere is used, with a warning.
    The directory exists on return.
    """
    path, lock = explicit, None
    if path is None:
        try:
            path = default_state_dir(instance)
        except OSError as exc:
            log.warning("no persistent state directory (%s); using a temporary one", exc)
    if path is not None:
        try:
            lock = claim(path)
        except OSError as exc:
            log.warning("cannot use state directory %s: %s", path, exc)
        if lock is None and explicit is None:
            log.warning("state directory %s is in use by another tfscache; using a temporary one: "
                        "pins will not survive a restart (set node.state_dir)", path)
            path = None
        elif lock is None:
            log.warning("state directory %s is in use by another tfscache", path)
    temporary = path is None
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="tfscache-serve-"))
    path.mkdir(parents=True, exist_ok=True)
    log.info("state directory: %s", path)
    return path, lock, temporary
