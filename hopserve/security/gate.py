"""The access check every hopserve RPC passes before its servicer runs.

``Gate.check(method, metadata, peer)`` decides, from the call's ``authorization: Bearer
<token>`` metadata and its peer, whether a call may proceed:

* a method without a scope of its own needs ``admin`` (deny by default); health and
  reflection are not behind the gate (they are registered outside
  :func:`hopserve.rpc.add_service`);
* with a :class:`~hopserve.security.tokens.TokenStore`: no or unknown token →
  ``UNAUTHENTICATED``; a token without the method's scope → ``PERMISSION_DENIED``;
  without one, every caller is let through (the local, credential-free case);
* with a :class:`~hopserve.security.ratelimit.RateLimiter`: a client over its rate →
  ``RESOURCE_EXHAUSTED`` with ``retry-after-ms`` trailing metadata.

Messages name the method, the scope and the client's *name*, never a token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from hopserve.security.ratelimit import RateLimiter
from hopserve.security.tokens import ADMIN, Identity, TokenStore

__all__ = ["REFUSAL_REASONS", "RETRY_AFTER_KEY", "Denial", "Gate"]

RETRY_AFTER_KEY = "retry-after-ms"
"""Trailing metadata of a rate-limited answer: milliseconds until a retry can pass."""

REFUSAL_REASONS = ("unauthenticated", "permission_denied", "rate_limited")
"""Every :attr:`Denial.reason` (the ``reason`` label of ``hopserve_refused_requests_total``)."""

_BEARER = "bearer "


@dataclass(frozen=True)
class Denial:
    """Why a call is refused, and how to answer it."""

    code: grpc.StatusCode
    message: str
    reason: str  # one of REFUSAL_REASONS (metric label)
    retry_after_s: float | None = None

    @property
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.retry_after_s is None:
            return ()
        return ((RETRY_AFTER_KEY, str(max(1, round(self.retry_after_s * 1000)))),)


class Gate:
    """Authentication, scopes and rate limits of one port.

    Args:
        scopes: full method name (``"/pkg.Service/Method"``) → scope it needs.
        tokens: accepted tokens; None lets every caller through.
        limiter: per-client rate limit; None for none.
        on_reject: called with :attr:`Denial.reason` for every refused call (metrics).
    """

    def __init__(
        self,
        scopes: Mapping[str, str],
        *,
        tokens: TokenStore | None = None,
        limiter: RateLimiter | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.scopes = dict(scopes)
        self.tokens = tokens
        self.limiter = limiter
        self._on_reject = on_reject

    @property
    def enabled(self) -> bool:
        """Whether any check applies."""
        return self.tokens is not None or self.limiter is not None

    def check(
        self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None, peer: str
    ) -> Denial | None:
        """None if the call may proceed, else how to refuse it."""
        identity: Identity | None = None
        if self.tokens is not None:
            scope = self.scopes.get(method, ADMIN)
            token = _bearer(metadata)
            if token is None:
                return self._deny(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"{method} needs a token with scope {scope!r}: send metadata "
                    "'authorization: Bearer <token>'",
                    "unauthenticated",
                )
            identity = self.tokens.authenticate(token)
            if identity is None:
                return self._deny(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"{method}: the token is not valid (unknown or revoked)",
                    "unauthenticated",
                )
            if scope not in identity.scopes:
                return self._deny(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{method} needs scope {scope!r}; client {identity.name!r} has "
                    f"{sorted(identity.scopes)}",
                    "permission_denied",
                )
        if self.limiter is not None:
            key = f"client:{identity.name}" if identity else f"peer:{_peer_host(peer)}"
            wait = self.limiter.acquire(key, identity.requests_per_s if identity else None)
            if wait > 0:
                who = f"client {identity.name!r}" if identity else f"peer {_peer_host(peer)}"
                return self._deny(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"rate limit of {who} exceeded; retry in {wait:.3f}s",
                    "rate_limited",
                    wait,
                )
        return None

    def _deny(
        self, code: grpc.StatusCode, message: str, reason: str, wait: float | None = None
    ) -> Denial:
        if self._on_reject is not None:
            self._on_reject(reason)
        return Denial(code, message, reason, wait)


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key != "authorization" or not isinstance(value, str):
            continue
        if value[: len(_BEARER)].lower() == _BEARER:
            token = value[len(_BEARER) :].strip()
            return token or None
    return None


def _peer_host(peer: str) -> str:
    """``"ipv4:10.0.0.7:51234"`` → ``"ipv4:10.0.0.7"`` (one bucket per host, not per
    connection)."""
    head, sep, tail = peer.rpartition(":")
    return head if sep and tail.isdigit() else peer
