"""Bearer tokens for apps that cannot hold a certificate (a notebook, a serverless function).

A token is ``mrt.<id>.<secret>``: ``<id>`` (64 random bits, hex) names the token so
the verifier finds its record without trying every hash, and ``<secret>`` is 256
random bits from :mod:`secrets`. Only a :class:`TokenRecord` is stored (in ZooKeeper,
by :mod:`conductor.metastore.acls`): the id, the identity it authenticates and the
SHA-256 of the whole token. The token itself is shown once, when it is made.

Why a plain SHA-256 and not scrypt or bcrypt: slow hashes exist to make guessing a
*low-entropy* secret (a password) expensive. A 256-bit random secret cannot be
guessed at any hash speed, so a slow hash would add nothing but its cost, and the
worker verifies a token on every request that carries one. The stored hash still
means that reading ZooKeeper gives no usable token.

Verification compares digests with :func:`hmac.compare_digest`, in constant time,
so the time a refusal takes does not tell how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from conductor.security.identity import Identity, parse

PREFIX = "mrt"
#: the gRPC metadata key a token travels in (``grpc.access_token_call_credentials`` sends it)
AUTHORIZATION = "authorization"
_SECRET_BYTES = 32  # 256 bits


class TokenRefused(Exception):
    """The token is malformed, unknown or revoked; the message never repeats the token."""


@dataclass(frozen=True)
class TokenRecord:
    """What is stored for one token: never the token, only its hash."""

    token_id: str
    identity: Identity
    sha256: str
    created: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return json.dumps({"id": self.token_id, "identity": str(self.identity), "sha256": self.sha256,
                           "created": self.created}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TokenRecord:
        d = json.loads(raw)
        return cls(d["id"], parse(d["identity"]), d["sha256"], float(d["created"]))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def generate(identity: Identity) -> tuple[str, TokenRecord]:
    """A new token for ``identity`` and the record to store; show the token once, store only the record."""
    token_id = secrets.token_hex(8)
    token = f"{PREFIX}.{token_id}.{secrets.token_urlsafe(_SECRET_BYTES)}"
    return token, TokenRecord(token_id, identity, _digest(token))


def token_id(token: str) -> str:
    """The id part of a presented token (to look its record up); TokenRefused if it is not a token."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
        raise TokenRefused(f"not a Millrace token (expected {PREFIX}.<id>.<secret>); make one with "
                           "`conductor token create --name APP`")
    return parts[1]


def presented_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer token of a gRPC call's ``invocation_metadata()`` (``authorization: Bearer <token>``), if any."""
    for key, value in metadata or ():
        if key.lower() == AUTHORIZATION:
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def verify(token: str, record: TokenRecord | None) -> Identity:
    """The identity ``token`` authenticates, given the record stored under its id (``None``: unknown)."""
    tid = token_id(token)
    # Hash even when the record is missing, so an unknown id costs the same time as a wrong secret.
    presented = _digest(token)
    expected = record.sha256 if record is not None and record.token_id == tid else "0" * 64
    if not hmac.compare_digest(presented, expected) or record is None:
        raise TokenRefused(f"token {tid} is unknown or revoked; ask an admin for a new one "
                           "(`conductor token create --name APP`)")
    return record.identity
