"""Who may do what to which module: the pure ACL model (no I/O; stored by :mod:`conductor.metastore.acls`).

Permissions, per module (or ``*``: every module, including ones not deployed yet):

==========  =====================================================================
``append``  append to the module's depots (``Append``, ``AppendStream``, ``CommitBatch``)
``query``   read its PStates and depots (``Select``, ``DepotRead``, status of its groups)
``deploy``  deploy, update and destroy it, and ship its code (``PutArtifact``, ``Prepare``):
            code runs on a worker only if an identity with ``deploy`` shipped it
``admin``   change its options, balance its leaders, change its ACLs, trim its depots (``DepotTrim``)
``view``    see it in the conductor's web UI and JSON API (read-only status, charts);
            ``view`` on ``*`` also opens the whole-cluster pages and every ``/metrics``
==========  =====================================================================

What each role gets without any grant (a grant can only add to it):

* ``admin``: every permission on every module; an operator holding an admin
  certificate is the root of trust, as whoever holds the CA key is.
* ``conductor``: ``query``, ``deploy``, ``admin`` and ``view`` on every module: it
  places groups, moves leaders, carries out deploys and updates, and scrapes the
  workers' metrics. Never ``append``: the control plane has no business writing
  users' data.
* ``worker``: ``append`` and ``query`` on every module: workers relay appends, read
  each other's state (far-horizon copies, artifact fetches) and write the hops of
  topologies. Never ``deploy`` or ``admin``: a compromised worker must not be able to
  ship code to the others. (Which worker may replicate *which* group is not an ACL:
  the group's znode names its replicas, and the link checks the peer against it.)
* ``app``: nothing; each app gets exactly what an admin grants.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from conductor.security.identity import Identity, parse

APPEND, QUERY, DEPLOY, ADMIN, VIEW = "append", "query", "deploy", "admin", "view"
PERMISSIONS = (APPEND, QUERY, DEPLOY, ADMIN, VIEW)
ALL_MODULES = "*"

ROLE_PERMISSIONS: Mapping[str, frozenset[str]] = {
    "admin": frozenset(PERMISSIONS),
    "conductor": frozenset({QUERY, DEPLOY, ADMIN, VIEW}),
    "worker": frozenset({APPEND, QUERY}),
    "app": frozenset(),
}


class UnknownPermission(ValueError):
    def __init__(self, permission: str) -> None:
        super().__init__(f"unknown permission {permission!r}; permissions are {', '.join(PERMISSIONS)}")


class Denied(Exception):
    """``identity`` lacks ``permission`` on ``module``: the message says who, what, and the command that fixes it."""

    def __init__(self, identity: Identity, module: str, permission: str) -> None:
        self.identity = identity
        self.module = module
        self.permission = permission
        super().__init__(f"{identity} may not {permission} on module {module!r} (missing permission "
                         f"{permission!r}); an admin grants it with "
                         f"`conductor acl grant {identity} {module} {permission}`")


def check_permissions(permissions: Iterable[str]) -> frozenset[str]:
    out = frozenset(permissions)
    for p in out:
        if p not in PERMISSIONS:
            raise UnknownPermission(p)
    return out


@dataclass(frozen=True)
class Acls:
    """Grants: module (or ``*``) -> identity -> permissions. Immutable; ``grant``/``revoke`` return a new one."""

    grants: Mapping[str, Mapping[Identity, frozenset[str]]] = field(default_factory=dict)

    def granted(self, identity: Identity, module: str) -> frozenset[str]:
        """Only what was granted (to ``module`` and to ``*``), without what the role implies."""
        out: frozenset[str] = frozenset()
        for key in (module, ALL_MODULES):
            out |= self.grants.get(key, {}).get(identity, frozenset())
        return out

    def grant(self, identity: Identity, module: str, permissions: Iterable[str]) -> Acls:
        perms = check_permissions(permissions)
        per_module = dict(self.grants.get(module, {}))
        per_module[identity] = per_module.get(identity, frozenset()) | perms
        return Acls({**self.grants, module: per_module})

    def revoke(self, identity: Identity, module: str, permissions: Iterable[str] | None = None) -> Acls:
        """Take ``permissions`` (all of them if ``None``) of ``identity`` on ``module`` away."""
        perms = check_permissions(permissions) if permissions is not None else frozenset(PERMISSIONS)
        per_module = dict(self.grants.get(module, {}))
        left = per_module.get(identity, frozenset()) - perms
        if left:
            per_module[identity] = left
        else:
            per_module.pop(identity, None)
        grants = {**self.grants, module: per_module}
        if not per_module:
            del grants[module]
        return Acls(grants)

    def rows(self) -> Iterator[tuple[str, Identity, frozenset[str]]]:
        """Every grant, sorted by module then identity (what `conductor acl list` shows)."""
        for module in sorted(self.grants):
            for identity in sorted(self.grants[module]):
                yield module, identity, self.grants[module][identity]

    def to_json(self) -> bytes:
        return json.dumps({m: {str(i): sorted(p) for i, p in ids.items()} for m, ids in self.grants.items()},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Acls:
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls({m: {parse(i): check_permissions(p) for i, p in ids.items()} for m, ids in d.items()})


def permissions(acls: Acls, identity: Identity, module: str) -> frozenset[str]:
    """Everything ``identity`` may do on ``module``: its role's permissions plus its grants."""
    return ROLE_PERMISSIONS[identity.role] | acls.granted(identity, module)


def allowed(acls: Acls, identity: Identity, module: str, permission: str) -> bool:
    if permission not in PERMISSIONS:
        raise UnknownPermission(permission)
    return permission in permissions(acls, identity, module)


def require(acls: Acls, identity: Identity, module: str, permission: str) -> None:
    """Return if allowed, else raise :class:`Denied` (what a worker maps to ``PERMISSION_DENIED``)."""
    if not allowed(acls, identity, module, permission):
        raise Denied(identity, module, permission)
