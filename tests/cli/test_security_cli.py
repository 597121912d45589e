"""``hopserve security init|token`` and ``hopserve health``: what they write works with
real TLS, mutual TLS and the token store; ``serve --check`` reports the posture."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from support.processes import run_hopserve as hopserve
from support.servable import Servable, write_servable

from hopserve.security.tls import server_credentials
from hopserve.security.tokens import READ, TokenStore

FILES = {
    "ca.crt", "ca.key", "frontend.crt", "frontend.key", "worker.crt", "worker.key",
    "frontend-link.crt", "frontend-link.key", "link.token", "reader.token", "admin.token",
    "tokens.yaml",
}  # fmt: skip


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("init") / "secrets"
    proc = hopserve("security", "init", str(out), "--public-name", "hs.example",
                    "--worker-name", "hopserve-worker")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def test_init_writes_every_file_keys_private(secrets: Path) -> None:
    assert {p.name for p in secrets.iterdir()} == FILES
    for path in secrets.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        private = path.suffix in (".key", ".token") or path.name == "tokens.yaml"
        assert mode == (0o600 if private else 0o644), path.name
    again = hopserve("security", "init", str(secrets))
    assert again.returncode == 2 and "exists" in again.stderr  # nothing overwritten


def test_init_tokens_match_their_hashes(secrets: Path) -> None:
    store = TokenStore(path=secrets / "tokens.yaml")
    reader = store.authenticate((secrets / "reader.token").read_text().strip())
    admin = store.authenticate((secrets / "admin.token").read_text().strip())
    assert (reader.name, reader.scopes) == ("reader", frozenset({READ}))
    assert admin.name == "admin" and READ not in admin.scopes
    assert (secrets / "reader.token").read_text().strip() not in (
        secrets / "tokens.yaml"
    ).read_text()


def test_token_command_prints_a_usable_entry(tmp_path: Path) -> None:
    proc = hopserve("security", "token", "--name", "fraud", "--scope", READ,
                    "--requests-per-s", "50")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    token = proc.stdout.strip()
    (tmp_path / "t.yaml").write_text("tokens:\n" + proc.stderr)
    identity = TokenStore(path=tmp_path / "t.yaml").authenticate(token)
    assert (identity.name, identity.requests_per_s) == ("fraud", 50.0)
    bad = hopserve("security", "token", "--name", "x", "--scope", "root")
    assert bad.returncode == 2 and "unknown scope" in bad.stderr


def _health_server(credentials: grpc.ServerCredentials) -> tuple[grpc.Server, int]:
    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


@pytest.fixture
def public_port(secrets: Path) -> Iterator[int]:
    server, port = _health_server(
        server_credentials(secrets / "frontend.crt", secrets / "frontend.key")
    )
    yield port
    server.stop(0)


@pytest.fixture
def worker_port(secrets: Path) -> Iterator[int]:
    creds = server_credentials(secrets / "worker.crt", secrets / "worker.key", secrets / "ca.crt")
    server, port = _health_server(creds)
    yield port
    server.stop(0)


def test_health_over_the_public_certificate(secrets: Path, public_port: int) -> None:
    ca = str(secrets / "ca.crt")
    for host in ("localhost", "127.0.0.1"):
        ok = hopserve("health", "--target", f"{host}:{public_port}", "--root-certs", ca)
        assert ok.returncode == 0 and "SERVING" in ok.stderr, ok.stderr
    plain = hopserve("health", "--target", f"127.0.0.1:{public_port}", "--timeout", "2")
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr


def test_health_over_mutual_tls_needs_the_link_certificate(secrets: Path, worker_port: int) -> None:
    target = ("--target", f"127.0.0.1:{worker_port}", "--root-certs", str(secrets / "ca.crt"))
    client = ("--client-cert", str(secrets / "frontend-link.crt"),
              "--client-key", str(secrets / "frontend-link.key"))  # fmt: skip
    assert hopserve("health", *target, *client).returncode == 0
    assert hopserve("health", *target, "--timeout", "2").returncode == 1
    half = hopserve("health", *target, "--client-cert", str(secrets / "frontend-link.crt"))
    assert half.returncode == 2 and "--client-key" in half.stderr


def test_check_reports_the_security_posture(tmp_path: Path, secrets: Path) -> None:
    servable: Servable = write_servable(tmp_path / "servable")
    model = {"name": "tiny", "entrypoint": "support.servable:TinySAGE",
             "kwargs": servable.kwargs, "weights": str(servable.weights),
             "graph": str(servable.graph_dir)}  # fmt: skip
    doc = {"models": [model], "server": {"host": "0.0.0.0", "metrics_port": 0},
           "cache": {"backend": "memory"}}  # fmt: skip
    open_config = tmp_path / "open.yaml"
    open_config.write_text(yaml.safe_dump(doc))
    proc = hopserve("serve", "--config", str(open_config), "--check")
    assert proc.returncode == 0, proc.stderr
    assert "security: public port on 0.0.0.0: plaintext, no authentication" in proc.stderr
    assert "warning: the public port binds 0.0.0.0 (not loopback) without TLS or tokens" in (
        proc.stderr
    )
    doc["security"] = {
        "tls": {
            "cert_file": str(secrets / "frontend.crt"),
            "key_file": str(secrets / "frontend.key"),
        },
        "tokens_file": str(secrets / "tokens.yaml"),
        "rate_limit": {"requests_per_s": 100},
    }
    secured = tmp_path / "secured.yaml"
    secured.write_text(yaml.safe_dump(doc))
    proc = hopserve("serve", "--config", str(secured), "--check")
    assert proc.returncode == 0, proc.stderr
    assert "public port on 0.0.0.0: TLS, tokens from" in proc.stderr
    assert "rate limit 100/s per client" in proc.stderr and "warning" not in proc.stderr
    doc["security"]["tls"]["key_file"] = str(tmp_path / "missing.key")
    secured.write_text(yaml.safe_dump(doc))
    proc = hopserve("serve", "--config", str(secured), "--check")
    assert (
        proc.returncode == 2
        and "security.tls.key_file" in proc.stderr
        and "missing.key" in (proc.stderr)
    )


def test_init_failing_half_way_leaves_nothing(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A write that fails after some files leaves neither the folder nor a temporary one."""
    from hopserve.cli import security as cli_security

    written = []

    def chmod(path, mode) -> None:  # noqa: ANN001
        written.append(path)
        if len(written) == 3:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_security.os, "chmod", chmod)
    files = {f"f{i}.key": b"secret" for i in range(5)}
    with pytest.raises(OSError, match="No space"):
        cli_security._write_folder(tmp_path / "secrets", files, force=False)
    assert list(tmp_path.iterdir()) == []
