"""ZooKeeper digest authentication and znode ACLs: only the control plane changes the cluster's znodes.

ZooKeeper's znodes are world-writable unless created with an ACL, and anyone who
can write a group znode can rewrite its leader, ISR or code version. With digest
authentication every session adds ``digest:<user>:<password>`` credentials
(``auth_data``), and each znode carries an ACL naming who may do what. Millrace uses:

* **writers** (conductors, workers, admins): every permission on every Millrace
  znode: the module, group, resign, code-version, node and ACL znodes;
* **readers** (apps, for what routing needs): read only, either as their own digest
  user or, when ``world_readable``, anyone (routing data holds no secret; tokens are
  stored as hashes).

ZooKeeper ACLs are not inherited: a znode gets the ACL given when it is created.
So a session that creates znodes passes :func:`session_options` to ``KazooClient``
(its ``default_acl`` applies to every create), and an ensemble that already holds a
Millrace tree is converted once with :func:`protect_tree`. Passwords never appear
in a repr or a log line; the ACL holds only an unsalted SHA-1 digest of
``user:password``, so give each principal a long random password (:meth:`ZkPrincipal.generate`).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, Id, Permissions, make_digest_acl, make_digest_acl_credential

from conductor.metastore.layout import (
    DISALLOWED_PATH,
    MODULES_PATH,
    NODES_PATH,
    ROOT,
    SECURITY_PATH,
    TOKENS_PATH,
)

DIGEST = "digest"


@dataclass(frozen=True)
class ZkPrincipal:
    """A digest user and its password (the password never shows in a repr)."""

    user: str
    password: str = field(repr=False)

    @classmethod
    def generate(cls, user: str) -> ZkPrincipal:
        return cls(user, secrets.token_urlsafe(24))

    def auth_data(self) -> tuple[str, str]:
        """One entry of ``KazooClient(auth_data=[...])`` (or ``zk.add_auth(*p.auth_data())``)."""
        return DIGEST, f"{self.user}:{self.password}"


class ZkAuthError(ValueError):
    """The ``--zk-auth`` file cannot be used; the message names the file, never its contents."""


def read_principal(path: Path) -> ZkPrincipal:
    """The principal in ``path`` (``--zk-auth FILE``): one line ``user:password``; refused if others may read it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as e:
        raise ZkAuthError(f"cannot read the ZooKeeper credentials file {path}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ZkAuthError(f"the ZooKeeper credentials file {path} may be read by others: `chmod 600 {path}`")
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise ZkAuthError(f"the ZooKeeper credentials file {path} must hold one line USER:PASSWORD")
    return ZkPrincipal(user, password)


def cluster_acl(principal: ZkPrincipal) -> list[ACL]:
    """The ACL of every znode a Millrace process creates: ``principal`` (the control plane's digest user, shared by
    conductors, workers and admins) may do anything, everyone else may read: apps route from ZooKeeper, and no
    znode holds a secret (tokens are stored as hashes)."""
    return protected_acl([principal], world_readable=True)


def protected_acl(writers: Sequence[ZkPrincipal], readers: Sequence[ZkPrincipal] = (), *,
                  world_readable: bool = False) -> list[ACL]:
    """A znode ACL: ``writers`` may do anything, ``readers`` (or everyone) may only read."""
    if not writers:
        raise ValueError("a protected znode needs at least one writer, or nobody could ever change it again")
    acl = [make_digest_acl(p.user, p.password, all=True) for p in writers]
    acl += [make_digest_acl(p.user, p.password, read=True) for p in readers]
    if world_readable:
        acl.append(ACL(Permissions.READ, Id("world", "anyone")))
    return acl


#: a control-only znode naming the digest ids of the control plane and of the workers (``ZkRoles``): when it exists,
#: workers have a digest user of their own and may write only what they must (docs/security.md)
ROLES_PATH = f"{SECURITY_PATH}/zk-roles"


def digest_id(principal: ZkPrincipal) -> str:
    """``user:base64(sha1(user:password))``: how an ACL names a digest user (no secret: the password is random)."""
    return str(make_digest_acl_credential(principal.user, principal.password))


@dataclass(frozen=True)
class ZkRoles:
    """The digest ids of the control plane (conductors, admins: everything) and of the workers (their node znodes,
    the group znodes' data, resign requests' removal; read everything else), and the ACL each znode gets.

    ZooKeeper ACLs are per znode and not inherited, so every create asks :meth:`acl_for` its path's ACL: the
    ACL follows the path, not the session that creates it. ``worker`` None: one user for both (the ACL is
    :func:`cluster_acl`'s).
    """

    control: str
    worker: str | None = None

    def acl_for(self, path: str) -> list[ACL]:
        acl = [ACL(Permissions.ALL, Id(DIGEST, self.control)), ACL(Permissions.READ, Id("world", "anyone"))]
        if self.worker is None:
            return acl
        worker = _worker_permissions(path)
        if worker:
            acl.append(ACL(worker | Permissions.READ, Id(DIGEST, self.worker)))
        return acl

    def to_json(self) -> bytes:
        return json.dumps({"control": self.control, "worker": self.worker}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ZkRoles:
        d = json.loads(raw)
        return cls(str(d["control"]), d.get("worker"))


def _worker_permissions(path: str) -> int:
    """What the workers' user may do to ``path`` beyond reading it (0: nothing)."""
    parts = path[len(MODULES_PATH) + 1:].split("/") if path.startswith(MODULES_PATH + "/") else []
    perms = 0
    if path == NODES_PATH:
        perms = Permissions.CREATE | Permissions.DELETE  # register and unregister themselves
    elif path.startswith(NODES_PATH + "/"):
        perms = Permissions.ALL  # a worker's own (ephemeral) registration
    elif len(parts) == 3 and parts[1] == "groups":
        perms = Permissions.WRITE  # ISR changes, leader epochs, storage records: groups.cas
    elif len(parts) == 2 and parts[1] == "resign":
        perms = Permissions.DELETE  # a completed hand-off removes its request (resigns.complete)
    return int(perms)


def publish_roles(zk: KazooClient, roles: ZkRoles) -> None:
    """Write ``roles`` (``zk`` authenticated as the control user) and make the paths every process needs, each
    with its ACL, so that no worker has to create one. Run it once before starting workers with their own user."""
    for path in (ROOT, f"{ROOT}/conductor", NODES_PATH, MODULES_PATH, DISALLOWED_PATH, SECURITY_PATH, TOKENS_PATH):
        if zk.exists(path) is None:
            zk.create(path, b"", acl=roles.acl_for(path), makepath=False)
        else:
            zk.set_acls(path, roles.acl_for(path))
    if zk.exists(ROLES_PATH) is None:
        zk.create(ROLES_PATH, roles.to_json(), acl=roles.acl_for(ROLES_PATH))
    else:
        zk.set(ROLES_PATH, roles.to_json())


def read_roles(zk: KazooClient) -> ZkRoles | None:
    try:
        raw, _ = zk.get(ROLES_PATH)
    except NoNodeError:
        return None
    return ZkRoles.from_json(raw)


def session_options(principal: ZkPrincipal, acl: Sequence[ACL] | None = None) -> dict[str, Any]:
    """``KazooClient(**session_options(...))``: authenticate as ``principal``; znodes it creates get ``acl``."""
    options: dict[str, Any] = {"auth_data": [principal.auth_data()]}
    if acl is not None:
        options["default_acl"] = list(acl)
    return options


def protect_tree(zk: KazooClient, acl: Sequence[ACL] | Callable[[str], list[ACL]], root: str = ROOT) -> int:
    """Set ``acl`` (or ``acl(path)``: ``ZkRoles.acl_for``) on ``root`` and every znode under it (an existing
    ensemble's one-time set-up).

    ``zk`` must already be authenticated as one of the writers (else it locks
    itself out half-way). Ephemeral znodes (live nodes, election entries) are
    included; they are re-created with the session's ``default_acl`` anyway.
    Returns how many znodes were changed.
    """
    changed = 0
    stack = [root]
    while stack:
        path = stack.pop()
        try:
            children = zk.get_children(path)
            zk.set_acls(path, acl(path) if callable(acl) else list(acl))
        except NoNodeError:
            continue  # deleted meanwhile (an ephemeral, a resign request): nothing to protect
        changed += 1
        stack.extend(f"{path.rstrip('/')}/{c}" for c in children)
    return changed


#: the principal of a process that operates one cluster (a secure ``DevCluster``'s test process): every
#: Metastore it opens without its own ``zk_auth`` authenticates with it, so the test helpers work unchanged
_process_principal: ZkPrincipal | None = None


def use_process_principal(principal: ZkPrincipal | None) -> None:
    """Make every Metastore opened without explicit ``zk_auth`` authenticate as ``principal`` (None: none)."""
    global _process_principal
    _process_principal = principal


def process_principal() -> ZkPrincipal | None:
    return _process_principal


def write_principal(path: Path, principal: ZkPrincipal) -> Path:
    """Write ``principal`` as a ``--zk-auth`` file: one line ``user:password``, mode 0600 from creation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{principal.user}:{principal.password}\n")
    os.replace(tmp, path)
    return path
