"""Security: who is on the other end of a link, and what it may do.

One role per file: ``certs`` makes a CA and certificates (development and tests);
``identity`` reads an :class:`Identity` (role and name) from a verified certificate;
``tls`` turns PEM files into gRPC credentials and ``ssl`` contexts that follow the
files when they are rotated; ``tokens`` are bearer tokens for apps without a
certificate (only their hash is stored); ``acl`` is the pure permission model.

This package imports nothing of the project's other layers (only grpc, ssl and
cryptography), so the metastore, the wire, the client and the worker can all use it.
See docs/security.md.
"""

from conductor.security.acl import Acls, Denied, allowed, require
from conductor.security.identity import Identity, IdentityError
from conductor.security.tls import LinkContexts, PeerRefused, TlsError, TlsFiles, TlsSource
from conductor.security.tokens import TokenRecord, TokenRefused

__all__ = [
    "Acls",
    "Denied",
    "Identity",
    "IdentityError",
    "LinkContexts",
    "PeerRefused",
    "TlsError",
    "TlsFiles",
    "TlsSource",
    "TokenRecord",
    "TokenRefused",
    "allowed",
    "require",
]
