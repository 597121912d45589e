"""The connection options of the client commands (``query``, ``loadtest``): TLS and token.

The same options as the SDK clients' keyword arguments; the token can come from the
``HOPSERVE_TOKEN`` environment variable or a file, so it stays out of shell history and
``ps``. Imports the client SDK only (no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["ClientCert", "ClientKey", "RootCerts", "Tls", "Token", "TokenFile", "client_options"]

_PEM = {"exists": True, "dir_okay": False}

Tls = Annotated[bool, typer.Option("--tls", help="TLS with the system's root certificates.")]
RootCerts = Annotated[
    Path | None,
    typer.Option("--root-certs", **_PEM, help="CA certificate(s) to trust, PEM (implies TLS)."),
]
ClientCert = Annotated[
    Path | None,
    typer.Option("--client-cert", **_PEM, help="Client certificate for mutual TLS, PEM."),
]
ClientKey = Annotated[
    Path | None, typer.Option("--client-key", **_PEM, help="The client certificate's key, PEM.")
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="HOPSERVE_TOKEN", show_envvar=True, show_default=False,
        help="Bearer token (prefer the environment variable or --token-file).",
    ),
]  # fmt: skip
TokenFile = Annotated[
    Path | None,
    typer.Option("--token-file", **_PEM, help="File holding the bearer token."),
]


def client_options(
    tls: bool,
    root_certs: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token: str | None,
    token_file: Path | None,
) -> dict[str, Any]:
    """Keyword arguments of the SDK clients for these options.

    Raises:
        typer.BadParameter: both ``--token`` and ``--token-file``, or half a client
            certificate.
    """
    if token is not None and token_file is not None:
        raise typer.BadParameter("give --token (or HOPSERVE_TOKEN) or --token-file, not both")
    if (client_cert is None) != (client_key is None):
        raise typer.BadParameter("--client-cert and --client-key go together")
    if token_file is not None:
        token = token_file.read_text("utf-8").strip()
    options: dict[str, Any] = {"tls": tls, "token": token or None}
    if root_certs is not None:
        options["root_certificates"] = root_certs
    if client_cert is not None:
        options["client_certificate"] = client_cert
        options["client_key"] = client_key
    return options
