"""The ``security:`` section: TLS, tokens and rate limits of the public port, and the
credentials of the front-end ↔ worker link.

Everything is off by default, which suits the local case (``make demo`` binds loopback);
any process that binds a non-loopback address without TLS or tokens warns at start-up,
and ``hopserve serve --check`` prints the posture. Paths are relative to the config file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["LinkConfig", "RateLimitConfig", "SecurityConfig", "TlsConfig"]


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True
    )


def _anchor(base: Path, path: Path | None) -> Path | None:
    if path is None:
        return None
    path = path.expanduser()
    return path if path.is_absolute() else (base / path).resolve()


class TlsConfig(_Section):
    """TLS of the public gRPC port (PEM files, re-read when they change)."""

    cert_file: Path
    """Server certificate (chain), PEM."""

    key_file: Path
    """Its private key, PEM."""

    client_ca_file: Path | None = None
    """CA whose client certificates the port requires (mutual TLS); ``None``: clients
    authenticate with tokens only."""


class RateLimitConfig(_Section):
    """Per-client request rate of the public port (token bucket per token name, or per
    peer address without tokens); over it: RESOURCE_EXHAUSTED with a retry hint."""

    requests_per_s: Annotated[float, Field(ge=0.0, le=1e7)] = 0.0
    """Sustained RPCs per second per client; 0 turns rate limiting off. A token file
    entry's ``requests_per_s`` overrides it for that client."""

    burst: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    """RPCs a client may send at once after being idle; default one second's worth."""


class LinkConfig(_Section):
    """The front-end ↔ worker link. Each side reads the same keys: mount each process's
    own certificate at ``cert_file``/``key_file`` (the worker's is its server certificate,
    the front-end's its client certificate), both signed by ``ca_file``."""

    ca_file: Path | None = None
    """CA that signs both sides' certificates; with it the link is mutual TLS: the worker
    accepts only clients with a certificate it signed, the front-end only such workers."""

    cert_file: Path | None = None
    """This process's link certificate, PEM."""

    key_file: Path | None = None
    """Its private key, PEM."""

    server_name: str | None = None
    """Name the front-end expects in worker certificates when it differs from the host
    of the worker address (e.g. one certificate for every worker replica)."""

    token_file: Path | None = None
    """File holding the link's shared token: the front-end sends it, the worker requires
    it (scope ``worker``). Re-read on change by the worker."""

    @model_validator(mode="after")
    def _complete(self) -> LinkConfig:
        given = [f for f in ("ca_file", "cert_file", "key_file") if getattr(self, f)]
        if given and len(given) != 3:
            raise ValueError("mutual TLS needs all of ca_file, cert_file and key_file")
        return self

    @property
    def tls(self) -> bool:
        return self.ca_file is not None


class SecurityConfig(_Section):
    """Security of the public port and of the worker link."""

    tls: TlsConfig | None = None
    """TLS of the public port; ``None``: plaintext."""

    tokens_file: Path | None = None
    """Token file (YAML: ``tokens: [{name, scopes, sha256 | token, requests_per_s}]``)
    of the public port; re-read when it changes and on SIGHUP. ``None`` (and no
    ``tokens_env``): no authentication."""

    tokens_env: str | None = None
    """Environment variable holding the token document instead of a file."""

    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    """Per-client rate limit of the public port."""

    link: LinkConfig = Field(default_factory=LinkConfig)
    """Front-end ↔ worker credentials."""

    @model_validator(mode="after")
    def _one_token_source(self) -> SecurityConfig:
        if self.tokens_file is not None and self.tokens_env is not None:
            raise ValueError("give tokens_file or tokens_env, not both")
        return self

    def anchored(self, base: Path) -> SecurityConfig:
        """Every path resolved against ``base`` (the config file's folder)."""
        tls = self.tls
        link = self.link
        return self.model_copy(
            update={
                "tls": None if tls is None else tls.model_copy(update={
                    "cert_file": _anchor(base, tls.cert_file),
                    "key_file": _anchor(base, tls.key_file),
                    "client_ca_file": _anchor(base, tls.client_ca_file),
                }),
                "tokens_file": _anchor(base, self.tokens_file),
                "link": link.model_copy(update={
                    f: _anchor(base, getattr(link, f))
                    for f in ("ca_file", "cert_file", "key_file", "token_file")
                }),
            }
        )  # fmt: skip
