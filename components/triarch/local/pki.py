"""The local control plane's certificates: a cluster CA, the API server's serving certificate, an admin client
certificate in `system:masters`, the service-account signing key, and the front-proxy CA and client the API server
presents to aggregated APIs (an operator's metrics API). Operators get certificates from the same CA on demand.
Written once per plane, never committed."""

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
FRONT_PROXY_CLIENT = "front-proxy-client"
"""The name the API server's front-proxy client certificate carries (--requestheader-allowed-names)."""


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Paths of everything the plane's components read."""

    directory: Path

    def _pair(self, name: str) -> Pair:
        return Pair(self.directory / f"{name}.crt", self.directory / f"{name}.key")

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def serving(self) -> Pair:
        return self._pair("apiserver")

    @property
    def admin(self) -> Pair:
        return self._pair("admin")

    @property
    def front_proxy_ca(self) -> Path:
        return self.directory / "front-proxy-ca.crt"

    @property
    def front_proxy_client(self) -> Pair:
        return self._pair(FRONT_PROXY_CLIENT)

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    return x509.Name([*parts, x509.NameAttribute(NameOID.COMMON_NAME, common)])


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


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write(cert_path: Path, cert: x509.Certificate, key_path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)


def _load(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def _names(dns: tuple[str, ...], ips: tuple[str, ...]) -> list[x509.GeneralName]:
    return [*(x509.DNSName(n) for n in dns), *(x509.IPAddress(ipaddress.ip_address(a)) for a in ips)]


def _new_ca(directory: Path, name: str) -> None:
    key = _key()
    _write(directory / f"{name}.crt", _certificate(_name(name), key, _name(name), key, ca=True, usage=[], names=[]),
           directory / f"{name}.key", key)


def issue(pki: Pki, name: str, *, common: str | None = None, organization: str | None = None,
          dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), server: bool = True, client: bool = False,
          ca: str = "ca") -> Pair:
    """A certificate from one of the plane's CAs, written as <name>.crt/.key in its directory."""
    ca_cert, ca_key = _load(pki.directory / f"{ca}.crt", pki.directory / f"{ca}.key")
    usage = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client
                                                                    else [])
    key = _key()
    cert = _certificate(_name(common or name, organization), key, ca_cert.subject, ca_key, ca=False, usage=usage,
                        names=_names(dns, ips))
    pair = pki._pair(name)
    _write(pair.cert, cert, pair.key, key)
    return pair


def write_pki(directory: Path) -> Pki:
    """Create the plane's CAs, keys and certificates (mode 0600 for keys)."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    _new_ca(directory, "ca")
    _new_ca(directory, "front-proxy-ca")
    issue(pki, "apiserver", common="kube-apiserver", ips=("127.0.0.1", SERVICE_IP),
          dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
               "kubernetes.default.svc.cluster.local"))
    issue(pki, "admin", common="triarch-admin", organization="system:masters", server=False, client=True)
    issue(pki, FRONT_PROXY_CLIENT, server=False, client=True, ca="front-proxy-ca")
    sa_key = _key()
    pki.service_account_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    _write_key(pki.service_account_key, sa_key)
    return pki
