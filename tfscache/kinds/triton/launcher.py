"""Find NVIDIA Triton's ``tritonserver`` and build its command line (no tritonclient, no TF).

    binary = find_tritonserver()
    argv, env = command(binary, repository, http_port=..., grpc_port=..., metrics_port=...)
    subprocess.Popen(argv, env=env)

The binary comes from the nvidia-pytriton wheel (docs/triton.md, "Install"), which puts
``pytriton/tritonserver/{bin/tritonserver, backends/python/, caches/,
python_backend_stubs/3.X/triton_python_backend_stub}`` and its shared libraries in
``nvidia_pytriton.libs/`` next to the package. The python backend looks for its stub next to
``libtriton_python.so``; the wheel keeps one stub per Python version apart, so, as pytriton
itself does (``Triton._prepare_triton_inference_server``), a backend directory is prepared
with the stub for this interpreter's version, here as symbolic links in a cache directory.
The stub embeds libpython (``libpython3.X.so.1.0``): this interpreter's own when it has one,
else the system's (Debian: ``apt-get install libpython3.11``); it finds this environment's
site-packages through ``python3`` first on PATH, as pytriton arranges.

Flags (docs/triton.md; docs/upstream/triton.md, "Minimal adapter recipe (derived from the above)"
and "Hazards a caching manager must defuse"): explicit model control, no start-up
models, no auto-complete stub per load, non-strict readiness, an exit timeout for draining.
Triton cannot bind port 0 and report the port, so callers choose ports
(``tfscache.kinds.supervisor.free_ports``: bind, read, close; the accepted race).
"""

from __future__ import annotations

import ctypes.util
import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from tfscache.kinds.supervisor import Launch, Launcher, NodeProcess, free_ports
from tfscache.kinds.table import KINDS, NodeKind
from tfscache.settings import NodeSection, Settings

INSTALL_HINT = KINDS["triton"].install
_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


class TritonNotFound(RuntimeError):
    """No usable ``tritonserver`` here; the message says what to install."""


@dataclass(frozen=True)
class TritonBinary:
    """Where an installed ``tritonserver`` and everything it needs lie."""

    executable: Path         # .../pytriton/tritonserver/bin/tritonserver
    libs: Path               # .../nvidia_pytriton.libs (the wheel's bundled shared libraries)
    backends: Path           # --backend-directory: python/ with the stub for this Python
    caches: Path             # --cache-directory
    python_lib_dir: Path | None  # directory holding this interpreter's libpython, if any
    python_bin: Path         # directory of this environment's python3 (PATH for the stub)


def find_tritonserver(cache_dir: Path | None = None) -> TritonBinary:
    """The ``tritonserver`` of the installed nvidia-pytriton wheel, ready to run.

    ``cache_dir`` holds the prepared backend directory (default
    ``$XDG_CACHE_HOME/tfscache/triton``). Raises ``TritonNotFound`` naming what to install.
    """
    root = _pytriton_root()
    dist = root / "tritonserver"
    executable = dist / "bin" / "tritonserver"
    stub = dist / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" \
        / "triton_python_backend_stub"
    for path in (executable, stub, *(dist / "backends" / "python" / f for f in _BACKEND_FILES)):
        if not path.is_file():
            raise TritonNotFound(f"the nvidia-pytriton install at {root} lacks {path} "
                                 f"(Python {sys.version.split()[0]}); reinstall: {INSTALL_HINT}")
    base = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    return TritonBinary(executable=executable, libs=root.parent / "nvidia_pytriton.libs",
                        backends=_prepare_backends(base, dist, stub), caches=dist / "caches",
                        python_lib_dir=_python_lib_dir(),
                        python_bin=Path(sys.executable).parent)


def command(binary: TritonBinary, repository: Path, *, http_port: int, grpc_port: int,
            metrics_port: int, address: str = "127.0.0.1", exit_timeout_s: int = 30,
            extra: Iterable[str] = ()) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` for ``tritonserver`` serving ``repository`` under explicit model control.

    ``extra`` flags come last; Triton takes the last value of a repeated flag.
    """
    argv = [
        str(binary.executable),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",        # loads and unloads only through the API
        "--disable-auto-complete-config",       # no extra stub process per load
        "--strict-readiness=false",             # one failed model never poisons health
        f"--exit-timeout-secs={exit_timeout_s}",  # SIGTERM drains in-flight inferences
        f"--backend-directory={binary.backends}",
        f"--cache-directory={binary.caches}",
        f"--http-address={address}", f"--http-port={http_port}",
        f"--grpc-address={address}", f"--grpc-port={grpc_port}",
        f"--metrics-address={address}", f"--metrics-port={metrics_port}",
        *extra,
    ]
    return argv, _environment(binary)


def launcher(settings: NodeSection, repository: Path, state_dir: Path) -> Launcher:
    """The launch of each child over ``repository``; fails at start-up, naming the install command,
    when no ``tritonserver`` is installed (``--node-command``: another tritonserver binary)."""
    binary = find_tritonserver()
    if settings.node_command:
        binary = replace(binary, executable=Path(settings.node_command))

    def launch(node: NodeProcess) -> Launch:
        # Triton cannot report port 0
        node.grpc_port, node.rest_port, metrics_port = free_ports(3)
        argv, env = command(binary, repository, http_port=node.rest_port, grpc_port=node.grpc_port,
                            metrics_port=metrics_port, extra=settings.extra_args)
        return Launch(argv, env)

    return launch


def preflight(settings: Settings, kind: NodeKind) -> None:
    """Embedded Triton nodes need the [triton] extra (numpy and the nvidia-pytriton wheel)."""
    kind.require_extra("node.backend = triton (embedded Triton nodes)")


def _environment(binary: TritonBinary) -> dict[str, str]:
    env = dict(os.environ)
    libs = [str(binary.libs)] + ([str(binary.python_lib_dir)] if binary.python_lib_dir else [])
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    env["PATH"] = os.pathsep.join([str(binary.python_bin), env.get("PATH", os.defpath)])
    return env


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotFound(f"tritonserver not found: the nvidia-pytriton wheel is not installed "
                             f"in {sys.prefix}; install it: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def _python_lib_dir() -> Path | None:
    """The directory of this interpreter's libpython, or None to use the system's."""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    libdir = sysconfig.get_config_var("LIBDIR")
    if name and libdir and (Path(libdir) / name).is_file():
        return Path(libdir)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if ctypes.util.find_library(f"python{version}"):
        return None
    raise TritonNotFound(f"Triton's python backend stub needs libpython{version}.so.1.0, which "
                         f"this machine lacks (Debian: apt-get install libpython{version})")


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tfscache" / "triton"


def _prepare_backends(base: Path, dist: Path, stub: Path) -> Path:
    """A backend directory whose python/ holds the wheel's backend and this Python's stub.

    Named by the install's real path and the Python version, built once, atomically (a
    temporary directory renamed into place), as symbolic links to the wheel's files by their
    real paths: a link through a symlinked virtual environment would break when that link goes.
    A directory whose links no longer resolve (its install moved) is replaced.
    """
    dist, stub = dist.resolve(), stub.resolve()
    key = hashlib.sha256(f"{dist}|{sys.version_info[:2]}".encode()).hexdigest()[:16]
    backends = base / f"backends-{key}"
    if _links_resolve(backends):
        return backends
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".backends-", dir=base))
    python = scratch / "python"
    python.mkdir()
    for name in _BACKEND_FILES:
        (python / name).symlink_to(dist / "backends" / "python" / name)
    (python / "triton_python_backend_stub").symlink_to(stub)
    if backends.exists() and not _links_resolve(backends):
        stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=base))
        try:
            backends.rename(stale / "backends")
        except OSError:  # another process replaced it first
            pass
        shutil.rmtree(stale, ignore_errors=True)
    try:
        scratch.rename(backends)
    except OSError:  # another process prepared it first
        shutil.rmtree(scratch, ignore_errors=True)
    return backends


def _links_resolve(backends: Path) -> bool:
    python = backends / "python"
    return all((python / name).exists() for name in (*_BACKEND_FILES, "triton_python_backend_stub"))
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".backends-", dir=base))
    python = scratch / "python"
    python.mkdir()
    for name in _BACKEND_FILES:
        (python / name).symlink_to(dist / "backends" / "python" / name)
    (python / "triton_python_backend_stub").symlink_to(stub)
    try:
        scratch.rename(backends)
    except OSError:  # another process prepared it first
        shutil.rmtree(scratch, ignore_errors=True)
    return backends
