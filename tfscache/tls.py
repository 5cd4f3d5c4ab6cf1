"""TLS for `tfscache serve` (docs/tls.md): the front ends' server credentials, reloaded on
SIGHUP, and what a sidecar presents and trusts towards its peers.

``ServerTls`` holds ``[tls]``'s certificate, key and (mutual TLS) client CA. The gRPC front
end gets ``grpc.dynamic_ssl_server_credentials``: gRPC asks its fetcher before every
handshake, and the fetcher hands over a new certificate configuration once after a reload.
The REST front end gets one ``ssl.SSLContext``, whose chain a reload loads again. Either way
open connections keep the certificate they started with, new ones get the new one, and no
listener closes. A reload that fails (a file missing, a key that does not match) is logged
and changes nothing.

``PeerTls`` is the client side of a sidecar's hop to its peers: the CA that verifies them
(``peer_ca_file``, else ``client_ca_file``, else the system's roots), this sidecar's own
certificate as its client certificate (peers with mutual TLS require one), and an optional
name the peers' certificates must carry instead of their address's host.

``check(section)`` validates a [tls] section as a whole before anything starts.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from tfscache.settings.sections import TlsSection

log = logging.getLogger("tfscache.tls")


@dataclass(frozen=True)
class Pem:
    """The files' bytes as read at one moment (``key``/``cert`` empty: none)."""

    cert: bytes
    key: bytes
    ca: bytes | None


def check(section: TlsSection) -> tuple[str, str, str] | None:
    """(field, value, problem) for the first thing wrong with ``section``; None when it is usable."""
    if bool(section.cert_file) != bool(section.key_file):
        missing, given = (
            ("key_file", "cert_file") if section.cert_file else ("cert_file", "key_file")
        )
        return missing, "", f"required with tls.{given}"
    for name in ("client_ca_file", "peer_ca_file", "peer_server_name"):
        if getattr(section, name) and not section.cert_file:
            return name, getattr(section, name), "needs tls.cert_file and tls.key_file"
    if not section.cert_file:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for name in ("cert_file", "client_ca_file", "peer_ca_file"):
        if getattr(section, name):
            try:
                context.load_verify_locations(cafile=getattr(section, name))
            except ssl.SSLError as exc:
                return (
                    name,
                    getattr(section, name),
                    f"no PEM certificate in it: {exc.reason or exc}",
                )
    try:
        context.load_cert_chain(section.cert_file, section.key_file)
    except ssl.SSLError as exc:
        # OpenSSL's "PEM lib" error carries no reason
        reason = exc.reason or "not a PEM private key"
        return (
            "key_file",
            section.key_file,
            f"does not load as the private key of tls.cert_file: {reason}",
        )
    return None


def read_files(cert_file: str, key_file: str, ca_file: str) -> Pem:
    """The files' bytes, checked to load together (blocking: run in a thread);
    ``ssl.SSLError``/``OSError``."""
    pem = Pem(Path(cert_file).read_bytes(), Path(key_file).read_bytes(),
              read_ca(ca_file) if ca_file else None)
    # what the live context will load, tried first
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    return pem


def read_ca(ca_file: str) -> bytes:
    """A CA file's bytes, checked to load as CA certificates (blocking: run in a thread);
    ``ssl.SSLError``/``OSError``."""
    data = Path(ca_file).read_bytes()
    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
        cadata=data.decode("ascii", "replace"))
    return data


def peer_ca_file(section: TlsSection) -> str:
    """The CAs that verify a peer sidecar's certificate: ``peer_ca_file``, else
    ``client_ca_file``; empty: the system's roots."""
    return section.peer_ca_file or section.client_ca_file


class ServerTls:
    """The front ends' certificate (``grpc_credentials``, ``ssl_context``); ``reload`` re-reads the files."""

    def __init__(self, section: TlsSection) -> None:
        """Reads the files (blocking: construct it in a thread, e.g. ``asyncio.to_thread``)."""
        self._section = section
        pem = read_files(section.cert_file, section.key_file, section.client_ca_file)
        self.mutual = pem.ca is not None
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._initial = self._grpc_config(pem)
        self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._load_into_context(pem)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self._fetch,
                                                   require_client_authentication=self.mutual)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC's core before each handshake: the new configuration once, then "no change".
        config, self._pending = self._pending, None
        return config

    @staticmethod
    def _grpc_config(pem: Pem) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(pem.key, pem.cert)], root_certificates=pem.ca
        )

    def _load_into_context(self, pem: Pem) -> None:
        # load_cert_chain reads files itself (it takes no bytes); read_files has just loaded the same two
        # files into a scratch context, so they are in the page cache and known to load.
        self.ssl_context.load_cert_chain(self._section.cert_file, self._section.key_file)
        if pem.ca is not None:  # adds to the CAs already trusted (OpenSSL cannot drop one)
            self.ssl_context.load_verify_locations(cadata=pem.ca.decode("ascii", "replace"))
            self.ssl_context.verify_mode = ssl.CERT_REQUIRED

    async def reload(self) -> bool:
        """Re-read the files; new connections get the new certificate. False (logged) if they do not load."""
        s = self._section
        try:
            pem = await asyncio.to_thread(read_files, s.cert_file, s.key_file, s.client_ca_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("TLS reload failed, keeping the certificate in use: %s", exc)
            return False
        # The live context is changed here, on the event loop that wraps new connections with it:
        # OpenSSL does not allow changing a context from another thread while it is in use.
        self._load_into_context(pem)
        self._pending = self._grpc_config(pem)
        log.info("TLS certificate reloaded from %s", s.cert_file)
        return True


class PeerTls:
    """A sidecar's credentials towards its peers: ``channel_credentials``, ``channel_options``,
    ``ssl_context``."""

    def __init__(self, section: TlsSection) -> None:
        """Reads the files (blocking: construct it in a thread)."""
        self._section = section
        self.ca_file = peer_ca_file(section)
        self.server_name = section.peer_server_name or None
        pem = read_files(section.cert_file, section.key_file, self.ca_file)
        self._credentials = self._make_credentials(pem)
        self.ssl_context = ssl.create_default_context(cafile=self.ca_file or None)
        self.ssl_context.load_cert_chain(section.cert_file, section.key_file)

    @staticmethod
    def _make_credentials(pem: Pem) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=pem.ca, private_key=pem.key,
                                            certificate_chain=pem.cert)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """For a new channel to a peer (channels made earlier keep what they were made with)."""
        return self._credentials

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    async def reload(self) -> bool:
        """Re-read the files: new peer channels and new REST connections present the new certificate."""
        s = self._section
        try:
            pem = await asyncio.to_thread(read_files, s.cert_file, s.key_file, self.ca_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("TLS reload of the peer credentials failed, keeping those in use: %s", exc)
            return False
        self._credentials = self._make_credentials(pem)
        # on the loop: see ServerTls.reload
        self.ssl_context.load_cert_chain(s.cert_file, s.key_file)
        if pem.ca is not None:
            self.ssl_context.load_verify_locations(cadata=pem.ca.decode("ascii", "replace"))
        return True
