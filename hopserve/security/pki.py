"""A small certificate authority for development, tests and first deployments.

``hopserve security init DIR`` (and the tests) use it to write a CA and the certificates
a deployment needs; production deployments usually bring their own (cert-manager, a
corporate CA), which hopserve reads the same way. Keys are ECDSA P-256; every
certificate carries its names as subject alternative names (DNS or IP), which is what
TLS clients check.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Pem", "issue", "make_ca"]


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes


def make_ca(common_name: str = "hopserve dev CA", *, days: int = 825) -> Pem:
    """A self-signed CA certificate (path length 0: it signs leaves only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(key, hashes.SHA256())
    )
    return Pem(_cert_pem(cert), _key_pem(key))


def issue(
    ca: Pem,
    common_name: str,
    names: Sequence[str] = (),
    *,
    days: int = 365,
) -> Pem:
    """A leaf certificate signed by ``ca`` for servers and clients alike.

    Args:
        ca: the issuing CA (from :func:`make_ca`).
        common_name: subject CN (also the first DNS name unless it is an IP).
        names: further DNS names or IP addresses (``"localhost"``, ``"127.0.0.1"``).
        days: validity.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for value in dict.fromkeys([common_name, *names]):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(value)))
        except ValueError:
            alt.append(x509.DNSName(value))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return Pem(_cert_pem(cert), _key_pem(key))


def _cert_pem(cert) -> bytes:  # noqa: ANN001 - cryptography.x509.Certificate
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:  # noqa: ANN001 - a cryptography private key
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
