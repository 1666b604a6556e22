"""The control plane's PKI, made at start: a CA, the API server's serving certificate, the admin
client certificate (O=system:masters) and the service-account signing key pair.

Certificates are short-lived (one day) and never leave the run directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_pub: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usages: tuple[x509.ObjectIdentifier, ...] = (),
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(directory: Path, *, service_ip: str) -> Pki:
    """Write a fresh PKI into `directory`; `service_ip` is the `kubernetes` Service's address."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        *(
            directory / name
            for name in (
                "ca.crt",
                "ca.key",
                "apiserver.crt",
                "apiserver.key",
                "admin.crt",
                "admin.key",
                "sa.key",
                "sa.pub",
            )
        )
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("envtest-ca")
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.serving_key, serving_key)
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(service_ip)),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes.default.svc"),
    ]
    serving = _sign(
        _name("kube-apiserver"),
        serving_key.public_key(),
        ca_name,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        sans=sans,
    )
    _write_cert(pki.serving_cert, serving)

    admin_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.admin_key, admin_key)
    admin = _sign(
        _name("envtest-admin", "system:masters"),
        admin_key.public_key(),
        ca_name,
        ca_key,
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )
    _write_cert(pki.admin_cert, admin)

    # Service-account tokens are signed with RSA (the API server accepts RS256 keys here).
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
