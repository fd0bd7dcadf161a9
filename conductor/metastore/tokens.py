"""``/millrace/security/tokens/<token-id>``: the stored half of apps' bearer tokens (a hash, never a token).

Records never change in place (a rotation is a new token and a revoke of the old),
so a :class:`TokenCache` fed by a ChildrenWatch knows every live record, and a
worker verifies a token without a ZooKeeper round trip; a revoke reaches it when the
watch fires.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kazoo.exceptions import NoNodeError

from conductor.metastore.layout import TOKENS_PATH
from conductor.security.identity import Identity, IdentityError
from conductor.security.tokens import TokenRecord, token_id, verify

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore

log = logging.getLogger("millrace.metastore")


class TokenStore:
    """Store, read and revoke token records."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def put(self, record: TokenRecord) -> None:
        self.ms.call(self.ms.zk.create, f"{TOKENS_PATH}/{record.token_id}", record.to_json(), makepath=True)

    def get(self, tid: str) -> TokenRecord | None:
        try:
            data, _ = self.ms.call(self.ms.zk.get, f"{TOKENS_PATH}/{tid}")
        except NoNodeError:
            return None
        return TokenRecord.from_json(data)

    def revoke(self, tid: str) -> bool:
        """Delete the record: the token stops working on every worker when its watch fires."""
        try:
            self.ms.call(self.ms.zk.delete, f"{TOKENS_PATH}/{tid}")
        except NoNodeError:
            return False
        return True

    def all(self) -> list[TokenRecord]:
        try:
            ids = self.ms.call(self.ms.zk.get_children, TOKENS_PATH)
        except NoNodeError:
            return []
        found = (self.get(t) for t in sorted(ids))
        return [r for r in found if r is not None]


class TokenCache:
    """Every live token record, kept current by a ChildrenWatch on the tokens znode."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store
        self.records: dict[str, TokenRecord] = {}
        self.closed = False
        ms = store.ms
        ms.call(ms.zk.ensure_path, TOKENS_PATH)
        self._reload(ms.call(ms.zk.get_children, TOKENS_PATH))
        ms.zk.ChildrenWatch(TOKENS_PATH, self._on_children)

    def _on_children(self, children: list[str]) -> bool:
        # kazoo's event thread: no blocking reads here, hand them to the metastore's dispatcher.
        if self.closed or self.store.ms.closed:
            return False
        self.store.ms.submit(lambda: self._reload(children))
        return True

    def _reload(self, children: list[str]) -> None:
        records = {}
        for tid in children:
            known = self.records.get(tid)
            try:
                record = known or self.store.get(tid)
            except (ValueError, KeyError, IdentityError):
                log.error("ignoring malformed token record %s/%s", TOKENS_PATH, tid)
                continue
            if record is not None:
                records[tid] = record
        self.records = records

    def verify(self, token: str) -> Identity:
        """The identity ``token`` authenticates; ``TokenRefused`` if malformed, unknown or revoked."""
        return verify(token, self.records.get(token_id(token)))

    def close(self) -> None:
        self.closed = True
