"""The per-call decision: open without tokens, UNAUTHENTICATED, PERMISSION_DENIED,
RESOURCE_EXHAUSTED with a retry hint; messages never carry a token."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from support.pki import ADMIN_TOKEN, READ_TOKEN, write_tokens

from hopserve.security.factory import FRONTEND_SCOPES
from hopserve.security.gate import RETRY_AFTER_KEY, Gate
from hopserve.security.ratelimit import RateLimiter
from hopserve.security.tokens import TokenStore

GET = "/hopserve.v1.EmbeddingService/GetEmbeddings"
ADMIN_ONLY = "/hopserve.v1.EmbeddingService/ReloadModel"  # no scope of its own: admin
PEER = "ipv4:127.0.0.1:50000"


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    rejected: list[str] = []
    g = Gate(FRONTEND_SCOPES, tokens=TokenStore(path=write_tokens(tmp_path / "t.yaml")),
             on_reject=rejected.append)  # fmt: skip
    g.rejected = rejected  # type: ignore[attr-defined]
    return g


def test_without_tokens_everything_passes() -> None:
    assert Gate(FRONTEND_SCOPES).check(GET, None, PEER) is None
    assert not Gate(FRONTEND_SCOPES).enabled


def test_decisions(gate: Gate) -> None:
    assert gate.check(GET, bearer(READ_TOKEN), PEER) is None
    assert gate.check(GET, [("authorization", f"bearer   {READ_TOKEN} ")], PEER) is None
    cases = {
        "none": (None, grpc.StatusCode.UNAUTHENTICATED),
        "basic": ([("authorization", "Basic dXNlcjpwYXNz")], grpc.StatusCode.UNAUTHENTICATED),
        "empty": (bearer(""), grpc.StatusCode.UNAUTHENTICATED),
        "wrong": (bearer(READ_TOKEN[:-1] + "X"), grpc.StatusCode.UNAUTHENTICATED),
        "scope": (bearer(ADMIN_TOKEN), grpc.StatusCode.PERMISSION_DENIED),
    }
    for name, (metadata, code) in cases.items():
        denial = gate.check(GET, metadata, PEER)
        assert denial is not None and denial.code == code, name
        assert READ_TOKEN not in denial.message and ADMIN_TOKEN not in denial.message
        assert READ_TOKEN[:-1] not in denial.message
    assert gate.rejected == ["unauthenticated"] * 4 + ["permission_denied"]


def test_methods_without_a_scope_need_admin(gate: Gate) -> None:
    denial = gate.check(ADMIN_ONLY, bearer(READ_TOKEN), PEER)
    assert denial.code == grpc.StatusCode.PERMISSION_DENIED
    assert "'admin'" in denial.message and "'reader'" in denial.message
    assert gate.check(ADMIN_ONLY, bearer(ADMIN_TOKEN), PEER) is None


def test_rate_limit_by_client_or_peer(tmp_path: Path) -> None:
    tokens = TokenStore(path=write_tokens(tmp_path / "t.yaml"))
    gate = Gate(FRONTEND_SCOPES, tokens=tokens, limiter=RateLimiter(0.5, burst=1))
    assert gate.check(GET, bearer(READ_TOKEN), PEER) is None
    denial = gate.check(GET, bearer(READ_TOKEN), "ipv4:10.0.0.9:1")  # same client, new peer
    assert denial.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "'reader'" in denial.message
    ((key, value),) = denial.trailing_metadata
    assert key == RETRY_AFTER_KEY and 1000 < int(value) <= 2000
    open_gate = Gate(FRONTEND_SCOPES, limiter=RateLimiter(0.5, burst=1))
    assert open_gate.check(GET, None, "ipv4:10.0.0.1:1") is None
    assert open_gate.check(GET, None, "ipv4:10.0.0.1:2").reason == "rate_limited"  # per host
    assert open_gate.check(GET, None, "ipv4:10.0.0.2:1") is None
