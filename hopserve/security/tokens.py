"""Bearer tokens and their scopes: who may call what.

A token file (YAML) lists the clients a port accepts::

    tokens:
      - name: fraud-scorer               # who it is: logs, metrics and rate limits use it
        scopes: [embeddings:read]
        sha256: 9f86d081884c7d65...      # hex SHA-256 of the token (or ``token: <plain>``)
        requests_per_s: 500              # optional: this client's rate limit

Tokens are never kept in memory in plain text: a presented token is hashed and compared
with every entry's digest in constant time (:func:`hmac.compare_digest`, no early exit), so
neither the answer nor its timing tells how close a guess was. The file is re-read when it
changes (checked at most every :data:`RELOAD_CHECK_S` seconds, or at once after
:meth:`TokenStore.reload`, which SIGHUP calls), so a token is added or revoked without a
restart; a file that fails to parse keeps the previous tokens and logs why.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ADMIN",
    "READ",
    "RELOAD_CHECK_S",
    "SCOPES",
    "WORKER",
    "Identity",
    "TokenError",
    "TokenFile",
    "TokenStore",
    "hash_token",
    "new_token",
]

logger = logging.getLogger(__name__)

READ = "embeddings:read"
"""Scope of the query RPCs (GetEmbeddings, StreamEmbeddings, GetModel, ListModels)."""
ADMIN = "admin"
"""Scope of administrative RPCs (and of any method without a scope of its own)."""
WORKER = "worker"
"""Scope of the internal WorkerService (RunJob, WorkerStatus): the front-end's token."""
SCOPES = frozenset({READ, ADMIN, WORKER})

RELOAD_CHECK_S = 1.0
"""How often (at most) a token lookup checks whether the token file changed."""


class TokenError(ValueError):
    """A token file or token entry that cannot be used (names the file and the entry)."""


@dataclass(frozen=True)
class Identity:
    """An authenticated client: a token file entry, minus the token."""

    name: str
    scopes: frozenset[str]
    requests_per_s: float | None = None
    """This client's rate limit; ``None`` uses the port's default."""


@dataclass(frozen=True)
class _Entry:
    digest: bytes  # SHA-256 of the token
    identity: Identity


def hash_token(token: str) -> str:
    """Hex SHA-256 of ``token``: what a token file's ``sha256`` holds."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    import secrets

    return "hs_" + secrets.token_urlsafe(32)


def parse_tokens(text: str, source: str) -> list[_Entry]:
    """Entries of a token document (YAML, see the module docstring).

    Raises:
        TokenError: naming ``source`` and the entry; never quoting a token.
    """
    import yaml  # pyyaml: the front-end's and the worker's dependency, not the client's

    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise TokenError(f"{source}: not valid YAML ({type(err).__name__})") from None
    items = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise TokenError(f"{source}: expected a mapping with a 'tokens' list")
    entries: list[_Entry] = []
    names: set[str] = set()
    for index, item in enumerate(items):
        where = f"{source}: tokens[{index}]"
        if not isinstance(item, dict):
            raise TokenError(f"{where}: expected a mapping")
        unknown = set(item) - {"name", "scopes", "sha256", "token", "requests_per_s"}
        if unknown:
            raise TokenError(f"{where}: unknown key(s) {sorted(unknown)}")
        name = item.get("name")
        if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 64:
            raise TokenError(f"{where}: 'name' must be a printable string of 1-64 characters")
        if name in names:
            raise TokenError(f"{where}: duplicate name {name!r}")
        names.add(name)
        scopes = item.get("scopes")
        if not isinstance(scopes, list) or not scopes or not set(scopes) <= SCOPES:
            raise TokenError(
                f"{where} ({name}): 'scopes' must be a non-empty list of {sorted(SCOPES)}"
            )
        digest = _digest(item, where, name)
        rate = item.get("requests_per_s")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                                 or rate <= 0):  # fmt: skip
            raise TokenError(f"{where} ({name}): 'requests_per_s' must be a positive number")
        identity = Identity(name, frozenset(scopes), None if rate is None else float(rate))
        entries.append(_Entry(digest, identity))
    return entries


def read_token_file(path: Path) -> str:
    """The one token a file holds (the link token), surrounding white space removed.

    Raises:
        TokenError: unreadable, or not one printable token of >= 16 characters.
    """
    try:
        token = path.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise TokenError(f"{path}: {getattr(err, 'strerror', None) or err}") from None
    if len(token) < 16 or not token.isprintable() or any(c.isspace() for c in token):
        raise TokenError(f"{path}: expected one printable token of >= 16 characters")
    return token


class TokenFile:
    """The token a client sends, read from a file and re-read when it changes (checked
    at most every :data:`RELOAD_CHECK_S` seconds): the front-end's link token.

    Raises (constructor):
        TokenError: the file cannot be used.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token = read_token_file(path)
        self._stamp = _stamp(path)
        self._checked = time.monotonic()

    @property
    def token(self) -> str:
        now = time.monotonic()
        if now - self._checked >= RELOAD_CHECK_S:
            self._checked = now
            stamp = _stamp(self.path)
            if stamp != self._stamp:
                try:
                    self._token = read_token_file(self.path)
                    self._stamp = stamp
                    logger.info("token reloaded from %s", self.path)
                except TokenError as err:
                    logger.error("token not reloaded, keeping the previous one: %s", err)
        return self._token


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _digest(item: dict, where: str, name: str) -> bytes:
    has_hash, has_plain = "sha256" in item, "token" in item
    if has_hash == has_plain:
        raise TokenError(f"{where} ({name}): give exactly one of 'sha256' and 'token'")
    if has_plain:
        token = item["token"]
        if not isinstance(token, str) or len(token) < 16:
            raise TokenError(f"{where} ({name}): 'token' must be a string of >= 16 characters")
        return hashlib.sha256(token.encode("utf-8")).digest()
    value = item["sha256"]
    try:
        digest = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise TokenError(f"{where} ({name}): 'sha256' must be 64 hex digits")
    return digest


class TokenStore:
    """The tokens a port accepts: from a token file (re-read on change) or an environment
    variable holding the same YAML; or, with ``single``, the one token of a file (the
    worker's link token, re-read on change) standing for that identity.

    Raises (constructor):
        TokenError: the initial tokens cannot be read; names the file or variable.
    """

    def __init__(
        self,
        *,
        path: Path | None = None,
        env: str | None = None,
        single: Identity | None = None,
    ) -> None:
        self._path = path
        self._env = env
        self._single = single
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = time.monotonic()  # just read: the next check is due in RELOAD_CHECK_S
        self._load(initial=True)

    @property
    def source(self) -> str:
        """Where the tokens come from (for logs and ``serve --check``)."""
        if self._path is not None:
            return str(self._path)
        if self._env is not None:
            return f"${self._env}"
        return "built-in"

    @property
    def names(self) -> list[str]:
        """The accepted clients' names."""
        return [e.identity.name for e in self._entries]

    def authenticate(self, token: str) -> Identity | None:
        """The identity whose token is ``token``, or None; constant time in the token."""
        self._maybe_reload()
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: Identity | None = None
        for entry in self._entries:  # no early exit: every digest is compared
            if hmac.compare_digest(digest, entry.digest):
                found = entry.identity
        return found

    def reload(self) -> None:
        """Re-read the token file now (SIGHUP); keeps the old tokens if it is broken."""
        self._load(initial=False, force=True)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if self._path is None or now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        self._load(initial=False)

    def _load(self, *, initial: bool, force: bool = False) -> None:
        with self._lock:
            try:
                if self._path is not None:
                    stat = self._path.stat()
                    stamp = (stat.st_mtime_ns, stat.st_size)
                    if not force and stamp == self._stamp:
                        return
                    if self._single is not None:
                        token = read_token_file(self._path).encode("utf-8")
                        entries = [_Entry(hashlib.sha256(token).digest(), self._single)]
                    else:
                        entries = parse_tokens(self._path.read_text("utf-8"), str(self._path))
                    self._stamp = stamp
                elif self._env is not None:
                    text = os.environ.get(self._env)
                    if text is None:
                        raise TokenError(f"${self._env}: environment variable is not set")
                    entries = parse_tokens(text, f"${self._env}")
                else:
                    entries = []
            except (OSError, TokenError) as err:
                message = err if isinstance(err, TokenError) else f"{self._path}: {err.strerror}"
                if initial:
                    raise TokenError(str(message)) from None
                logger.error("tokens not reloaded, keeping the previous ones: %s", message)
                return
            self._entries = entries
            if not initial:
                logger.info("tokens reloaded from %s: %d client(s)", self.source, len(entries))
