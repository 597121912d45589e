"""TLS credentials from PEM files, for servers (re-read on change) and channels.

:func:`server_credentials` gives gRPC *dynamic* server credentials: before each new
handshake gRPC asks for the current certificate, and the files are re-read when their
modification time or size changed, so a rotated certificate (cert-manager, a renewed
secret) is served without a restart; connections already open keep the old one. A
rotation caught half-written (a key that does not parse) keeps the previous pair and logs
why. With ``client_ca_file`` the server requires a client certificate signed by it
(mutual TLS: the worker port, or a public port that wants client certificates).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import grpc

__all__ = [
    "ChannelCredentialFiles",
    "TlsError",
    "channel_credentials",
    "read_pem",
    "server_credentials",
]

logger = logging.getLogger(__name__)


class TlsError(ValueError):
    """A certificate, key or CA file that cannot be used (names the file)."""


def read_pem(path: Path | str, what: str) -> bytes:
    """The bytes of PEM file ``path``.

    Raises:
        TlsError: the file is missing, unreadable or holds no PEM block.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TlsError(f"{what} {path}: {err.strerror or err}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{what} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def _stamps(paths: list[Path]) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in paths:
        try:
            st = path.stat()
            stamps.append((st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.append((-1, -1))
    return tuple(stamps)


class _Files:
    """The certificate files of one server, and when they were last read."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self.paths = [p for p in (cert, key, client_ca) if p is not None]
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self._stamp = _stamps(self.paths)
        self._lock = threading.Lock()

    def config(self) -> grpc.ServerCertificateConfiguration:
        pair = (read_pem(self.key, "TLS key"), read_pem(self.cert, "TLS certificate"))
        ca = None if self.client_ca is None else read_pem(self.client_ca, "client CA")
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration when the files changed, else None."""
        with self._lock:
            stamp = _stamps(self.paths)
            if stamp == self._stamp:
                return None
            try:
                config = self.config()
            except TlsError as err:
                logger.error("TLS files changed but cannot be read; keeping the old ones: %s", err)
                return None
            self._stamp = stamp
        logger.info("TLS certificate reloaded from %s", self.cert)
        return config


def server_credentials(
    cert_file: Path | str, key_file: Path | str, client_ca_file: Path | str | None = None
) -> grpc.ServerCredentials:
    """Server credentials that follow the files (see the module docstring).

    Raises:
        TlsError: a file is missing or not PEM (checked now, not at the first handshake).
    """
    files = _Files(Path(cert_file), Path(key_file), None if client_ca_file is None
                   else Path(client_ca_file))  # fmt: skip
    return grpc.dynamic_ssl_server_credentials(
        files.config(), files.fetch, require_client_authentication=client_ca_file is not None
    )


def channel_credentials(
    root_certificates: Path | str | bytes | None = None,
    certificate_chain: Path | str | bytes | None = None,
    private_key: Path | str | bytes | None = None,
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files or bytes.

    ``root_certificates`` None trusts the system roots; a client certificate needs both
    ``certificate_chain`` and ``private_key``.

    Raises:
        TlsError: a missing/unreadable file, or only one of chain and key.
    """
    if (certificate_chain is None) != (private_key is None):
        raise TlsError("a client certificate needs both the certificate chain and its key")
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(root_certificates, "root certificates"),
        private_key=_pem(private_key, "client key"),
        certificate_chain=_pem(certificate_chain, "client certificate"),
    )


def _pem(value: Path | str | bytes | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return read_pem(value, what)


class ChannelCredentialFiles:
    """A client's TLS credentials from PEM files, rebuilt when a file changes (checked at
    most every ``check_s`` seconds): the front-end's side of the worker link, whose
    client certificate can then be rotated without a restart. A rotation caught
    half-written keeps the previous credentials and logs why.

    Raises (constructor):
        TlsError: a file is missing or not PEM.
    """

    def __init__(
        self,
        root_certificates: Path,
        certificate_chain: Path | None = None,
        private_key: Path | None = None,
        *,
        check_s: float = 1.0,
    ) -> None:
        self._args = (root_certificates, certificate_chain, private_key)
        self._paths = [Path(p) for p in self._args if p is not None]
        self._check_s = check_s
        self._stamp = _stamps(self._paths)
        self._credentials = channel_credentials(*self._args)
        self._checked = time.monotonic()

    def current(self) -> grpc.ChannelCredentials:
        """The credentials for a new channel: the same object until the files change."""
        now = time.monotonic()
        if now - self._checked < self._check_s:
            return self._credentials
        self._checked = now
        stamp = _stamps(self._paths)
        if stamp != self._stamp:
            try:
                self._credentials = channel_credentials(*self._args)
                self._stamp = stamp
                logger.info("TLS client certificate reloaded from %s", self._args[1])
            except TlsError as err:
                logger.error("TLS files changed but cannot be read; keeping the old ones: %s", err)
        return self._credentials
