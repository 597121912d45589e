"""``hopserve security``: make certificates and tokens; ``hopserve health``: probe a port.

::

    hopserve security init secrets --public-name hopserve.example.com --worker-name hopserve-worker
    hopserve security token --name fraud-scorer --scope embeddings:read
    hopserve health --target 127.0.0.1:50052 --service hopserve.v1.WorkerService \\
        --root-certs ca.crt --client-cert tls.crt --client-key tls.key

``init`` writes a development CA and everything a deployment mounts (README, Security);
keys and tokens get mode 0600 and the folder is written whole or not at all. ``token``
prints a new token and its ``tokens.yaml`` entry (the file keeps only the hash). Torch-free.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from hopserve.cli import app
from hopserve.cli.common import fail
from hopserve.cli.connect import ClientCert, ClientKey, RootCerts, Tls, client_options

security_app = typer.Typer(
    help="Certificates and tokens for TLS, mutual TLS to workers, and scoped access.",
    no_args_is_help=True,
)
app.add_typer(security_app, name="security")

_LOCAL = ("localhost", "127.0.0.1")


@security_app.command("init")
def init_cmd(
    out: Annotated[Path, typer.Argument(help="Folder to create (e.g. deploy/secrets).")],
    public_name: Annotated[
        list[str] | None,
        typer.Option("--public-name", help="DNS name or IP clients use for the front-end."),
    ] = None,
    worker_name: Annotated[
        list[str] | None,
        typer.Option("--worker-name", help="DNS name or IP the front-end uses for workers."),
    ] = None,
    days: Annotated[int, typer.Option("--days", min=1, max=825, help="Leaf validity.")] = 365,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing folder.")] = False,
) -> None:
    """A CA, the front-end's and workers' certificates, the link token and client tokens."""
    from hopserve.security.pki import issue, make_ca
    from hopserve.security.tokens import hash_token, new_token

    if out.exists() and not force:
        fail(f"{out} exists (use --force to replace it)")
    ca = make_ca()
    public = issue(ca, *_names(public_name, "hopserve"), days=days)
    worker = issue(ca, *_names(worker_name, "hopserve-worker"), days=days)
    link_client = issue(ca, "hopserve-frontend", days=days)
    reader, admin = new_token(), new_token()
    files: dict[str, bytes] = {
        "ca.crt": ca.cert, "ca.key": ca.key,
        "frontend.crt": public.cert, "frontend.key": public.key,
        "worker.crt": worker.cert, "worker.key": worker.key,
        "frontend-link.crt": link_client.cert, "frontend-link.key": link_client.key,
        "link.token": new_token().encode() + b"\n",
        "reader.token": reader.encode() + b"\n",
        "admin.token": admin.encode() + b"\n",
        "tokens.yaml": (
            "# hopserve tokens: clients, their scopes and the SHA-256 of their tokens.\n"
            "# Add one with `hopserve security token --name NAME --scope embeddings:read`.\n"
            "tokens:\n"
            f"  - {{name: reader, scopes: [embeddings:read], sha256: {hash_token(reader)}}}\n"
            f"  - {{name: admin, scopes: [admin], sha256: {hash_token(admin)}}}\n"
        ).encode(),
    }  # fmt: skip
    _write_folder(out, files, force)
    typer.echo(f"wrote {out}/: {', '.join(files)}", err=True)
    typer.echo(
        f"keep {out}/ca.key offline; give clients ca.crt and a token file "
        "(reader.token: scope embeddings:read)",
        err=True,
    )


@security_app.command("token")
def token_cmd(
    name: Annotated[str, typer.Option("--name", help="Client name (logs, metrics, limits).")],
    scope: Annotated[
        list[str],
        typer.Option("--scope", help="embeddings:read and/or admin (repeatable)."),
    ],
    requests_per_s: Annotated[
        float | None,
        typer.Option("--requests-per-s", min=0.001, help="This client's rate limit."),
    ] = None,
) -> None:
    """Print a new token (stdout) and its tokens.yaml entry (stderr)."""
    from hopserve.security.tokens import ADMIN, READ, hash_token, new_token

    bad = sorted(set(scope) - {READ, ADMIN})
    if bad:
        fail(f"--scope: unknown scope(s) {bad}; use {READ} or {ADMIN}")
    token = new_token()
    limit = "" if requests_per_s is None else f", requests_per_s: {requests_per_s:g}"
    typer.echo(token)
    typer.echo(
        f"  - {{name: {name}, scopes: [{', '.join(scope)}], sha256: {hash_token(token)}{limit}}}",
        err=True,
    )


@app.command("health")
def health_cmd(
    target: Annotated[str, typer.Option("--target", "-t", help="HOST:PORT.")] = "localhost:50051",
    service: Annotated[
        str, typer.Option("--service", help="Health service: '' (all models), a model name.")
    ] = "",
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds.")] = 3.0,
    tls: Tls = False,
    root_certs: RootCerts = None,
    client_cert: ClientCert = None,
    client_key: ClientKey = None,
) -> None:
    """Exit 0 if ``target`` reports ``service`` SERVING (grpc.health.v1), else 1; for
    container health checks on TLS ports, where kubelet's gRPC probe cannot go."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from hopserve.security.tls import TlsError, channel_credentials

    client_options(tls, root_certs, client_cert, client_key, None, None)  # checks the pair
    secure = tls or root_certs is not None or client_cert is not None
    try:
        credentials = channel_credentials(root_certs, client_cert, client_key) if secure else None
    except TlsError as err:
        fail(str(err))
    channel = (
        grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    )
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    except grpc.RpcError as err:
        typer.echo(f"{target}: {err.code().name}: {err.details()}", err=True)
        raise typer.Exit(1) from None
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    typer.echo(f"{target} {service or '(server)'}: {status}", err=True)
    raise typer.Exit(0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1)


def _names(given: list[str] | None, default: str) -> tuple[str, list[str]]:
    names = list(dict.fromkeys([*(given or [default]), *_LOCAL]))
    return names[0], names[1:]


def _write_folder(out: Path, files: dict[str, bytes], force: bool) -> None:
    """Write ``files`` into a sibling temporary folder, then move it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, data in files.items():
            path = tmp / name
            path.write_bytes(data)
            secret = name.endswith((".key", ".token")) or name == "tokens.yaml"
            os.chmod(path, 0o600 if secret else 0o644)
        os.chmod(tmp, 0o700)
        if out.exists() and force:
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
