"""HTTPS for the read-only HTTP endpoints (the conductor's web UI and JSON API, the workers' ``/metrics``): TLS
contexts that follow the PEM files, and who is asking (a client certificate or a bearer token) and what it may see.

Unlike gRPC, Python's ``ssl`` can *ask* for a client certificate without requiring
one (``CERT_OPTIONAL``), so one port serves both: a browser or Prometheus with a
certificate from the cluster's CA is identified by it; one without presents
``Authorization: Bearer <token>`` (a ``conductor token create`` token). Anything
else is refused with 401 before a route runs. What an identity may see is the ACL
permission ``view`` (:mod:`conductor.security.acl`): admins and conductors have it on
every module, an app has it where an admin granted it.

The server context swaps in the current files on every handshake (its SNI callback,
as :class:`~conductor.security.tls.LinkContexts` does), so a rotated certificate is
served without a restart. The scraping side (:meth:`HttpsContexts.client`) verifies
the server against the CA and presents its own certificate; as on the replication
links, the server's identity is checked (``worker/<node>``), not its host name.

This module imports no other layer: the ACLs and tokens come in as functions.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

from conductor.security import identity as ident
from conductor.security.acl import ALL_MODULES, VIEW, Acls, permissions
from conductor.security.identity import Identity, IdentityError
from conductor.security.tls import LinkContexts, TlsSource


class HttpsContexts(LinkContexts):
    """The ``ssl.SSLContext`` pair of an HTTPS endpoint: the server asks for a client certificate but does not
    require one (a token may stand in), the client (a scraper) presents its own."""

    def __init__(self, source: TlsSource) -> None:
        super().__init__(source, client_certificate=ssl.CERT_OPTIONAL)


class NotAuthenticated(Exception):
    """No certificate from the CA and no valid bearer token (HTTP 401); the message says what to present."""


@dataclass(frozen=True)
class ViewGuard:
    """Who an HTTP request comes from, and which modules it may view.

    ``acls`` returns the current ACLs (an ``AclCache``'s, kept by a ZooKeeper watch);
    ``verify_token`` the identity of a bearer token (``TokenCache.verify``), raising
    for an unknown or revoked one.
    """

    acls: Callable[[], Acls]
    verify_token: Callable[[str], Identity]

    def identify(self, peer_der: bytes | None, authorization: str | None) -> Identity:
        """The caller: its verified certificate (``peer_der``), else its bearer token; NotAuthenticated."""
        if peer_der:
            try:
                return ident.from_der(peer_der)
            except IdentityError as e:
                raise NotAuthenticated(str(e)) from None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthenticated("present a client certificate from the cluster's CA (`conductor certs issue "
                                   "--role admin --name NAME CA_DIR`) or `Authorization: Bearer <token>` "
                                   "(`conductor token create --name NAME`), with `view` granted")
        try:
            return self.verify_token(token.strip())
        except Exception as e:  # TokenRefused: its message names the token id, never the secret
            raise NotAuthenticated(str(e)) from None

    def may_view(self, identity: Identity, module: str = ALL_MODULES) -> bool:
        """``view`` on ``module`` (``*``: on every module, what whole-cluster pages and ``/metrics`` need)."""
        return VIEW in permissions(self.acls(), identity, module)

    def may_view_some(self, identity: Identity) -> bool:
        """``view`` on at least one module (the cluster page, which then lists only those)."""
        acls = self.acls()
        return self.may_view(identity) or any(VIEW in p for _m, who, p in acls.rows() if who == identity)


def peer_certificate(sock: object) -> bytes | None:
    """The DER certificate a TLS client presented on ``sock`` (an ``ssl.SSLSocket``); None on plaintext or none."""
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return None
    der = getpeercert(binary_form=True)
    return der or None
