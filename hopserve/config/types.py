"""Field types shared by the config models: secret-bearing URLs and identifiers."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import AfterValidator, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

__all__ = [
    "REDACTED",
    "Address",
    "Device",
    "Entrypoint",
    "Identifier",
    "SecretUrl",
    "matches",
    "redact_url",
]

REDACTED = "***"
"""What a password is replaced with in logs, reprs and error messages."""

_SECRET_QUERY_KEYS = frozenset({"password", "pass", "pwd", "token"})


def matches(pattern: str, expected: str) -> AfterValidator:
    """A validator requiring a full match of ``pattern``; the error says ``must be <expected>``."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {expected}")
        return value

    check.__name__ = f"matches({expected})"
    return AfterValidator(check)


def _str(*validators: Callable[..., Any] | AfterValidator) -> Any:
    return Annotated[str, Field(strict=True), *validators]


Identifier = _str(
    matches(
        r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}",
        "1-128 letters, digits, '_', '.' or '-', starting with a letter or digit",
    )
)
"""A name safe inside cache keys and metric labels (no ``:``, no spaces)."""

Entrypoint = _str(
    matches(
        r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*",
        "'package.module:ClassName'",
    )
)
"""Python entrypoint of a class: dotted module path, ``:``, (dotted) attribute name."""

Device = _str(matches(r"cpu|cuda(:[0-9]+)?", "'cpu', 'cuda' or 'cuda:N'"))
"""A torch device string."""

Address = _str(
    matches(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):[0-9]{1,5}", "'host:port' or '[ipv6]:port'")
)
"""A network address ``host:port``."""


def redact_url(url: str) -> str:
    """Return ``url`` with any password (userinfo or ``?password=``) replaced by ``***``.

    The user name, host, port, path and other query arguments are kept so the result
    still says *where* a connection goes. Never raises; an unparseable URL becomes ``***``.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        userinfo, at, hostport = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if at and colon and password:
            netloc = f"{user}:{REDACTED}@{hostport}"
        query = parts.query
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k, _ in pairs):
            query = urlencode(
                [(k, REDACTED if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs],
                safe="*",
            )
        if netloc == parts.netloc and query == parts.query:
            return url  # nothing secret; keep the exact spelling
        redacted = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
        if not netloc and url.startswith(f"{parts.scheme}://"):  # keep unix:///path
            redacted = redacted.replace(":", "://", 1)
        return redacted
    except ValueError:
        return REDACTED


class SecretUrl:
    """A URL that may carry a password; ``str()`` and ``repr()`` show it redacted.

    Call :meth:`get_secret_value` for the real URL (to hand to a client library only).
    Serialises (``model_dump``, JSON) to the redacted form, so dumping a config is safe.
    """

    __slots__ = ("_url",)
    schemes: tuple[str, ...] = ("redis", "rediss", "unix")

    def __init__(self, url: str) -> None:
        self._url = url

    def get_secret_value(self) -> str:
        """The URL including its password."""
        return self._url

    def __str__(self) -> str:
        return redact_url(self._url)

    def __repr__(self) -> str:
        return f"SecretUrl({redact_url(self._url)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretUrl) and other._url == self._url

    def __hash__(self) -> int:
        return hash(self._url)

    @classmethod
    def _validate(cls, value: Any) -> SecretUrl:
        if isinstance(value, SecretUrl):
            return value
        if not isinstance(value, str):
            raise ValueError("expected a URL string")
        try:
            parts = urlsplit(value)
        except ValueError as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        if parts.scheme not in cls.schemes:
            raise ValueError(f"URL scheme must be one of {', '.join(cls.schemes)}")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("URL has no host")
        try:
            port = parts.port
        except ValueError as exc:  # out of range or not a number
            raise ValueError(f"URL port is invalid ({exc})") from None
        if port == 0:
            raise ValueError("URL port must be 1-65535, got 0")
        return cls(value)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"type": "string", "format": "uri", "writeOnly": True}
