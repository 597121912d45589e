"""The files the deploy manifests mount, as ``hopserve security init`` writes them.

Runs the ``init`` command documented in docker-compose.yml into a temporary folder and
checks what the containers would see: the front-end's files pass ``serve --check``'s file
checks and take the reader token, the public certificate verifies against ``ca.crt`` for
``localhost``, the worker's compose health check passes over mutual TLS, and so does the
front-end's link channel, whose token the worker's gate accepts. The mount model is
``secret_mounts.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from secret_mounts import (
    NEVER_MOUNTED,
    PEER,
    READ_METHOD,
    RUN_JOB,
    SECRET_PATTERNS,
    SECRETS_DIR,
    compose_config,
    compose_header,
    compose_secret_files,
    compose_servers,
    documented_init,
    with_files,
)
from test_manifests import compose
from typer.testing import CliRunner

from hopserve.cli import app
from hopserve.worker.service import SERVICE_NAME as WORKER_SERVICE


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output of the ``hopserve security init`` command in the compose header."""
    (argv,) = documented_init(compose_header(), "#")
    assert argv[3] == "secrets"
    out = tmp_path_factory.mktemp("deploy") / "secrets"
    result = CliRunner().invoke(app, [*argv[1:3], str(out), *argv[4:]])
    assert result.exit_code == 0, result.output
    return out


def compose_view(init_dir: Path, service: str) -> dict[str, Path]:
    """Container path → host file of the service's secrets, from ``init_dir``."""
    files = compose_secret_files(compose()["services"][service])
    return {path: init_dir / file.removeprefix(SECRETS_DIR) for path, file in files.items()}


@contextmanager
def health_server(credentials: grpc.ServerCredentials, service: str) -> Iterator[int]:
    """A gRPC health server on loopback behind ``credentials``; yields its port."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait(5)


def health_status(channel: grpc.Channel, service: str) -> int:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_init_writes_what_compose_mounts(init_dir: Path) -> None:
    written = {p.name for p in init_dir.iterdir()}
    mounted = {f.removeprefix(SECRETS_DIR) for f in
               (s["file"] for s in compose()["secrets"].values())}  # fmt: skip
    assert mounted | NEVER_MOUNTED <= written
    for name in sorted(written - {"ca.crt", "frontend.crt", "worker.crt", "frontend-link.crt"}):
        text = (init_dir / name).read_text()  # the scanner above would catch each secret
        assert any(p.search(text) for p in SECRET_PATTERNS.values()), name


def test_frontend_files_work(init_dir: Path) -> None:
    """The front-end's view passes ``serve --check``'s file checks, takes the reader
    token, and its public certificate verifies against ``ca.crt`` for ``localhost``
    (README: ``hopserve query --target localhost:50051 --root-certs secrets/ca.crt``)."""
    from hopserve.security.factory import check_files, public_credentials, public_gate

    role, params = compose_servers()["hopserve"]
    config = compose_config(compose()["services"]["hopserve"], params)
    security = with_files(config.security, compose_view(init_dir, "hopserve"))
    check_files(security)
    gate = public_gate(security)
    reader = (init_dir / "reader.token").read_text().strip()
    assert gate.check(READ_METHOD, [("authorization", f"Bearer {reader}")], PEER) is None
    assert gate.check(READ_METHOD, [], PEER) is not None
    with health_server(public_credentials(security), "") as port:
        result = CliRunner().invoke(app, ["health", "--target", f"localhost:{port}",
                                          "--root-certs", str(init_dir / "ca.crt")])  # fmt: skip
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize("worker", ["hopserve-worker-gpu", "hopserve-worker-cpu"])
def test_worker_link_works(init_dir: Path, worker: str) -> None:
    """Over mutual TLS: the worker's compose health check passes, so does the front-end's
    link channel (certificate named ``security.link.server_name``), and the worker's gate
    takes the front-end's link token; a client without a certificate gets nowhere."""
    from grpc_health.v1 import health_pb2

    from hopserve.security.factory import link_channel, worker_credentials, worker_gate
    from hopserve.security.tls import channel_credentials

    services = compose()["services"]
    _, front_params = compose_servers()["hopserve"]
    config = compose_config(services["hopserve"], front_params)
    front = with_files(config.security, compose_view(init_dir, "hopserve")).link
    own = with_files(config.security.model_copy(update={"tls": None, "tokens_file": None}),
                     compose_view(init_dir, worker)).link  # fmt: skip
    service = services[worker]
    _, params = compose_servers()[worker]
    with health_server(worker_credentials(own), WORKER_SERVICE) as port:
        argv = service["healthcheck"]["test"][1:]
        argv = [a.replace(f"127.0.0.1:{params['port']}", f"127.0.0.1:{port}") for a in argv]
        argv = [str(compose_view(init_dir, worker).get(a, a)) for a in argv]
        result = CliRunner().invoke(app, argv[1:])
        assert result.exit_code == 0, result.output
        link = link_channel(front)
        channel = grpc.secure_channel(f"127.0.0.1:{port}", link.credentials.current(),
                                      link.options)  # fmt: skip
        assert health_status(channel, WORKER_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        bare = grpc.secure_channel(f"127.0.0.1:{port}", channel_credentials(own.ca_file),
                                   (("grpc.ssl_target_name_override", "hopserve-worker"),))  # fmt: skip
        with pytest.raises(grpc.RpcError):
            health_status(bare, WORKER_SERVICE)
    gate = worker_gate(own)
    assert gate.check(RUN_JOB, link.metadata(), PEER) is None
    assert gate.check(RUN_JOB, [("authorization", "Bearer hs_not_the_link_token")], PEER)
