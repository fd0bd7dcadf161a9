"""``/millrace/security/acls``: every module's ACL in one znode, changed by versioned CAS, cached by a watch.

One znode for all modules, not one per module, because ACLs outlive modules (a grant
may come before the deploy and must survive a destroy and re-deploy), every worker
needs all of them, and a whole ACL set is small (a few hundred bytes per identity).
A change is a read-modify-write with ``version=``, re-done on a lost race, so two
admins granting at once both win. Workers check permissions against an
:class:`AclCache` fed by a DataWatch: a check never waits on ZooKeeper, and a revoke
reaches every worker as soon as the watch fires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from conductor.metastore.layout import ACLS_PATH
from conductor.metastore.watch import WatchHandle
from conductor.security.acl import Acls, allowed, require
from conductor.security.identity import Identity, IdentityError

if TYPE_CHECKING:
    from conductor.metastore.session import Metastore


def _decode(data: bytes | None) -> Acls:
    try:
        return Acls.from_json(data or b"")
    except IdentityError as e:  # a hand-edited znode: ValueError makes the watch skip it and log it
        raise ValueError(str(e)) from None


class AclStore:
    """Read, change and watch the ACL znode."""

    def __init__(self, ms: Metastore) -> None:
        self.ms = ms

    def get(self) -> tuple[Acls, int]:
        """The ACLs and the znode version (``-1``: none stored yet, so nobody has any grant)."""
        try:
            data, stat = self.ms.call(self.ms.zk.get, ACLS_PATH)
        except NoNodeError:
            return Acls(), -1
        return _decode(data), int(stat.version)

    def update(self, change: Callable[[Acls], Acls]) -> Acls:
        """Apply ``change`` to the current ACLs by CAS; on a lost race re-read and apply it again."""
        while True:
            current, version = self.get()
            updated = change(current)
            try:
                if version < 0:
                    self.ms.call(self.ms.zk.create, ACLS_PATH, updated.to_json(), makepath=True)
                else:
                    self.ms.cas(ACLS_PATH, updated.to_json(), version)
                return updated
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # someone else changed (or created, or deleted) it first: decide again from theirs

    def grant(self, identity: Identity, module: str, permissions: Iterable[str]) -> Acls:
        perms = list(permissions)
        return self.update(lambda acls: acls.grant(identity, module, perms))

    def revoke(self, identity: Identity, module: str, permissions: Iterable[str] | None = None) -> Acls:
        perms = list(permissions) if permissions is not None else None
        return self.update(lambda acls: acls.revoke(identity, module, perms))

    def watch(self, callback: Callable[[Acls], None]) -> WatchHandle:
        """Call ``callback(acls)`` now and on every change (empty ACLs while the znode does not exist)."""
        def decode(data: bytes | None, _stat: Any) -> tuple[Acls]:
            return (_decode(data),)
        return self.ms.watch_data(ACLS_PATH, decode, callback)


class AclCache:
    """The ACLs as of the last watch event, for checks on every request without a ZooKeeper round trip.

    The first value is read synchronously, so a check right after construction
    already sees every grant; later ones arrive through the watch (on the
    metastore's dispatcher thread). Reads of ``acls`` are a single attribute load,
    safe from any thread.
    """

    def __init__(self, store: AclStore) -> None:
        self.acls, _ = store.get()
        self._handle = store.watch(self._set)

    def _set(self, acls: Acls) -> None:
        self.acls = acls

    def allowed(self, identity: Identity, module: str, permission: str) -> bool:
        return allowed(self.acls, identity, module, permission)

    def require(self, identity: Identity, module: str, permission: str) -> None:
        """Raise ``conductor.security.acl.Denied`` (naming the grant that fixes it) unless allowed."""
        require(self.acls, identity, module, permission)

    def close(self) -> None:
        self._handle.cancel()
