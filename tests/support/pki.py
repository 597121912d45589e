"""Certificates and tokens for the security tests, written to a folder as a deployment
would mount them (generated with ``cryptography`` through :mod:`hopserve.security.pki`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hopserve.security import pki
from hopserve.security.tokens import hash_token

READ_TOKEN = "hs_read_token_0123456789abcdef"
ADMIN_TOKEN = "hs_admin_token_0123456789abcdef"
LINK_TOKEN = "hs_link_token_0123456789abcdef"


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for localhost/127.0.0.1, and a client certificate."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def write_pki(folder: Path, prefix: str = "") -> Pki:
    """A fresh CA and leaves under ``folder`` (files named ``{prefix}ca.crt`` ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca(f"{prefix or 'test'} CA")
    server = pki.issue(ca, "localhost", ["127.0.0.1"])
    client = pki.issue(ca, "front-end")
    paths = {}
    for name, data in {
        "ca.crt": ca.cert, "server.crt": server.cert, "server.key": server.key,
        "client.crt": client.cert, "client.key": client.key,
    }.items():  # fmt: skip
        path = folder / f"{prefix}{name}"
        path.write_bytes(data)
        paths[name] = path
    return Pki(folder, paths["ca.crt"], paths["server.crt"], paths["server.key"],
               paths["client.crt"], paths["client.key"])  # fmt: skip


def write_tokens(path: Path, *, extra: str = "", hashed: bool = True) -> Path:
    """A token file: ``reader`` (embeddings:read, by hash), ``ops`` (admin only)."""
    reader = f"sha256: {hash_token(READ_TOKEN)}" if hashed else f"token: {READ_TOKEN}"
    path.write_text(
        "tokens:\n"
        f"  - {{name: reader, scopes: [embeddings:read], {reader}}}\n"
        f"  - {{name: ops, scopes: [admin], token: {ADMIN_TOKEN}}}\n" + extra
    )
    return path
