"""A certificate authority for development and tests: make a CA, issue per-process and per-app certificates.

Production brings its own CA (any X.509 CA works, as long as each certificate
carries the ``millrace://<role>/<name>`` SAN URI that :mod:`conductor.security.identity`
reads); this module exists so that ``conductor certs init|issue``, ``conductor dev --secure``
and the tests can make real certificates in milliseconds, with the ``cryptography`` package.

Choices and why:

* **EC P-256 keys, ECDSA-SHA256 signatures**: every TLS stack (OpenSSL, BoringSSL
  inside gRPC, Java's for Spark) accepts them, and a handshake costs a fraction of
  RSA-2048's, which matters for a worker that accepts many short connections.
* **Identity in a SAN URI**, not in the common name: the CN is free text that
  many CAs fill with a host name; a URI has a scheme we own, so a certificate
  made for something else never parses as a Millrace identity by accident.
* **DNS and IP SANs for the host**: gRPC clients check the server's name
  against them (worker-to-worker links check the identity instead, see
  :mod:`conductor.security.tls`).
* **Key files are 0600** from their creation (written through ``os.open`` with
  the mode, never chmod-ed afterwards, so there is no window where they are
  readable by others), and every file is replaced atomically (written beside it,
  then renamed), so a process reloading its certificate never reads half a file.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conductor.security.identity import Identity

#: file names inside a certificate directory (``conductor certs init DIR`` / ``issue ... DIR``)
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
DEFAULT_VALIDITY_DAYS = 365
CA_VALIDITY_DAYS = 3650


class CertError(Exception):
    """A certificate could not be made; the message says what to do."""


@dataclass(frozen=True)
class Issued:
    """The PEM files of one issued certificate: give all three to the process (``--tls-dir`` or paths)."""

    cert: Path
    key: Path
    ca: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode`` from the first byte, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a crash may be readable by others: never write a key into it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)  # os.open's mode is filtered by the umask; a cert may be wider, a key never is
    os.replace(tmp, path)


def _window(days: int, not_before: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)  # clock skew
    return start, start + datetime.timedelta(days=days)


def make_ca(name: str = "Millrace dev CA", *, days: int = CA_VALIDITY_DAYS,
            not_before: datetime.datetime | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key (path length 0: it signs leaf certificates only)."""
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Millrace")])
    start, end = _window(days, not_before)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _host_sans(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, identity: Identity | None, *,
          hosts: Sequence[str] = (), days: int = DEFAULT_VALIDITY_DAYS,
          not_before: datetime.datetime | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate for ``identity`` (its SAN URI) and ``hosts`` (DNS or IP SANs), signed by the CA.

    Usable as both a TLS server and a TLS client certificate, since every Millrace
    process is both (a worker serves gRPC and dials its peers). ``identity=None``
    makes a certificate without the Millrace SAN URI (tests use it to check the refusal);
    ``not_before`` in the past with a short ``days`` makes an expired one.
    """
    if days <= 0:
        raise CertError(f"validity must be at least one day, got {days}")
    key = _new_key()
    cn = str(identity) if identity else (hosts[0] if hosts else "no-identity")
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)] if identity else []
    sans += _host_sans(hosts)
    start, end = _window(days, not_before)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_agreement=True,
                                            key_cert_sign=False, crl_sign=False, content_commitment=False,
                                            data_encipherment=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


# ---- files -----------------------------------------------------------------------------------------------


def init_ca_dir(directory: Path, *, name: str = "Millrace dev CA", days: int = CA_VALIDITY_DAYS,
                force: bool = False) -> Path:
    """``conductor certs init DIR``: write ``ca.pem`` and ``ca.key`` (0600); refuse to overwrite a CA."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / CA_KEY).exists() and not force:
        raise CertError(f"{directory / CA_KEY} already exists: every certificate issued from it would stop "
                        "being trusted if it were replaced; pick another directory (or delete it on purpose)")
    cert, key = make_ca(name, days=days)
    write_atomic(directory / CA_KEY, key_pem(key), 0o600)
    write_atomic(directory / CA_CERT, cert_pem(cert), 0o644)
    return directory / CA_CERT


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as e:
        raise CertError(f"no CA in {directory} ({e.filename} is missing); make one with "
                        f"`conductor certs init {directory}`") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{directory / CA_KEY} is not an EC key; `conductor certs` signs with EC P-256 CAs only")
    return cert, key


def issue_to_dir(directory: Path, identity: Identity | None, *, hosts: Sequence[str] = (),
                 days: int = DEFAULT_VALIDITY_DAYS, out: Path | None = None,
                 not_before: datetime.datetime | None = None) -> Issued:
    """``conductor certs issue``: sign with the CA in ``directory``, write ``<role>-<name>.pem/.key`` beside it.

    Writing over an existing pair is how a certificate is rotated: processes
    reading it through :mod:`conductor.security.tls` pick it up on their next handshake.
    """
    ca_cert, ca_key = load_ca(directory)
    cert, key = issue(ca_cert, ca_key, identity, hosts=hosts, days=days, not_before=not_before)
    out = out or directory
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{identity.role}-{identity.name}" if identity else "no-identity"
    # Two renames, so a reader may briefly see a new key with the old certificate: the TLS reloader
    # (conductor.security.tls) keeps its previous material until the pair matches again.
    write_atomic(out / f"{stem}.key", key_pem(key), 0o600)
    write_atomic(out / f"{stem}.pem", cert_pem(cert), 0o644)
    return Issued(cert=out / f"{stem}.pem", key=out / f"{stem}.key", ca=directory / CA_CERT)
