"""A secure cluster for real: `DevCluster(secure=True)`, RF=3, every link mutual TLS (issue 26, transport half).

One cluster for the module (real ZooKeeper, a conductor and three worker processes,
certificates made by the test's CA). Checked: an app with its certificate appends
and selects; a client without a certificate, with one from another CA, or an expired
one is refused and changes nothing; a replication link from a certificate that is not
one of the group's replicas is refused; a ZooKeeper client without the cluster's
digest cannot change a group znode; a worker's certificate rotated while a writer
appends fails no append; a reachable plaintext bind refuses to start. Apps with a
bearer token (the workers' token port, server-only TLS) append and query; a wrong or
revoked token is refused (``Unauthenticated``), and a token app cannot deploy.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.layout import ACLS_PATH, NODES_PATH, TOKENS_PATH, group_path, module_path
from conductor.metastore.zk_auth import ROLES_PATH, ZkRoles, digest_id, read_principal, read_roles
from conductor.security import certs, tokens
from conductor.security.identity import Identity
from conductor.security.tls import TlsError, TlsFiles, TlsSource, token_channel_credentials
from conductor.settings import split_hostport
from conductor.wire import admin_pb2, admin_pb2_grpc, code_pb2
from conductor.wire import code_pb2_grpc as codeg
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import PermissionDenied, Unauthenticated, error_from_rpc
from conductor.wire.peer_framing import LENGTH, frame_bytes
from tests.integration.cluster_helpers import Appender, converged, deploy, group_status, groups_of, wait_for

MODULE = "Clicks"


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("secure"), nodes=3, secure=True)
    with cluster:
        deploy(cluster, MODULE, tasks=4, threads=2)
        deploy(cluster, "WordCount", tasks=4, threads=2, module_ref="examples.word_count:WordCount")
        yield cluster


def leader_address(dc: DevCluster, group: int = 0) -> tuple[str, str]:
    with Metastore(dc.hosts) as ms:
        st, _v = ms.groups.get(MODULE, group)
        assert st.leader is not None
        info = ms.nodes.get(st.leader)
        assert info is not None and info.secure, "a TLS worker says so in its node znode (conductor status)"
        return st.leader, info.address


def log_end(dc: DevCluster, node: str, group: int = 0) -> int:
    return group_status(dc, node, MODULE, group).log_end


def raw_append(address: str, creds: grpc.ChannelCredentials) -> grpc.RpcError:
    """An append with `creds`, straight to the leader: the error it gets (it must get one)."""
    record = pb.AppendRequest(module=MODULE, group=0)  # (the handshake fails before any field is read)
    with grpc.secure_channel(address, creds, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        try:
            pbg.ClientStub(ch).Append(record, timeout=5)
        except grpc.RpcError as e:
            return e
    raise AssertionError("the append was accepted")


def test_app_with_its_certificate_appends_and_selects(dc: DevCluster) -> None:
    with dc.connect() as client:  # app/dev, from the dev cluster's CA
        for i in range(5):
            assert client.depot(MODULE, "*clicks").append({"user": "ann", "id": f"a{i}"}, ack="applied") >= 0
        # word counts travel between task groups over the workers' TLS replication links
        client.depot("WordCount", "*sentences").append_many(["the cat sat", "the dog"] * 5, ack="applied")
        counts = client.pstate("WordCount", "$$counts")
        wait_for(lambda: counts.select_one("the") == 10 and counts.select_one("dog") == 5, 30, "the word counts")


@pytest.mark.parametrize("offer", ["no certificate", "another CA", "expired"])
def test_clients_without_a_valid_certificate_are_refused_and_change_nothing(
        dc: DevCluster, tmp_path: Path, offer: str) -> None:
    leader, address = leader_address(dc)
    ca = (dc.pki / certs.CA_CERT).read_bytes()
    app = Identity("app", f"intruder-{offer.replace(' ', '-')}")
    if offer == "no certificate":
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        if offer == "another CA":
            certs.init_ca_dir(tmp_path / "other")
            issued = certs.issue_to_dir(tmp_path / "other", app)
        else:
            past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
            issued = certs.issue_to_dir(dc.pki, app, days=1, not_before=past, out=tmp_path / "expired")
        # the client's own check names the problem before any connection (the server can only drop it)
        with pytest.raises(TlsError, match="not issued by the CA" if offer == "another CA" else "expired"):
            TlsSource(TlsFiles(dc.pki / certs.CA_CERT, issued.cert, issued.key))
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=issued.key.read_bytes(),
                                             certificate_chain=issued.cert.read_bytes())
    before = log_end(dc, leader)
    err = raw_append(address, creds)
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED), err
    assert log_end(dc, leader) == before, "nothing reached the depot"


def test_plaintext_client_is_refused(dc: DevCluster) -> None:
    leader, address = leader_address(dc)
    before = log_end(dc, leader)
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as e:
        pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=MODULE, group=0), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert log_end(dc, leader) == before


def test_zookeeper_client_without_the_digest_cannot_change_a_group_znode(dc: DevCluster) -> None:
    """`DevCluster(secure=True)` runs its conductor and workers with `--zk-auth` (a 0600 file under its root):
    a ZooKeeper client without the digest reads a group znode (routing) but cannot change or delete it."""
    assert stat.S_IMODE(dc.zk_auth_file.stat().st_mode) == 0o600
    assert json.loads((dc.root / "cluster.json").read_text())["zk_auth"] == str(dc.zk_auth_file)
    path = group_path(MODULE, 0)
    zk = KazooClient(hosts=dc.hosts)
    zk.start(timeout=15)
    try:
        data, znode = zk.get(path)
        with pytest.raises(NoAuthError):
            zk.set(path, b'{"leader": "intruder"}', version=znode.version)
        with pytest.raises(NoAuthError):
            zk.delete(path, recursive=False)
        with pytest.raises(NoAuthError):
            zk.create(f"{path}/intruder", b"")
        assert zk.get(path)[0] == data
    finally:
        zk.stop()
        zk.close()


def test_workers_zookeeper_user_writes_only_what_workers_must(dc: DevCluster) -> None:
    """The workers authenticate as their own digest user (`zk-auth-worker`, zk_auth.ZkRoles): it may write the group
    znodes and its node registration, not a module spec, a code version, the ACLs or a token."""
    assert stat.S_IMODE(dc.zk_worker_auth_file.stat().st_mode) == 0o600
    worker = read_principal(dc.zk_worker_auth_file)
    worker_id = digest_id(worker)
    zk = KazooClient(hosts=dc.hosts, auth_data=[worker.auth_data()])
    zk.start(timeout=15)
    try:
        assert read_roles(zk) == ZkRoles(digest_id(dc.zk_principal()), worker_id)
        acl, _ = zk.get_acls(group_path(MODULE, 0))  # (ZooKeeper shows a digest ACL as `user:x`)
        assert any(a.id.id.startswith(f"{worker.user}:") and a.perms & Permissions.WRITE for a in acl), acl
        with Metastore(dc.hosts) as ms:
            live = ms.nodes.live()
        node_acl, _ = zk.get_acls(f"{NODES_PATH}/{live[0]}")
        assert any(a.id.id.startswith(f"{worker.user}:") for a in node_acl), "workers register as their own user"
        for path in (module_path(MODULE), ACLS_PATH, ROLES_PATH):
            data, znode = zk.get(path)
            with pytest.raises(NoAuthError):
                zk.set(path, data, version=znode.version)
        with pytest.raises(NoAuthError):
            zk.create(f"{TOKENS_PATH}/forged", b"{}")
        with pytest.raises(NoAuthError):
            zk.create(f"{module_path(MODULE)}/versions/forged", b"{}")
    finally:
        zk.stop()
        zk.close()


@pytest.mark.parametrize("who", ["worker/n9", "app/dev", "worker/n2 for n1"])
def test_far_horizon_copy_only_for_a_replica_of_the_group_fetching_for_itself(dc: DevCluster, who: str) -> None:
    """`FetchCheckpoint` hands out a replica's whole state: refused (before any checkpoint is made) to a worker
    the group's znode does not name, to an app, and to a replica asking in another replica's name."""
    leader, address = leader_address(dc)
    role, _, rest = who.partition("/")
    name, _, follower = rest.partition(" for ")
    identity = Identity(role, name)
    files = TlsFiles.in_dir(dc.pki, identity)
    if not files.cert.exists():
        dc.issue(identity)
    creds = grpc.ssl_channel_credentials(root_certificates=files.ca.read_bytes(), private_key=files.key.read_bytes(),
                                         certificate_chain=files.cert.read_bytes())
    req = pb.FetchCheckpointRequest(module=MODULE, group=0, follower=follower or name, epoch=0)
    with grpc.secure_channel(address, creds) as ch, pytest.raises(grpc.RpcError) as e:
        for _chunk in pbg.ReplicationStub(ch).FetchCheckpoint(req, timeout=10):
            pass
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value
    assert ("not a replica of Clicks/0" if name == "n9" else "only a replica of the group") in str(e.value.details())
    assert not list((dc.node_dir(leader) / "checkpoints").glob("*")), "no checkpoint was made"


def test_a_replica_of_the_group_may_call_for_its_own_copy(dc: DevCluster) -> None:
    """The positive side: a follower's own certificate passes the rule (a `release` asks for nothing to be made)."""
    leader, address = leader_address(dc)
    follower = next(n for n in dc.nodes if n != leader)
    files = TlsFiles.in_dir(dc.pki, Identity("worker", follower))
    creds = grpc.ssl_channel_credentials(root_certificates=files.ca.read_bytes(), private_key=files.key.read_bytes(),
                                         certificate_chain=files.cert.read_bytes())
    req = pb.FetchCheckpointRequest(module=MODULE, group=0, follower=follower, release=True)
    with grpc.secure_channel(address, creds) as ch:
        assert list(pbg.ReplicationStub(ch).FetchCheckpoint(req, timeout=10)) == []


def link_attempt(dc: DevCluster, node: str, identity: Identity, src: str) -> str:
    """Open a TLS replication link to `node` as `identity`, send one replication frame naming `src` as its
    sender, and return what the worker answers before closing the link."""
    files = TlsFiles.in_dir(dc.pki, identity)
    if not files.cert.exists():
        dc.issue(identity)
    with Metastore(dc.hosts) as ms:
        info = ms.nodes.get(node)
        assert info is not None
    host, port = split_hostport(info.replication)
    msg = pb.PeerMessage(module=MODULE, group=0, epoch_request=pb.EpochRequestMsg(epoch=1, requested_epoch=1))

    async def attempt() -> str:
        ctx = TlsSource(files).link_contexts().client()
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=node)
        try:
            writer.write(frame_bytes(src, node, [msg.SerializeToString()]))
            await writer.drain()
            (n,) = LENGTH.unpack(await asyncio.wait_for(reader.readexactly(LENGTH.size), 10))
            return (await reader.readexactly(n)).decode()
        finally:
            writer.close()

    return asyncio.run(attempt())


def test_replication_link_from_a_non_replica_certificate_is_refused(dc: DevCluster) -> None:
    leader, _ = leader_address(dc)
    before = log_end(dc, leader)
    app = link_attempt(dc, leader, Identity("app", "dev"), src="n2")
    assert app.startswith("UNAUTHENTICATED") and "app/dev" in app, app
    # a worker of this cluster's CA that is not a replica of the group (RF=3 on 3 nodes: a fourth name)
    outsider = link_attempt(dc, leader, Identity("worker", "n9"), src="n9")
    assert outsider.startswith("PERMISSION_DENIED") and "n9" in outsider, outsider
    # ... and it cannot pass for a replica by naming one in the frame
    impostor = link_attempt(dc, leader, Identity("worker", "n9"), src="n2")
    assert "worker/n9" in impostor and "sends only as itself" in impostor, impostor
    assert log_end(dc, leader) == before


def served_certificate(dc: DevCluster, node: str) -> bytes:
    """The DER certificate `node`'s replication listener presents to a new link now."""
    with Metastore(dc.hosts) as ms:
        info = ms.nodes.get(node)
        assert info is not None
    host, port = split_hostport(info.replication)
    ctx = TlsSource(TlsFiles.in_dir(dc.pki, Identity("worker", "n3" if node != "n3" else "n2"))).link_contexts()
    with socket.create_connection((host, port), timeout=5) as raw, \
            ctx.client().wrap_socket(raw, server_hostname=node) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def test_isr_shrinks_and_expands_under_the_workers_own_zookeeper_user(dc: DevCluster) -> None:
    """A follower stops (its leader shrinks the ISR: a group znode written with the workers' user) and comes back
    (the ISR expands again), while a writer appends: nothing fails for want of a ZooKeeper permission."""
    groups = groups_of(dc, MODULE)
    # a worker that leads no group of the module: a clean stop of a leader fails the appends in flight on it
    follower = next(n for n in groups[0].replicas if all(g.leader != n for g in groups.values()))
    with dc.connect() as client:
        writer = Appender(client.depot(MODULE, "*clicks"), prefix="isr").start()
        try:
            dc.nodes[follower].stop()
            wait_for(lambda: follower not in groups_of(dc, MODULE)[0].isr, 30, f"{follower} to leave the ISR")
            assert all(g.leader != follower for g in groups_of(dc, MODULE).values())
            n = writer.count()
            wait_for(lambda: writer.count() > n + 50, 30, "appends with the shrunk ISR")
            dc.start_node(follower)
            dc.wait_nodes([follower])
            wait_for(lambda: all(len(g.isr) == len(g.replicas) for g in groups_of(dc, MODULE).values()), 60,
                     f"{follower} back in every ISR")
        finally:
            writer.stop()
    assert writer.failed == 0, writer.errors[:3]
    wait_for(lambda: converged(dc, MODULE), 60, "every replica to apply its leader's whole log")


def test_a_leader_hands_off_under_the_workers_own_zookeeper_user(dc: DevCluster) -> None:
    """A hand-off request (the conductor's balancing writes it): the leader completes it with its own ZooKeeper user,
    removing the request and writing the group znode in one transaction."""
    wait_for(lambda: all(len(g.isr) == len(g.replicas) for g in groups_of(dc, MODULE).values()), 60, "full ISRs")
    st = groups_of(dc, MODULE)[1]
    to = next(n for n in st.isr if n != st.leader)
    with Metastore(dc.hosts) as ms:
        ms.resigns.request(MODULE, 1, to, st.epoch, ms.nodes.sessions()[to])
        wait_for(lambda: groups_of(dc, MODULE)[1].leader == to, 30, f"{to} to lead {MODULE}/1")
        wait_for(lambda: ms.resigns.get(MODULE, 1) is None, 10, "the request to be removed by the leader")


def test_worker_certificate_rotated_while_a_writer_appends(dc: DevCluster) -> None:
    leader, _ = leader_address(dc)
    old = served_certificate(dc, leader)
    with dc.connect() as client:
        writer = Appender(client.depot(MODULE, "*clicks"), prefix="rot").start()
        wait_for(lambda: writer.count() > 50, 30, "appends before the rotation")
        dc.issue(Identity("worker", leader))  # rewrites worker-<leader>.pem/.key in place
        n = writer.count()
        wait_for(lambda: writer.count() > n + 200, 30, "appends after the rotation")
        new = served_certificate(dc, leader)
        writer.stop()
    assert new != old, "the listener serves the rotated certificate from its next handshake"
    pem = ssl.DER_cert_to_PEM_cert(new).encode()
    assert pem.strip() == TlsFiles.in_dir(dc.pki, Identity("worker", leader)).cert.read_bytes().strip()
    assert writer.failed == 0, writer.errors[:3]
    with dc.connect() as client:  # a new connection after the rotation: the gRPC port serves the new one too
        client.depot(MODULE, "*clicks").append({"user": "bob", "id": "after"}, ack="applied")


@pytest.mark.parametrize("cmd", [["-m", "conductor.worker", "--node-id", "w1", "--data-dir", "{d}",
                                  "--host", "0.0.0.0", "--advertise", "10.1.2.3"],
                                 ["-m", "conductor.controller", "--name", "c9", "--host", "0.0.0.0"]])
def test_reachable_plaintext_bind_refuses_to_start(tmp_path: Path, cmd: list[str]) -> None:
    args = [a.replace("{d}", str(tmp_path)) for a in cmd]
    out = subprocess.run([sys.executable, *args, "--zk", "127.0.0.1:1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out
    assert "without TLS" in out.stderr and "--insecure" in out.stderr and "--tls-dir" in out.stderr, out.stderr


def test_spark_reads_a_depot_and_a_pstate_over_tls(dc: DevCluster, spark: Any) -> None:
    """Executors (local here: the same machine) read the files the tls* options name."""
    from topology.spark import register

    register(spark)
    files = TlsFiles.in_dir(dc.pki, DevCluster.APP)
    tls = {"tlsCa": str(files.ca), "tlsCert": str(files.cert), "tlsKey": str(files.key)}
    with dc.connect() as client:
        client.depot(MODULE, "*raw").append({"user": "spark", "id": "s1"}, ack="applied")
        client.depot("WordCount", "*sentences").append("spark reads over tls", ack="applied")
        counts = client.pstate("WordCount", "$$counts")
        wait_for(lambda: counts.select_one("tls") == 1, 30, "the sentence counted")
    rows = (spark.read.format("millrace.depot").option("cluster", dc.hosts).option("module", MODULE)
            .option("depot", "*raw").options(**tls).load().collect())
    assert any('"spark"' in r.value for r in rows), rows
    scanned = dict((r.key, r.value) for r in spark.read.format("millrace.pstate").option("cluster", dc.hosts)
                   .option("module", "WordCount").option("pstate", "$$counts").options(**tls).load().collect())
    assert scanned.get("tls") == "1", scanned


# ---- apps with a bearer token: the workers' token port ------------------------------------------------------------


def token_for(dc: DevCluster, name: str, *permissions: str) -> tuple[str, str]:
    """A token of app/<name> (and its id), granted query and `permissions` on MODULE, as `conductor token create`
    and `conductor acl grant` make them."""
    app = Identity("app", name)
    token, record = tokens.generate(app)
    with Metastore(dc.hosts, zk_auth=dc.zk_principal()) as ms:
        ms.tokens.put(record)
        ms.acls.grant(app, MODULE, {"query", *permissions})
        nodes = ms.nodes.live()
    for node in nodes:  # each worker's token and ACL caches follow ZooKeeper watches: wait until they have fired
        wait_for(lambda n=node: known_everywhere(dc, n, token), 20, f"worker {node} to know the token")
    return token, record.token_id


def known_everywhere(dc: DevCluster, node: str, token: str) -> bool:
    with token_channel(dc, node, token) as ch:
        try:
            pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=MODULE, group=0), timeout=5)
        except grpc.RpcError as e:
            return e.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    return True


def token_channel(dc: DevCluster, node: str, token: str) -> grpc.Channel:
    with Metastore(dc.hosts) as ms:
        info = ms.nodes.get(node)
    assert info is not None and info.token and info.token != info.address, "a TLS worker advertises a token port"
    creds = token_channel_credentials((dc.pki / certs.CA_CERT).read_bytes(), token)
    return grpc.secure_channel(info.token, creds, options=[("grpc.use_local_subchannel_pool", 1)])


def test_token_app_appends_and_queries_on_a_tls_cluster(dc: DevCluster) -> None:
    token, _ = token_for(dc, "tok-writer", "append", "query")
    ca = dc.pki / certs.CA_CERT
    with Cluster.connect(dc.hosts, token=token, ca=ca) as client:
        for i in range(5):
            assert client.depot(MODULE, "*clicks").append({"user": "tok", "id": f"t{i}"}, ack="applied") >= 0
        assert client.depot(MODULE, "*clicks").partition_info(0) is not None


def test_token_port_never_accepts_a_call_without_a_token(dc: DevCluster) -> None:
    leader, _ = leader_address(dc)
    with Metastore(dc.hosts) as ms:
        info = ms.nodes.get(leader)
    assert info is not None
    ca = (dc.pki / certs.CA_CERT).read_bytes()
    with grpc.secure_channel(info.token, grpc.ssl_channel_credentials(root_certificates=ca)) as ch, \
            pytest.raises(grpc.RpcError) as e:
        pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=MODULE, group=0), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in (e.value.details() or "")


def test_wrong_or_revoked_token_is_refused_with_a_typed_error(dc: DevCluster) -> None:
    token, token_id = token_for(dc, "tok-revoked", "append", "query")
    ca = dc.pki / certs.CA_CERT
    wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with Cluster.connect(dc.hosts, token=wrong, ca=ca, timeout_s=10) as client, \
            pytest.raises(Unauthenticated) as refused:
        client.depot(MODULE, "*clicks").append({"user": "tok", "id": "wrong"}, ack="applied")
    assert wrong not in str(refused.value) and token not in str(refused.value)
    with Cluster.connect(dc.hosts, token=token, ca=ca, timeout_s=10) as client:
        client.depot(MODULE, "*clicks").append({"user": "tok", "id": "before-revoke"}, ack="applied")
        leader, _ = leader_address(dc)
        before = log_end(dc, leader)
        with Metastore(dc.hosts, zk_auth=dc.zk_principal()) as ms:
            ms.tokens.revoke(token_id)

        def refused_now() -> bool:
            try:
                client.depot(MODULE, "*clicks").append({"user": "tok", "id": "after-revoke"}, ack="applied")
            except Unauthenticated:
                return True
            return False
        wait_for(refused_now, 20, "the revoked token to be refused")
    # (appends made before the watch fired may have landed; none after the refusal)
    assert log_end(dc, leader) >= before


def test_token_app_is_refused_deploy(dc: DevCluster, tmp_path: Path) -> None:
    """A token app granted append and query: PutArtifact and Prepare are PERMISSION_DENIED (deploy), as is Ping."""
    token, _ = token_for(dc, "tok-deployer", "append", "query")
    leader, _ = leader_address(dc)
    with token_channel(dc, leader, token) as ch:
        stub = codeg.CodeStub(ch)
        chunk = code_pb2.ArtifactChunk(sha256="0" * 64, size=3, data=b"abc")
        with pytest.raises(grpc.RpcError) as put:
            stub.PutArtifact(iter([chunk]), timeout=10)
        with pytest.raises(grpc.RpcError) as prepare:
            stub.Prepare(code_pb2.PrepareRequest(module=MODULE, module_ref="x:Y", sha256="0" * 64), timeout=10)
        with pytest.raises(grpc.RpcError) as ping:
            admin_pb2_grpc.AdminStub(ch).Ping(admin_pb2.PingRequest(), timeout=10)
    for err, permission in ((put, "deploy"), (prepare, "deploy"), (ping, "admin")):
        typed = error_from_rpc(err.value)
        assert isinstance(typed, PermissionDenied), typed
        assert "app/tok-deployer" in str(typed) and f"missing permission {permission!r}" in str(typed), typed
