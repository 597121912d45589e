"""Security objects from the config: key-naming errors, posture lines, exposure warnings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from support.pki import write_pki, write_tokens

from hopserve.config import ConfigError
from hopserve.config.security import LinkConfig, SecurityConfig
from hopserve.security.factory import (
    check_files,
    exposure_warnings,
    is_loopback,
    link_channel,
    posture,
    public_credentials,
    public_gate,
    worker_gate,
)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
     ("127.0.0.5", True), ("0.0.0.0", False), ("[::]", False), ("10.0.0.3", False),
     ("hopserve.internal", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_ports_warn_only_off_loopback(tmp_path: Path) -> None:
    open_ = SecurityConfig()
    assert exposure_warnings(open_, "127.0.0.1") == []
    (public,) = exposure_warnings(open_, "0.0.0.0")
    assert "without TLS or tokens" in public and "read every embedding" in public
    (worker,) = exposure_warnings(open_, "0.0.0.0", worker=True)
    assert "without mutual TLS or a link token" in worker and "run jobs" in worker
    pki = write_pki(tmp_path)
    closed = SecurityConfig.model_validate({
        "tls": {"cert_file": pki.server_cert, "key_file": pki.server_key},
        "tokens_file": write_tokens(tmp_path / "t.yaml"),
        "link": {"ca_file": pki.ca, "cert_file": pki.server_cert, "key_file": pki.server_key,
                 "token_file": tmp_path / "t.yaml"},
    })  # fmt: skip
    assert exposure_warnings(closed, "0.0.0.0") == []
    assert exposure_warnings(closed, "0.0.0.0", worker=True) == []
    tls_only = closed.model_copy(update={"tokens_file": None})
    assert "without tokens" in exposure_warnings(tls_only, "0.0.0.0")[0]
    assert posture(closed, "0.0.0.0") == (
        f"public port on 0.0.0.0: TLS, tokens from {tmp_path / 't.yaml'}, no rate limit; "
        "to workers: mutual TLS + token"
    )
    assert posture(closed, "0.0.0.0", worker=True) == (
        "worker port on 0.0.0.0: mutual TLS, link token required"
    )


def test_half_a_link_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs all of ca_file, cert_file and key_file"):
        LinkConfig(ca_file=Path("ca.crt"))
    with pytest.raises(ValidationError, match="tokens_file or tokens_env"):
        SecurityConfig(tokens_file=Path("t.yaml"), tokens_env="X")


def test_unusable_files_name_their_key(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    bad_tls = SecurityConfig.model_validate({"tls": {"cert_file": missing, "key_file": missing}})
    with pytest.raises(ConfigError, match=r"security\.tls: TLS key .*missing\.pem"):
        public_credentials(bad_tls)
    (tmp_path / "t.yaml").write_text("tokens: 1\n")
    with pytest.raises(ConfigError, match=r"security\.tokens: .*t\.yaml"):
        public_gate(SecurityConfig(tokens_file=tmp_path / "t.yaml"))
    (tmp_path / "short").write_text("abc\n")
    link = LinkConfig(token_file=tmp_path / "short")
    for build in (link_channel, worker_gate):
        with pytest.raises(ConfigError, match=r"security\.link\.token_file: .*short"):
            build(link)
    with pytest.raises(ConfigError) as info:
        check_files(bad_tls.model_copy(update={"tokens_file": tmp_path / "t.yaml"}))
    text = str(info.value)
    assert "security.tls.cert_file" in text and "security.tls.key_file" in text
    assert "security.tokens" in text


def test_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    from hopserve.config import load_config

    (tmp_path / "hopserve.yaml").write_text(
        "security:\n  tls: {cert_file: tls/a.crt, key_file: tls/a.key}\n"
        "  tokens_file: tokens.yaml\n  link: {token_file: link/token}\n"
    )
    sec = load_config(tmp_path / "hopserve.yaml").security
    assert sec.tls.cert_file == tmp_path / "tls" / "a.crt"
    assert sec.tokens_file == tmp_path / "tokens.yaml"
    assert sec.link.token_file == tmp_path / "link" / "token"
