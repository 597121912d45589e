"""Certificate files re-read on change: a rotation caught half-written keeps the old
credentials (server and client side), a complete one is taken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.pki import write_pki

from hopserve.security.tls import ChannelCredentialFiles, TlsError, _Files, read_pem


def _rewrite(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_server_files_half_written_keep_the_old_then_take_the_new(tmp_path: Path) -> None:
    pki, new = write_pki(tmp_path / "a"), write_pki(tmp_path / "b")
    files = _Files(pki.server_cert, pki.server_key, None)
    assert files.fetch() is None  # unchanged
    _rewrite(pki.server_cert, b"half a certif")  # the rotation is caught midway
    assert files.fetch() is None  # kept the old pair
    _rewrite(pki.server_cert, new.server_cert.read_bytes())
    _rewrite(pki.server_key, new.server_key.read_bytes())
    assert files.fetch() is not None  # the new pair
    assert files.fetch() is None


def test_client_files_half_written_keep_the_old(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    files = ChannelCredentialFiles(pki.ca, pki.client_cert, pki.client_key, check_s=0.0)
    first = files.current()
    assert files.current() is first
    _rewrite(pki.client_key, b"")
    assert files.current() is first
    _rewrite(pki.client_key, write_pki(tmp_path / "b").client_key.read_bytes())
    assert files.current() is not first


def test_missing_or_non_pem_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match="nope.crt"):
        read_pem(tmp_path / "nope.crt", "TLS certificate")
    (tmp_path / "x.crt").write_text("not pem")
    with pytest.raises(TlsError, match=r"x\.crt: not a PEM file"):
        read_pem(tmp_path / "x.crt", "TLS certificate")
