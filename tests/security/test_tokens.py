"""Token files: parsing, constant-time lookup by hash, reload on change, link tokens."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support.pki import ADMIN_TOKEN, READ_TOKEN, write_tokens

from hopserve.security import tokens as tokens_mod
from hopserve.security.tokens import (
    READ,
    WORKER,
    Identity,
    TokenError,
    TokenFile,
    TokenStore,
    hash_token,
    new_token,
)


@pytest.fixture(autouse=True)
def instant_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens_mod, "RELOAD_CHECK_S", 0.0)


def _touch_later(path: Path) -> None:
    """Make sure a rewrite is seen as a change even on coarse file-system clocks."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_tokens_authenticate_by_hash_and_plain(tmp_path: Path) -> None:
    store = TokenStore(path=write_tokens(tmp_path / "t.yaml"))
    reader = store.authenticate(READ_TOKEN)
    assert reader == Identity("reader", frozenset({READ}))
    assert store.authenticate(ADMIN_TOKEN).name == "ops"
    assert store.authenticate(READ_TOKEN + "x") is None
    assert store.authenticate("") is None
    assert store.names == ["reader", "ops"]


def test_new_tokens_are_random_and_hash_as_documented() -> None:
    a, b = new_token(), new_token()
    assert a != b and len(a) > 40
    assert len(hash_token(a)) == 64


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tokens: 3", "'tokens' list"),
        ("tokens:\n  - {name: a, scopes: [embeddings:read]}", "exactly one of"),
        ("tokens:\n  - {name: a, scopes: [root], token: abcdefghijklmnopq}", "scopes"),
        ("tokens:\n  - {name: a, scopes: [admin], token: short}", ">= 16"),
        ("tokens:\n  - {name: a, scopes: [admin], sha256: zz}", "64 hex"),
        ("tokens:\n  - {name: a, scopes: [admin], token: abcdefghijklmnopq, x: 1}", "unknown"),
        ("tokens:\n  - {name: a, scopes: [admin], token: abcdefghijklmnopq}\n"
         "  - {name: a, scopes: [admin], token: abcdefghijklmnopr}", "duplicate"),
        ("tokens: [", "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_token_files_name_file_and_entry(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TokenError, match=needle) as info:
        TokenStore(path=path)
    assert str(path) in str(info.value)
    assert "abcdefghijklmnop" not in str(info.value)  # never echo a token


def test_missing_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TokenError, match="nope.yaml"):
        TokenStore(path=tmp_path / "nope.yaml")
    monkeypatch.delenv("HS_TEST_TOKENS", raising=False)
    with pytest.raises(TokenError, match=r"\$HS_TEST_TOKENS"):
        TokenStore(env="HS_TEST_TOKENS")
    monkeypatch.setenv("HS_TEST_TOKENS", write_tokens(tmp_path / "t.yaml").read_text())
    assert TokenStore(env="HS_TEST_TOKENS").authenticate(READ_TOKEN).name == "reader"


def test_changed_file_is_reloaded_broken_file_keeps_old(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.yaml")
    store = TokenStore(path=path)
    new = "hs_new_client_token_0123456789"
    write_tokens(path, extra=f"  - {{name: new, scopes: [embeddings:read], token: {new}}}\n")
    _touch_later(path)
    assert store.authenticate(new).name == "new"
    path.write_text("tokens: [")  # a half-written rotation
    _touch_later(path)
    assert store.authenticate(new).name == "new"  # kept
    path.write_text("tokens: []\n")  # everything revoked
    _touch_later(path)
    assert store.authenticate(READ_TOKEN) is None


def test_reload_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens_mod, "RELOAD_CHECK_S", 3600.0)
    path = write_tokens(tmp_path / "t.yaml")
    store = TokenStore(path=path)
    path.write_text("tokens: []\n")
    _touch_later(path)
    assert store.authenticate(READ_TOKEN) is not None  # not checked yet
    store.reload()  # SIGHUP
    assert store.authenticate(READ_TOKEN) is None


def test_link_token_file_single_identity(tmp_path: Path) -> None:
    path = tmp_path / "link.token"
    path.write_text("hs_link_one_0123456789abcdef\n")
    front_end = Identity("front-end", frozenset({WORKER}))
    store = TokenStore(path=path, single=front_end)
    client = TokenFile(path)
    assert store.authenticate(client.token) == front_end
    path.write_text("hs_link_two_0123456789abcdef\n")
    _touch_later(path)
    time.sleep(0.01)
    assert client.token == "hs_link_two_0123456789abcdef"
    assert store.authenticate("hs_link_one_0123456789abcdef") is None
    assert store.authenticate(client.token) == front_end
    path.write_text("two words here\n")
    with pytest.raises(TokenError, match="one printable token"):
        TokenFile(path)
