"""The public port secured: real TLS (certificates made with ``cryptography``), real
tokens, real channels; rotation without restart; rate limits the SDK backs off from; no
token in any log line, metric or error message."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.e2e import expected
from support.logs import Records, capture_records
from support.pki import ADMIN_TOKEN, READ_TOKEN, Pki, write_pki, write_tokens
from support.processes import run_hopserve

from hopserve.client import (
    AsyncEmbeddingClient,
    EmbeddingClient,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from hopserve.config.security import SecurityConfig
from hopserve.security.tokens import hash_token

MODEL = "sage"
ATOL, RTOL = 1e-5, 1e-4


class Secured:
    """A TLS + token front-end and what it was started with."""

    def __init__(self, server, pki: Pki, tokens: Path, records: Records) -> None:  # noqa: ANN001
        self.server, self.pki, self.tokens, self.records = server, pki, tokens, records
        self.target = f"localhost:{server.service.port}"
        self.errors: list[str] = []  # every client-side error message seen

    def client(self, **kw) -> EmbeddingClient:  # noqa: ANN003
        options = {"timeout": 20.0, "root_certificates": self.pki.ca} | kw
        return EmbeddingClient(self.target, **options)

    def refused(self, reason: str) -> float:
        return self.server.sample("hopserve_refused_requests_total", reason=reason)


@pytest.fixture(scope="module")
def secured(make_config, launch, tmp_path_factory) -> Iterator[Secured]:  # noqa: ANN001
    folder = tmp_path_factory.mktemp("secrets")
    pki = write_pki(folder)
    tokens = write_tokens(folder / "tokens.yaml")
    security = SecurityConfig.model_validate(
        {"tls": {"cert_file": pki.server_cert, "key_file": pki.server_key},
         "tokens_file": tokens}
    )  # fmt: skip
    config = make_config(cache={"backend": "memory"}).model_copy(update={"security": security})
    logging.getLogger("hopserve").setLevel(logging.DEBUG)
    with capture_records() as records:
        server = launch(config)
        try:
            yield Secured(server, pki, tokens, records)
        finally:
            server.stop()
    logging.getLogger("hopserve").setLevel(logging.NOTSET)


def test_tls_and_token_give_exact_rows(secured: Secured, evaluator, all_ids) -> None:  # noqa: ANN001
    ids = all_ids[[3, 150, 3, 299]]
    with secured.client(token=READ_TOKEN) as client:
        got = client.get_embeddings(MODEL, ids)
        streamed = np.concatenate([rows for _, rows in client.stream_embeddings(MODEL, ids)])
        assert [m.name for m in client.list_models()] == [MODEL]
    want = expected(evaluator, ids)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(streamed, want, atol=ATOL, rtol=RTOL)


def test_async_client_takes_the_same_options(secured: Secured, evaluator, all_ids) -> None:  # noqa: ANN001
    ids = all_ids[[9, 8, 9]]

    async def go() -> tuple[np.ndarray, np.ndarray]:
        options = {"root_certificates": secured.pki.ca, "timeout": 20}
        async with AsyncEmbeddingClient(secured.target, token=READ_TOKEN, **options) as client:
            rows = await client.get_embeddings(MODEL, ids)
            pieces = [r async for _, r in client.stream_embeddings(MODEL, ids)]
        async with AsyncEmbeddingClient(secured.target, token=ADMIN_TOKEN, **options) as admin:
            with pytest.raises(PermissionDeniedError) as info:
                await admin.get_embeddings(MODEL, ids)
            secured.errors.append(str(info.value))
        return rows, np.concatenate(pieces)

    rows, streamed = asyncio.run(go())
    np.testing.assert_allclose(rows, expected(evaluator, ids), atol=ATOL, rtol=RTOL)
    np.testing.assert_array_equal(rows, streamed)


def test_plaintext_and_untrusted_clients_fail_cleanly(secured: Secured, tmp_path: Path) -> None:
    plain = EmbeddingClient(secured.target, timeout=5, max_retries=0, token=READ_TOKEN)
    other = write_pki(tmp_path, "other-")
    untrusted = secured.client(root_certificates=other.ca, max_retries=0, token=READ_TOKEN)
    for client in (plain, untrusted):
        with client, pytest.raises(UnavailableError) as info:
            client.get_embeddings(MODEL, [10_000])
        secured.errors.append(str(info.value))


def test_no_token_wrong_token_wrong_scope(secured: Secured, all_ids) -> None:  # noqa: ANN001
    before = {r: secured.refused(r) for r in ("unauthenticated", "permission_denied")}
    cases = [
        (None, UnauthenticatedError, "needs a token with scope 'embeddings:read'"),
        (READ_TOKEN[::-1], UnauthenticatedError, "not valid"),
        (ADMIN_TOKEN, PermissionDeniedError, "needs scope 'embeddings:read'; client 'ops'"),
    ]
    for token, error, text in cases:
        with secured.client(token=token) as client:
            for call in (lambda c: c.get_embeddings(MODEL, all_ids[:2]),
                         lambda c: list(c.stream_embeddings(MODEL, all_ids[:2])),
                         lambda c: c.get_model(MODEL)):  # fmt: skip
                with pytest.raises(error, match=text) as info:
                    call(client)
                secured.errors.append(str(info.value))
    assert secured.refused("unauthenticated") == before["unauthenticated"] + 6
    assert secured.refused("permission_denied") == before["permission_denied"] + 3


def test_health_and_reflection_stay_open(secured: Secured) -> None:
    with secured.client() as client:  # TLS, no token
        assert client.health() and client.health(MODEL)
    credentials = grpc.ssl_channel_credentials(secured.pki.ca.read_bytes())
    with grpc.secure_channel(secured.target, credentials) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        names = {s.name for a in answers for s in a.list_services_response.service}
    assert "hopserve.v1.EmbeddingService" in names


def test_token_rotation_without_restart(secured: Secured, all_ids) -> None:  # noqa: ANN001
    new = "hs_rotated_in_token_0123456789"
    write_tokens(secured.tokens, extra=f"  - {{name: new, scopes: [embeddings:read], "
                                       f"sha256: {hash_token(new)}}}\n")  # fmt: skip
    _later(secured.tokens)
    secured.server.service.reload_credentials()  # what SIGHUP does
    with secured.client(token=new) as client:
        assert client.get_embeddings(MODEL, all_ids[:3]).shape == (3, 5)
    # revoke the reader: picked up by the change check alone (no signal)
    secured.tokens.write_text(
        f"tokens:\n  - {{name: new, scopes: [embeddings:read], sha256: {hash_token(new)}}}\n"
    )
    _later(secured.tokens, seconds=2)
    with secured.client(token=READ_TOKEN, timeout=10) as client:
        _wait_for(lambda: _fails(client, all_ids, UnauthenticatedError))
    write_tokens(secured.tokens)  # back as it was, for the other tests
    _later(secured.tokens, seconds=3)
    secured.server.service.reload_credentials()


def test_certificate_rotation_without_restart(secured: Secured, tmp_path: Path, all_ids) -> None:  # noqa: ANN001
    old, new = secured.pki, write_pki(tmp_path, "new-")
    try:
        _swap(new.server_key, old.server_key)
        _swap(new.server_cert, old.server_cert)
        # new connections get the new certificate: trusted by the new CA only
        with secured.client(root_certificates=new.ca, token=READ_TOKEN) as client:
            assert client.get_embeddings(MODEL, all_ids[:2]).shape == (2, 5)
        old_ca_only = secured.client(max_retries=0, token=READ_TOKEN, timeout=5)
        with old_ca_only as client, pytest.raises(UnavailableError):
            client.get_embeddings(MODEL, all_ids[:2])
    finally:
        restored = write_pki(tmp_path / "restore")
        _swap(restored.server_key, old.server_key)
        _swap(restored.server_cert, old.server_cert)
        _swap(restored.ca, old.ca)
    with secured.client(token=READ_TOKEN) as client:
        assert client.get_embeddings(MODEL, all_ids[:2]).shape == (2, 5)


def test_query_cli_with_root_certs_and_token_file(
    secured: Secured, tmp_path: Path, all_ids
) -> None:  # noqa: ANN001
    token_file = tmp_path / "reader.token"
    token_file.write_text(READ_TOKEN + "\n")
    ids = ",".join(str(i) for i in all_ids[:3])
    base = ("query", "-t", secured.target, "-m", MODEL, "-n", ids, "--timeout", "10")
    ok = run_hopserve(*base, "--root-certs", str(secured.pki.ca), "--token-file", str(token_file))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_nodes"] == 3
    denied = run_hopserve(*base, "--root-certs", str(secured.pki.ca))
    assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr
    secured.errors.append(denied.stderr)


def test_a_non_loopback_bind_without_security_warns(make_config, start_server) -> None:  # noqa: ANN001
    with capture_records() as records:
        start_server(make_config(cache={"backend": "none"}, host="0.0.0.0"))
    warnings = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
    assert any("binds 0.0.0.0 (not loopback) without TLS or tokens" in w for w in warnings)


def test_tokens_never_leak(secured: Secured) -> None:
    """Runs last in the module: every log record, the metrics and every error seen."""
    port = secured.server.service.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    logs = "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in secured.records.records
    )
    assert secured.errors and len(secured.records.records) > 10
    for token in (READ_TOKEN, ADMIN_TOKEN, READ_TOKEN[::-1], "hs_rotated_in_token_0123456789"):
        for where, text in (("logs", logs), ("metrics", metrics),
                            ("errors", "\n".join(secured.errors))):  # fmt: skip
            assert token not in text, where
            assert token[4:20] not in text, where


# -- rate limits ------------------------------------------------------------------------


def test_rate_limit_and_the_sdk_backs_off(make_config, start_server, evaluator, all_ids) -> None:  # noqa: ANN001
    security = SecurityConfig.model_validate({"rate_limit": {"requests_per_s": 2, "burst": 2}})
    server = start_server(
        make_config(cache={"backend": "memory"}).model_copy(update={"security": security})
    )
    ids = all_ids[[1, 2, 3]]
    limited = pytest.raises(ResourceExhaustedError, match=r"rate limit of peer .* retry in")
    with server.client(max_retries=0) as impatient, limited:
        for _ in range(20):  # refused unless each call took over 0.5 s
            impatient.get_embeddings(MODEL, ids)
    # backoff_max below the hint: only the server's retry-after-ms can make this succeed
    with server.client(max_retries=12, backoff_base=0.001, backoff_max=0.002) as client:
        for _ in range(6):
            np.testing.assert_allclose(
                client.get_embeddings(MODEL, ids), expected(evaluator, ids), atol=ATOL, rtol=RTOL
            )
    assert server.sample("hopserve_refused_requests_total", reason="rate_limited") >= 3


# -- helpers ----------------------------------------------------------------------------


def _later(path: Path, seconds: float = 1) -> None:
    """Move a rewritten file's mtime forward so the change check cannot miss it."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + int(seconds * 1e9)))


def _swap(src: Path, dst: Path) -> None:
    """Replace ``dst`` atomically with a copy of ``src`` (as a secret update does)."""
    tmp = dst.with_suffix(".tmp")
    tmp.write_bytes(src.read_bytes())
    os.replace(tmp, dst)
    _later(dst)


def _fails(client: EmbeddingClient, ids: np.ndarray, error: type[Exception]) -> bool:
    try:
        client.get_embeddings(MODEL, ids[:1])
    except error:
        return True
    return False


def _wait_for(condition, timeout: float = 10.0) -> None:  # noqa: ANN001
    import time

    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.2)


def test_graph_updates_need_the_admin_scope(secured: Secured) -> None:
    """UpdateGraph on the public port: a reader is refused; an admin reaches the service
    (here with a batch it refuses, so the module's shared graph is not changed)."""
    from hopserve.client import AdminClient, InvalidArgumentError

    options = {"timeout": 20.0, "root_certificates": secured.pki.ca}
    with (
        AdminClient(secured.target, token=READ_TOKEN, **options) as reader,
        pytest.raises(PermissionDeniedError, match="needs scope 'admin'"),
    ):
        reader.update_graph(MODEL, add_edges=([1], [2]))
    with (
        AdminClient(secured.target, token=ADMIN_TOKEN, **options) as admin,
        pytest.raises(InvalidArgumentError, match="node ID 1 is not in the graph"),
    ):
        admin.update_graph(MODEL, add_edges=([1], [2]))
