"""Security state in a real ZooKeeper: the ACL and token recipes, and digest-protected znodes."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from conductor.metastore import Metastore
from conductor.metastore.acls import AclCache
from conductor.metastore.layout import ACLS_PATH, group_path, module_path
from conductor.metastore.module_spec import ModuleSpec
from conductor.metastore.tokens import TokenCache
from conductor.metastore.zk_auth import (
    ZkAuthError,
    ZkPrincipal,
    protect_tree,
    protected_acl,
    read_principal,
    session_options,
)
from conductor.security.acl import Denied
from conductor.security.identity import Identity
from conductor.security.tokens import TokenRefused, generate
from replog.messages import GroupState
from tests.integration.cluster_helpers import wait_for


@pytest.fixture
def ms(zk_hosts: str) -> Iterator[Metastore]:
    with Metastore(zk_hosts, session_timeout=2.0) as m:
        yield m


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def client(hosts: str, principal: ZkPrincipal | None = None, **options: object) -> KazooClient:
    kwargs = dict(session_options(principal)) if principal else {}
    kwargs.update(options)
    zk = KazooClient(hosts=hosts, **kwargs)
    zk.start(timeout=15)
    return zk


# ---- ACLs ----------------------------------------------------------------------------------------------


def test_acl_grants_are_stored_and_concurrent_grants_both_land(ms: Metastore) -> None:
    module = unique("m")
    a, b = Identity("app", unique("a")), Identity("app", unique("b"))
    errors: list[BaseException] = []

    def grant(who: Identity, perm: str) -> None:
        try:
            for _ in range(5):  # repeated: idempotent, and racing the other thread's CAS
                ms.acls.grant(who, module, [perm])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=grant, args=(a, "append")), threading.Thread(target=grant, args=(b, "query"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    acls, version = ms.acls.get()
    assert version >= 0
    assert acls.granted(a, module) == {"append"} and acls.granted(b, module) == {"query"}
    ms.acls.revoke(a, module)
    assert ms.acls.get()[0].granted(a, module) == frozenset()


def test_acl_cache_follows_the_znode(ms: Metastore, zk_hosts: str) -> None:
    module, app = unique("m"), Identity("app", unique("c"))
    cache = AclCache(ms.acls)
    try:
        with pytest.raises(Denied, match=f"conductor acl grant {app} {module} append"):
            cache.require(app, module, "append")
        with Metastore(zk_hosts, session_timeout=2.0) as admin:  # another process grants
            admin.acls.grant(app, module, ["append"])
        wait_for(lambda: cache.allowed(app, module, "append"), 10.0, "the grant to reach the cache")
        ms.acls.revoke(app, module, ["append"])
        wait_for(lambda: not cache.allowed(app, module, "append"), 10.0, "the revoke to reach the cache")
    finally:
        cache.close()
    assert ms.call(ms.zk.exists, ACLS_PATH) is not None


# ---- tokens --------------------------------------------------------------------------------------------


def test_token_store_and_cache(ms: Metastore) -> None:
    app = Identity("app", unique("t"))
    token, record = generate(app)
    cache = TokenCache(ms.tokens)
    try:
        ms.tokens.put(record)
        assert ms.tokens.get(record.token_id) == record
        data, _ = ms.call(ms.zk.get, f"/millrace/security/tokens/{record.token_id}")
        assert token.encode() not in data and token.split(".")[2].encode() not in data
        wait_for(lambda: record.token_id in cache.records, 10.0, "the token to reach the cache")
        assert cache.verify(token) == app
        assert ms.tokens.revoke(record.token_id)
        wait_for(lambda: record.token_id not in cache.records, 10.0, "the revoke to reach the cache")
        with pytest.raises(TokenRefused, match="unknown or revoked"):
            cache.verify(token)
        assert not ms.tokens.revoke(record.token_id)
    finally:
        cache.close()


# ---- ZooKeeper digest ACLs -----------------------------------------------------------------------------


def test_a_client_without_the_digest_cannot_change_a_protected_znode(zk_hosts: str) -> None:
    conductor, app = ZkPrincipal.generate("conductor"), ZkPrincipal.generate("app")
    assert conductor.password not in repr(conductor)
    acl = protected_acl([conductor], [app])
    root = f"/{unique('sec')}"
    group = f"{root}/modules/m/groups/0"
    writer = client(zk_hosts, conductor, default_acl=acl)
    stranger = client(zk_hosts)
    reader = client(zk_hosts, app)
    try:
        writer.create(group, b'{"leader": "n1"}', makepath=True)  # every level gets the default ACL
        for path in (root, f"{root}/modules", group):
            assert writer.get_acls(path)[0] == acl
        with pytest.raises(NoAuthError):
            stranger.set(group, b'{"leader": "evil"}')
        with pytest.raises(NoAuthError):
            stranger.get(group)
        with pytest.raises(NoAuthError):
            stranger.create(f"{root}/modules/evil", b"")
        with pytest.raises(NoAuthError):
            stranger.delete(group)
        assert reader.get(group)[0] == b'{"leader": "n1"}', "apps may read what routing needs"
        with pytest.raises(NoAuthError):
            reader.set(group, b'{"leader": "evil"}')
        writer.set(group, b'{"leader": "n2"}')
        assert writer.get(group)[0] == b'{"leader": "n2"}'
    finally:
        writer.delete(root, recursive=True)
        for zk in (writer, stranger, reader):
            zk.stop()
            zk.close()


def test_protect_tree_converts_an_existing_world_writable_tree(zk_hosts: str) -> None:
    admin = ZkPrincipal.generate("admin")
    root = f"/{unique('sec')}"
    anyone = client(zk_hosts)
    owner = client(zk_hosts, admin)
    try:
        for path in (f"{root}/modules/m/groups/0", f"{root}/modules/m/versions/abc", f"{root}/nodes/n1"):
            anyone.create(path, b"x", makepath=True)
        acl = protected_acl([admin], world_readable=True)
        assert protect_tree(owner, acl, root) == 9  # root, modules, m, groups, 0, versions, abc, nodes, n1
        assert anyone.get(f"{root}/modules/m/groups/0")[0] == b"x", "world-readable: routing still reads"
        for path in (f"{root}/modules/m/groups/0", f"{root}/modules/m/versions/abc", f"{root}/nodes/n1"):
            with pytest.raises(NoAuthError):
                anyone.set(path, b"evil")
        owner.set(f"{root}/modules/m/groups/0", b"y")
    finally:
        owner.delete(root, recursive=True)
        for zk in (anyone, owner):
            zk.stop()
            zk.close()


def test_a_protected_metastore_creates_znodes_only_it_can_change_and_apps_can_route_from(zk_hosts: str,
                                                                                         tmp_path: Path) -> None:
    """`--zk-auth FILE`: a conductor's Metastore authenticates with the digest and creates the module's znodes
    with the cluster ACL; a client without the digest cannot change the group znode, and an app still reads the
    routes."""
    credentials = tmp_path / "zk-auth"
    principal = ZkPrincipal.generate(unique("millrace"))
    credentials.write_text(f"{principal.user}:{principal.password}\n")
    credentials.chmod(0o600)
    module = unique("Protected")
    spec = ModuleSpec(name=module, module_ref=f"pkg.mod:{module}", tasks=2, threads=1, workers=1,
                      replication_factor=1)
    with Metastore(zk_hosts, session_timeout=4.0, zk_auth=read_principal(credentials)) as protected:
        protected.modules.create(spec, {0: GroupState.initial(["n1"])})
        intruder = client(zk_hosts)
        try:
            data, _ = intruder.get(group_path(module, 0))  # world-readable: routing needs it
            for change in (lambda: intruder.set(group_path(module, 0), data.replace(b"n1", b"evil")),
                           lambda: intruder.delete(group_path(module, 0)),
                           lambda: intruder.set(module_path(module), b"{}"),
                           lambda: intruder.create(f"{module_path(module)}/groups/1", b"{}")):
                with pytest.raises(NoAuthError):
                    change()
        finally:
            intruder.stop()
            intruder.close()
        with Metastore(zk_hosts, session_timeout=4.0) as app:  # an app's session: no digest
            state, _version = app.groups.all(module)[0]
            assert state.leader == "n1"
        # the protected session itself still changes it (the conductor's and workers' CAS)
        current, version = protected.groups.all(module)[0]
        protected.groups.cas(module, 0, dataclasses.replace(current, epoch=current.epoch + 1), version)


def test_the_credentials_file_is_refused_if_others_may_read_it(tmp_path: Path) -> None:
    credentials = tmp_path / "zk-auth"
    credentials.write_text("millrace:s3cret-password\n")
    credentials.chmod(0o644)
    with pytest.raises(ZkAuthError, match="chmod 600") as e:
        read_principal(credentials)
    assert "s3cret" not in str(e.value)
    credentials.chmod(0o600)
    assert read_principal(credentials).user == "millrace"
    credentials.write_text("no-colon\n")
    with pytest.raises(ZkAuthError, match="USER:PASSWORD"):
        read_principal(credentials)
