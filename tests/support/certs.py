"""Certificates the TLS tests generate (trustme): a CA, and PEM files of its leaf certificates.

    ca = trustme.CA()
    server = write_leaf(ca, tmp_path / "server", "127.0.0.1", "localhost")   # .cert, .key
    write_ca(ca, tmp_path / "ca.pem")

``write_leaf`` replaces files atomically, so a server that re-reads them (SIGHUP) never
sees a half-written one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Leaf:
    """A certificate chain and its private key, as PEM files."""

    cert: Path
    key: Path


def _write(path: Path, data: bytes) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_ca(ca: trustme.CA, path: Path) -> Path:
    return _write(path, ca.cert_pem.bytes())


def write_leaf(ca: trustme.CA, stem: Path, *identities: str) -> Leaf:
    """A certificate signed by ``ca`` for ``identities`` (host names, IP addresses): ``stem``.cert/.key."""
    issued = ca.issue_cert(*identities)
    chain = b"".join(pem.bytes() for pem in issued.cert_chain_pems)
    return Leaf(_write(stem.with_suffix(".cert"), chain),
                _write(stem.with_suffix(".key"), issued.private_key_pem.bytes()))
