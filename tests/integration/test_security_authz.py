"""Per-request authorization on a real worker: mutual TLS or a bearer token names the caller, the module ACLs
in a real ZooKeeper say what it may do, and a refused call changes nothing.

The worker runs in this process (its own event loop on a thread) with TLS server
credentials from conductor.security; clients are plain gRPC channels holding
certificates the test issued, so what is checked is exactly what an app sees.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import msgpack
import pytest

from conductor.controller import Conductor
from conductor.metastore import Metastore
from conductor.metastore.module_spec import ModuleSpec
from conductor.security import certs
from conductor.security.identity import Identity
from conductor.security.tls import TlsFiles, TlsSource
from conductor.security.tokens import generate
from conductor.wire import code_pb2
from conductor.wire import code_pb2_grpc as codeg
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.worker.worker import Worker
from replog.messages import GroupState
from tests.integration.cluster_helpers import wait_for
from topology.artifact import package_code

HOSTS = ["127.0.0.1", "localhost"]


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class InProcessWorker:
    """A Worker on its own event loop thread, started and stopped from the test's thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"worker-{worker.node_id}", daemon=True)

    def start(self) -> InProcessWorker:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.worker.start(), self.loop).result(60)
        return self

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.worker.stop(), self.loop).result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certs.init_ca_dir(tmp_path / "ca")
    return tmp_path / "ca"


def tls_of(pki: Path, who: Identity) -> TlsSource:
    certs.issue_to_dir(pki, who, hosts=HOSTS)
    return TlsSource(TlsFiles.in_dir(pki, who))


def start_worker(zk_hosts: str, root: Path, tls: TlsSource | None) -> InProcessWorker:
    node = tls.identity.name if tls is not None else unique("w")
    return InProcessWorker(Worker(zk_hosts, node, root / node, session_timeout=4.0, tls=tls,
                                  authorize=True)).start()


DEPOTS = """
from topology import Module


class {name}(Module):
    def define(self, m):
        m.depot("*raw")
"""


def deploy_here(zk_hosts: str, node: str, src: Path) -> str:
    """Deploy a module of a fresh name (its package on this process's path, under `src`): one task group, led by
    `node` alone; its name."""
    name = unique("Raw")
    (src / name.lower()).mkdir(parents=True)
    (src / name.lower() / "__init__.py").write_text(DEPOTS.format(name=name))
    if str(src) not in sys.path:  # (the in-process worker imports it when it opens the module)
        sys.path.insert(0, str(src))
    importlib.invalidate_caches()
    c = Conductor(zk_hosts, unique("test-deployer"))
    c.ms.start()
    try:
        spec = ModuleSpec(name=name, module_ref=f"{name.lower()}:{name}", tasks=2, threads=1, workers=1,
                          replication_factor=1)
        session = c.ms.nodes.sessions()[node]
        c.deploy(spec, {0: GroupState.initial([node], leader_session=session)})
    finally:
        c.ms.close()
    return name


def channel(address: str, tls: TlsSource) -> grpc.Channel:
    return grpc.secure_channel(address, tls.grpc_channel_credentials(), options=[("grpc.use_local_subchannel_pool", 1)])


def append(ch: grpc.Channel, module: str, user: str, metadata: list[tuple[str, str]] | None = None) -> pb.AppendReply:
    record = msgpack.packb({"user": user, "url": "/"})
    req = pb.AppendRequest(module=module, group=0, ack=pb.ACK_APPLIED,
                           appends=[pb.DepotRecords(depot="*raw", task=0, records=[record])])
    reply: pb.AppendReply = pbg.ClientStub(ch).Append(req, timeout=10, metadata=metadata)
    return reply


def depot_end(ch: grpc.Channel, module: str) -> int:
    info = pbg.ClientStub(ch).PartitionInfo(pb.PartitionInfoRequest(module=module, depot="*raw", task=0), timeout=10)
    return int(info.end)


def refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()  # type: ignore[operator]
    return e.value


@pytest.fixture
def ms(zk_hosts: str) -> Iterator[Metastore]:
    with Metastore(zk_hosts, session_timeout=4.0) as m:
        yield m


def test_append_needs_the_permission_and_a_grant_works_without_a_restart(zk_hosts: str, tmp_path: Path, pki: Path,
                                                                        ms: Metastore) -> None:
    worker_tls = tls_of(pki, Identity("worker", unique("w")))
    app, admin = Identity("app", unique("billing")), Identity("admin", unique("alice"))
    app_tls, admin_tls = tls_of(pki, app), tls_of(pki, admin)
    node = start_worker(zk_hosts, tmp_path, worker_tls)
    try:
        module = deploy_here(zk_hosts, worker_tls.identity.name, tmp_path / "src")
        address = node.worker.address
        with channel(address, app_tls) as app_ch, channel(address, admin_tls) as admin_ch:
            wait_for(lambda: _serves(admin_ch, module), 30, f"module {module} to be served")
            before = depot_end(admin_ch, module)

            # no permission: refused, naming the identity, the permission and the command that grants it
            e = refused(lambda: append(app_ch, module, "u1"))
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
            assert "'append'" in e.details() and str(app) in e.details() and "conductor acl grant" in e.details()
            # a stream too, refused at its first message, with nothing appended
            stream = pbg.ClientStub(app_ch).AppendStream(iter([pb.AppendRequest(
                module=module, group=0, ack=pb.ACK_APPLIED, seq=1,
                appends=[pb.DepotRecords(depot="*raw", task=0, records=[msgpack.packb({"user": "u"})])])]), timeout=10)
            e = refused(lambda: list(stream))
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'append'" in e.details()
            # reads need query, which the app lacks as well
            e = refused(lambda: depot_end(app_ch, module))
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'query'" in e.details()
            assert depot_end(admin_ch, module) == before  # nothing changed in the depot

            # granted: the cache's watch brings it to the worker; the same channel now succeeds
            ms.acls.grant(app, module, ["append"])
            wait_for(lambda: _appends(app_ch, module), 20, "the grant to reach the worker")
            assert depot_end(admin_ch, module) == before + 1
            # a stream checks once per module it names: every record goes through
            reqs = [pb.AppendRequest(module=module, group=0, ack=pb.ACK_APPLIED, seq=i,
                                     appends=[pb.DepotRecords(depot="*raw", task=0,
                                                              records=[msgpack.packb({"user": f"s{i}"})])])
                    for i in range(5)]
            replies = list(pbg.ClientStub(app_ch).AppendStream(iter(reqs), timeout=10))
            assert [r.error for r in replies] == [""] * 5
            assert depot_end(admin_ch, module) == before + 6

            # revoked: refused again, without a restart
            ms.acls.revoke(app, module, ["append"])
            wait_for(lambda: not _appends(app_ch, module), 20, "the revoke to reach the worker")
    finally:
        node.stop()


def _serves(ch: grpc.Channel, module: str) -> bool:
    try:
        depot_end(ch, module)
    except grpc.RpcError:
        return False
    return True


def _appends(ch: grpc.Channel, module: str) -> bool:
    try:
        append(ch, module, "u2")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        return False
    return True


def test_no_certificate_and_no_token_is_unauthenticated(zk_hosts: str, tmp_path: Path, pki: Path) -> None:
    """A plaintext worker with authorization on (tokens only): a call with nothing is UNAUTHENTICATED, a wrong
    token too, and a bearer token of an app with the grant works."""
    node = start_worker(zk_hosts, tmp_path, None)
    app = Identity("app", unique("notebook"))
    try:
        module = deploy_here(zk_hosts, node.worker.node_id, tmp_path / "src")
        with Metastore(zk_hosts, session_timeout=4.0) as ms, grpc.insecure_channel(node.worker.address) as ch:
            token, record = generate(app)
            ms.tokens.put(record)
            ms.acls.grant(app, module, ["append", "query"])
            bearer = [("authorization", f"Bearer {token}")]

            e = refused(lambda: append(ch, module, "u"))
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in e.details()
            wrong, _ = generate(app)
            e = refused(lambda: append(ch, module, "u", [("authorization", f"Bearer {wrong}")]))
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown or revoked" in e.details()
            assert wrong not in e.details() and token not in e.details()

            def token_appends() -> bool:
                try:
                    append(ch, module, "u", bearer)
                except grpc.RpcError as e:
                    assert e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.FAILED_PRECONDITION), e
                    return False
                return True
            wait_for(token_appends, 30, "the token app to append")
            ms.tokens.revoke(record.token_id)
            wait_for(lambda: not token_appends(), 20, "the revoked token to be refused")
    finally:
        node.stop()


MARKED = """
import pathlib

pathlib.Path({marker!r}).write_text("imported")

from pstate import Map
from topology import Module


class {name}(Module):
    def define(self, m):
        m.depot("*events")
        m.pstate("$$n", Map(str, int))
"""


def test_code_is_shipped_only_by_an_identity_with_deploy(zk_hosts: str, tmp_path: Path, pki: Path, ms: Metastore,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """PutArtifact and Prepare from an identity without deploy are refused before a byte is stored or imported."""
    package = unique("mr_marked_")
    marker = tmp_path / "imported.marker"
    (tmp_path / "src" / package).mkdir(parents=True)
    module = unique("Marked")
    (tmp_path / "src" / package / "__init__.py").write_text(MARKED.format(marker=str(marker), name=module))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    artifact = package_code(f"{package}:{module}")
    assert not marker.exists()  # packaging does not import it

    worker_tls = tls_of(pki, Identity("worker", unique("w")))
    app = Identity("app", unique("intruder"))
    app_tls = tls_of(pki, app)
    node = start_worker(zk_hosts, tmp_path, worker_tls)

    def put(ch: grpc.Channel) -> code_pb2.PutArtifactReply:
        chunks = [code_pb2.ArtifactChunk(sha256=artifact.sha256 if i == 0 else "", size=artifact.size, data=c)
                  for i, c in enumerate(artifact.chunks())]
        reply: code_pb2.PutArtifactReply = codeg.CodeStub(ch).PutArtifact(iter(chunks), timeout=20)
        return reply

    def prepare(ch: grpc.Channel) -> code_pb2.PrepareReply:
        reply: code_pb2.PrepareReply = codeg.CodeStub(ch).Prepare(code_pb2.PrepareRequest(
            module=module, module_ref=f"{package}:{module}", sha256=artifact.sha256, sources=[node.worker.address]),
            timeout=20)
        return reply

    try:
        with channel(node.worker.address, app_tls) as ch:
            e = refused(lambda: put(ch))
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'deploy'" in e.details(), e
            e = refused(lambda: prepare(ch))
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'deploy'" in e.details(), e
            assert not node.worker.code.has(artifact.sha256)  # not a byte stored
            assert not marker.exists()  # never imported
            sys.modules.pop(package, None)

            # with deploy on the module, the same identity ships it (the marker proves the import ran)
            ms.acls.grant(app, module, ["deploy"])
            wait_for(lambda: _puts(ch, put), 20, "the grant to reach the worker")
            assert node.worker.code.has(artifact.sha256)
            assert prepare(ch).ok
            assert marker.exists()
    finally:
        sys.modules.pop(package, None)
        node.stop()


def _puts(ch: grpc.Channel, put: object) -> bool:
    try:
        put(ch)  # type: ignore[operator]
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        return False
    return True
