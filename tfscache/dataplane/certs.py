"""[tls]'s files as HAProxy reads them (``server.data_plane = haproxy``; docs/data-plane.md).

HAProxy wants the certificate chain and its private key in one PEM. tfscache reads the user's
``tls.cert_file``, ``tls.key_file`` and ``tls.client_ca_file``, checks that they load together
exactly as the Python front ends check them (``tfscache.tls.read_files``), and writes what
HAProxy reads into the data plane's state directory, mode 0600 from the moment each file exists:
``haproxy.pem`` (the chain, then the key) and ``client-ca.pem``. In sidecar mode the same PEM is
the client certificate presented to peers, and ``peer-ca.pem`` holds the CAs that verify them
(``tls.peer_ca_file``, else ``tls.client_ca_file``, as ``tfscache.tls.PeerTls`` chooses; neither:
no file, the system's CAs). The user's files are only read.

A reload first writes the new files beside these (``staged``: ``.new``), so that HAProxy can
check a configuration naming them before they replace the ones it serves (``install``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tfscache.dataplane.config import Tls
from tfscache.settings.sections import TlsSection
from tfscache.tls import peer_ca_file, read_ca, read_files

PEM = "haproxy.pem"
CLIENT_CA = "client-ca.pem"
PEER_CA = "peer-ca.pem"
STAGED = ".new"


def files(directory: Path, section: TlsSection, peers: bool = False) -> Tls:
    """Where HAProxy reads ``section``'s files in ``directory`` (the client CA only with
    ``tls.client_ca_file``); ``peers``: sidecar mode, peers reached over TLS (the peer CA only
    with a file to take it from), and the name their certificates must carry."""
    directory = Path(directory)
    return Tls(directory / PEM, directory / CLIENT_CA if section.client_ca_file else None,
               peer_ca=directory / PEER_CA if peers and peer_ca_file(section) else None,
               peer_name=(section.peer_server_name or None) if peers else None)


def staged(tls: Tls) -> Tls:
    """The files a reload writes before HAProxy has checked them."""
    return dataclasses.replace(tls, pem=_staged(tls.pem), client_ca=_staged(tls.client_ca),
                               peer_ca=_staged(tls.peer_ca))


def write(section: TlsSection, tls: Tls) -> None:
    """Read and check ``section``'s files, then write them where ``tls`` says (blocking: run in a
    thread). ``OSError``, ``ssl.SSLError`` or ``ValueError`` when they do not load, and then
    nothing is written."""
    pem = read_files(section.cert_file, section.key_file, section.client_ca_file)
    peer_ca = read_ca(peer_ca_file(section)) if tls.peer_ca is not None else None
    _write_private(tls.pem, _joined(pem.cert, pem.key))
    if tls.client_ca is not None and pem.ca is not None:
        _write_private(tls.client_ca, pem.ca)
    if tls.peer_ca is not None and peer_ca is not None:
        _write_private(tls.peer_ca, peer_ca)


def install(staged_tls: Tls, tls: Tls) -> None:
    """The staged files replace the served ones (each rename is atomic)."""
    for new, old in _pairs(staged_tls, tls):
        os.replace(new, old)


def discard(staged_tls: Tls) -> None:
    """Staged files HAProxy refused."""
    for path in (staged_tls.pem, staged_tls.client_ca, staged_tls.peer_ca):
        if path is not None:
            path.unlink(missing_ok=True)


def _pairs(staged_tls: Tls, tls: Tls) -> list[tuple[Path, Path]]:
    """(staged, served) for each file both name."""
    pairs = zip((staged_tls.pem, staged_tls.client_ca, staged_tls.peer_ca),
                (tls.pem, tls.client_ca, tls.peer_ca))
    return [(new, old) for new, old in pairs if new is not None and old is not None]


def _staged(path: Path | None) -> Path | None:
    return None if path is None else path.with_name(path.name + STAGED)


def _joined(*parts: bytes) -> bytes:
    """PEM blocks one after another, each ending its line."""
    return b"".join(part if part.endswith(b"\n") else part + b"\n" for part in parts)


def _write_private(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, readable by this user only, replaced in one rename."""
    scratch = path.with_name(path.name + ".tmp")
    scratch.unlink(missing_ok=True)  # O_CREAT's mode applies to a new file only
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(scratch, path)
