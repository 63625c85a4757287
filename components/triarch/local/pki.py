"""The local control plane's certificates: one CA, the API server's serving certificate, an admin client
certificate in `system:masters`, and the service-account signing key. Written once per plane, never committed."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=365)
SERVICE_IP = "10.96.0.1"
"""The `kubernetes` Service's cluster IP: the first address of the plane's service range (plane.SERVICE_RANGE)."""


@dataclass(frozen=True)
class Pki:
    """Paths of everything the plane's components read."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                 signer: ec.EllipticCurvePrivateKey, *, ca: bool, usage: list[x509.ObjectIdentifier],
                 names: list[x509.GeneralName]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + VALID_FOR)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def write_pki(directory: Path) -> Pki:
    """Create the plane's keys and certificates (mode 0600 for keys)."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "triarch-local-ca")])
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True, usage=[], names=[])
    serving_key = _key()
    serving = _certificate(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]), serving_key, ca_name, ca_key,
        ca=False, usage=[ExtendedKeyUsageOID.SERVER_AUTH],
        names=[x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                         "kubernetes.default.svc.cluster.local")]
        + [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", SERVICE_IP)])
    admin_key = _key()
    admin = _certificate(
        x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                   x509.NameAttribute(NameOID.COMMON_NAME, "triarch-admin")]),
        admin_key, ca_name, ca_key, ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH], names=[])
    sa_key = _key()
    for path, data in ((pki.ca, ca.public_bytes(serialization.Encoding.PEM)),
                       (pki.serving_cert, serving.public_bytes(serialization.Encoding.PEM)),
                       (pki.admin_cert, admin.public_bytes(serialization.Encoding.PEM)),
                       (pki.service_account_pub, sa_key.public_key().public_bytes(
                           serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))):
        path.write_bytes(data)
    for path, key in ((pki.serving_key, serving_key), (pki.admin_key, admin_key), (pki.service_account_key, sa_key)):
        path.write_bytes(_pem_key(key))
        path.chmod(0o600)
    return pki
