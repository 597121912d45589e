"""The security objects of each port, built from :class:`~hopserve.config.SecurityConfig`.

* public port (front-end): :func:`public_gate`, :func:`public_credentials`;
* worker port: :func:`worker_gate`, :func:`worker_credentials`;
* the front-end's side of the link: :func:`link_channel`;
* :func:`posture`: one line per port saying what protects it (start-up log, ``serve
  --check``), and :func:`exposure_warnings`: what an operator must hear about.

Raises :class:`~hopserve.config.ConfigError` (naming the key) for unusable files.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from hopserve.config.errors import ConfigError
from hopserve.config.security import LinkConfig, SecurityConfig
from hopserve.security.gate import Gate
from hopserve.security.ratelimit import RateLimiter
from hopserve.security.tls import (
    ChannelCredentialFiles,
    TlsError,
    read_pem,
    server_credentials,
)
from hopserve.security.tokens import (
    READ,
    WORKER,
    Identity,
    TokenError,
    TokenFile,
    TokenStore,
)

__all__ = [
    "FRONTEND_SCOPES",
    "WORKER_SCOPES",
    "LinkChannel",
    "exposure_warnings",
    "is_loopback",
    "link_channel",
    "posture",
    "public_credentials",
    "public_gate",
    "worker_credentials",
    "worker_gate",
]

_EMBEDDING = "/hopserve.v1.EmbeddingService/"
_WORKER = "/hopserve.v1.WorkerService/"

FRONTEND_SCOPES = {
    f"{_EMBEDDING}{m}": READ
    for m in ("GetEmbeddings", "StreamEmbeddings", "GetModel", "ListModels")
}
"""Method → scope of the public port; any other method needs ``admin``."""

WORKER_SCOPES = {
    f"{_WORKER}{m}": WORKER for m in ("RunJob", "WorkerStatus", "LoadModel", "UnloadModel")
}
"""Method → scope of the worker port."""


def public_gate(sec: SecurityConfig, on_reject: Callable[[str], None] | None = None) -> Gate:
    """Tokens and rate limit of the public port."""
    tokens = None
    try:
        if sec.tokens_file is not None:
            tokens = TokenStore(path=sec.tokens_file)
        elif sec.tokens_env is not None:
            tokens = TokenStore(env=sec.tokens_env)
    except TokenError as err:
        raise ConfigError(f"security.tokens: {err}") from None
    limit = sec.rate_limit
    limiter = RateLimiter(limit.requests_per_s, limit.burst) if limit.requests_per_s else None
    return Gate(FRONTEND_SCOPES, tokens=tokens, limiter=limiter, on_reject=on_reject)


def public_credentials(sec: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS of the public port, None for plaintext."""
    if sec.tls is None:
        return None
    try:
        return server_credentials(sec.tls.cert_file, sec.tls.key_file, sec.tls.client_ca_file)
    except TlsError as err:
        raise ConfigError(f"security.tls: {err}") from None


def worker_gate(link: LinkConfig) -> Gate:
    """The worker port admits the front-end's link token (scope ``worker``), if set."""
    if link.token_file is None:
        return Gate(WORKER_SCOPES)
    try:
        tokens = TokenStore(path=link.token_file, single=_FRONT_END)
    except TokenError as err:
        raise ConfigError(f"security.link.token_file: {err}") from None
    return Gate(WORKER_SCOPES, tokens=tokens)


_FRONT_END = Identity("front-end", frozenset({WORKER}))


def worker_credentials(link: LinkConfig) -> grpc.ServerCredentials | None:
    """Mutual TLS of the worker port (client certificates signed by ``ca_file``)."""
    if not link.tls:
        return None
    try:
        return server_credentials(link.cert_file, link.key_file, link.ca_file)  # type: ignore[arg-type]
    except TlsError as err:
        raise ConfigError(f"security.link: {err}") from None


@dataclass(frozen=True)
class LinkChannel:
    """How the front-end opens a channel to a worker."""

    credentials: ChannelCredentialFiles | None
    token: TokenFile | None
    options: tuple[tuple[str, str], ...]

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: the link token, as it is in its file now."""
        if self.token is None:
            return ()
        return (("authorization", f"Bearer {self.token.token}"),)


def link_channel(link: LinkConfig) -> LinkChannel:
    """Credentials, call metadata and channel options of the front-end → worker link."""
    credentials = None
    options: tuple[tuple[str, str], ...] = ()
    if link.tls:
        try:
            credentials = ChannelCredentialFiles(link.ca_file, link.cert_file, link.key_file)  # type: ignore[arg-type]
        except TlsError as err:
            raise ConfigError(f"security.link: {err}") from None
        if link.server_name:
            options = (("grpc.ssl_target_name_override", link.server_name),)
    token = None
    if link.token_file is not None:
        try:
            token = TokenFile(link.token_file)
        except TokenError as err:
            raise ConfigError(f"security.link.token_file: {err}") from None
    return LinkChannel(credentials, token, options)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a port on this machine."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def posture(sec: SecurityConfig, host: str, *, worker: bool = False) -> str:
    """One line: what protects the port bound at ``host``."""
    if worker:
        link = sec.link
        tls = "mutual TLS" if link.tls else "plaintext"
        auth = "link token required" if link.token_file else "no token"
        return f"worker port on {host}: {tls}, {auth}"
    if sec.tls is None:
        tls = "plaintext"
    elif sec.tls.client_ca_file is not None:
        tls = "TLS with client certificates"
    else:
        tls = "TLS"
    if sec.tokens_file is not None or sec.tokens_env is not None:
        auth = f"tokens from {sec.tokens_file or '$' + str(sec.tokens_env)}"
    else:
        auth = "no authentication"
    rate = sec.rate_limit.requests_per_s
    limit = f"rate limit {rate:g}/s per client" if rate else "no rate limit"
    link = sec.link
    to_workers = (
        f"{'mutual TLS' if link.tls else 'plaintext'}{' + token' if link.token_file else ''}"
    )
    return f"public port on {host}: {tls}, {auth}, {limit}; to workers: {to_workers}"


def exposure_warnings(sec: SecurityConfig, host: str, *, worker: bool = False) -> list[str]:
    """Warnings for a port reachable from other machines without protection."""
    if is_loopback(host):
        return []
    if worker:
        link = sec.link
        missing = [w for w, on in (("mutual TLS", link.tls), ("a link token",
                                   link.token_file is not None)) if not on]  # fmt: skip
        what = "anyone who can reach it can run jobs and read embeddings"
    else:
        missing = [w for w, on in (("TLS", sec.tls is not None), ("tokens",
                   sec.tokens_file is not None or sec.tokens_env is not None)) if not on]  # fmt: skip
        what = "anyone who can reach it can read every embedding"
    if not missing:
        return []
    port = "worker port" if worker else "public port"
    return [
        f"the {port} binds {host} (not loopback) without {' or '.join(missing)}: {what}; "
        "configure security (README, Security)"
    ]


def check_files(sec: SecurityConfig) -> None:
    """Every configured certificate, key, CA and token file is readable (``--check``).

    Raises:
        ConfigError: listing each unusable file.
    """
    problems = []
    pems = []
    if sec.tls is not None:
        pems += [("security.tls.cert_file", sec.tls.cert_file),
                 ("security.tls.key_file", sec.tls.key_file),
                 ("security.tls.client_ca_file", sec.tls.client_ca_file)]  # fmt: skip
    link = sec.link
    pems += [("security.link.ca_file", link.ca_file), ("security.link.cert_file",
             link.cert_file), ("security.link.key_file", link.key_file)]  # fmt: skip
    for key, path in pems:
        if path is None:
            continue
        try:
            read_pem(path, "file")
        except TlsError as err:
            problems.append(f"{key}: {err}")
    for build in (lambda: public_gate(sec), lambda: link_channel(link)):
        try:
            build()
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError(problems)
