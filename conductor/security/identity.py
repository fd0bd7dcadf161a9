"""Who is on the other end: an :class:`Identity` (role and name) read from a peer's certificate.

A Millrace process or app is identified by the SAN URI of its certificate,
``millrace://<role>/<name>`` (``millrace://worker/n1``, ``millrace://app/billing``).
The role says what the identity may do by default (see :mod:`conductor.security.acl`);
the name is what ACLs and group znodes name (a worker's name is its node id).

The same identity is read from three places, so every link checks it the same way:

* a gRPC server call: :func:`from_grpc_context` (gRPC puts the verified peer
  certificate in ``context.auth_context()["x509_pem_cert"]``),
* an ``ssl`` connection (the worker-to-worker asyncio links): :func:`from_ssl_object`
  reads the DER form and parses it with the same code as gRPC's PEM, so both links
  accept exactly the same certificates; :func:`from_peercert` reads the dict form
  (``get_extra_info("peercert")``) for a caller that already has it,
* a certificate file or PEM bytes: :func:`from_pem`.

Only *verified* certificates reach these functions: TLS has already checked the
chain against our CA and the validity dates. What is left to check here is that the
certificate says who it is in a form we own, and the errors say how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509

SCHEME = "millrace"
#: worker and conductor are processes of the cluster; admin is an operator; app is everything else
ROLES = ("worker", "conductor", "admin", "app")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ISSUE_HINT = "conductor certs issue --role ROLE --name NAME CA_DIR"


class IdentityError(Exception):
    """The peer's certificate does not say who it is in a way Millrace accepts; the message says what to do."""


class MissingCertificate(IdentityError):
    def __init__(self, where: str) -> None:
        super().__init__(f"no client certificate on {where}: connect with TLS and a certificate from the "
                         f"cluster's CA (`{_ISSUE_HINT}`), or with a bearer token for an app")


class MissingSan(IdentityError):
    def __init__(self, subject: str) -> None:
        super().__init__(f"missing SAN: the certificate {subject!r} has no {SCHEME}:// URI; issue it with "
                         f"`{_ISSUE_HINT}` (or add the SAN URI {SCHEME}://<role>/<name> in your own CA)")


class BadIdentity(IdentityError):
    pass


@dataclass(frozen=True, order=True)
class Identity:
    """A role and a name; ``str()`` is ``role/name``, :attr:`uri` the SAN URI."""

    role: str
    name: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise BadIdentity(f"unknown role {self.role!r} in identity {self.role}/{self.name}; "
                              f"roles are {', '.join(ROLES)}")
        if not _NAME.match(self.name):
            raise BadIdentity(f"bad name {self.name!r} for a {self.role}: use letters, digits, '.', '_' and "
                              "'-' (at most 128, starting with a letter or digit)")

    @property
    def uri(self) -> str:
        return f"{SCHEME}://{self.role}/{self.name}"

    def __str__(self) -> str:
        return f"{self.role}/{self.name}"


def parse(text: str) -> Identity:
    """``millrace://role/name`` or ``role/name`` (what the CLI and the ACL znode write)."""
    body = text[len(SCHEME) + 3:] if text.startswith(f"{SCHEME}://") else text
    role, sep, name = body.partition("/")
    if not sep:
        raise BadIdentity(f"cannot read an identity from {text!r}: write ROLE/NAME (e.g. app/billing) or "
                          f"{SCHEME}://ROLE/NAME")
    return Identity(role, name)


def from_certificate(cert: x509.Certificate) -> Identity:
    """The one ``millrace://`` SAN URI of ``cert``; refuse none or several (an ambiguous certificate)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier)
                if u.startswith(f"{SCHEME}://")]
    except x509.ExtensionNotFound:
        uris = []
    if not uris:
        raise MissingSan(cert.subject.rfc4514_string())
    if len(uris) > 1:
        raise BadIdentity(f"the certificate {cert.subject.rfc4514_string()!r} names several identities "
                          f"({', '.join(uris)}); issue one certificate per identity")
    return parse(uris[0])


def from_pem(pem: bytes) -> Identity:
    return from_certificate(x509.load_pem_x509_certificate(pem))


def from_der(der: bytes) -> Identity:
    return from_certificate(x509.load_der_x509_certificate(der))


class _AuthContext(Protocol):
    def auth_context(self) -> Mapping[str, Iterable[bytes]]: ...


def from_grpc_context(context: _AuthContext) -> Identity:
    """The caller of a gRPC server method (sync or ``grpc.aio``), from the certificate TLS verified.

    gRPC's auth context also carries ``x509_subject_alternative_name`` and ``peer_uri``
    (every SAN, flattened); parsing ``x509_pem_cert`` instead applies the same rule as
    the ``ssl`` links (exactly one ``millrace://`` URI) and gives the same errors.
    """
    auth = context.auth_context()
    pems = list(auth.get("x509_pem_cert", ()))
    if not pems:
        raise MissingCertificate("this gRPC call")
    return from_pem(pems[0])


class _SslObject(Protocol):
    def getpeercert(self, binary_form: bool = ...) -> Any: ...


def from_ssl_object(ssl_object: _SslObject | None) -> Identity:
    """The peer of an ``ssl`` connection: ``transport.get_extra_info("ssl_object")`` on asyncio."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        raise MissingCertificate("this TLS link")
    return from_der(der)


def from_peercert(peercert: Mapping[str, Any] | None) -> Identity:
    """The peer from ``getpeercert()``'s dict (``get_extra_info("peercert")``): its ``URI`` SAN entries."""
    if not peercert:
        raise MissingCertificate("this TLS link")
    uris = [v for kind, v in peercert.get("subjectAltName", ()) if kind == "URI" and v.startswith(f"{SCHEME}://")]
    subject = ", ".join(f"{k}={v}" for rdn in peercert.get("subject", ()) for k, v in rdn)
    if not uris:
        raise MissingSan(subject)
    if len(uris) > 1:
        raise BadIdentity(f"the certificate {subject!r} names several identities ({', '.join(uris)}); "
                          "issue one certificate per identity")
    return parse(uris[0])
