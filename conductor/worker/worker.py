"""The worker process (:class:`Worker`): hosts task-group replicas, follows ZooKeeper, serves gRPC.

Threads: the asyncio event loop runs gRPC (client API and replication
streams); every replica has its own task thread (:mod:`conductor.worker.replica_host`);
kazoo runs its own threads and hands callbacks to the metastore dispatcher,
which forwards them to the task threads as events. Nothing but a task thread
touches a replica's replog or store.

Run as ``python -m conductor.worker --zk HOST:PORT --node-id n1 --data-dir DIR [--host H --advertise A]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from conductor import __version__
from conductor.client.code import CodeCache, CodeUnavailable
from conductor.client.router import LeaderRouter
from conductor.metastore import MODULES_PATH, Metastore, MetastoreError, VersionConflict
from conductor.metastore.acls import AclCache
from conductor.metastore.module_spec import SEGMENT_BYTES, ModuleSpec
from conductor.metastore.tokens import TokenCache
from conductor.metastore.zk_auth import ZkPrincipal
from conductor.security.https import HttpsContexts, ViewGuard
from conductor.security.tls import TlsSource
from conductor.settings import Listen, is_loopback
from conductor.wire import admin_pb2, code_pb2
from conductor.wire import millrace_pb2 as pb
from conductor.wire.checked import checked_handler
from conductor.wire.errors import InvalidRequest, RefusedPeer
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.authorization import Authorizer
from conductor.worker.code_service import CodeService
from conductor.worker.dataflow import DataflowDriver, Inflow
from conductor.worker.far_horizon import (
    INSTALL_TIMEOUT_S,
    Catchup,
    CatchupProgress,
    CheckpointShelf,
    Shelved,
    replication_handler,
)
from conductor.worker.grpc_ports import bind_grpc_ports
from conductor.worker.hooks import WorkerHooks
from conductor.worker.hosted import HostedReplica
from conductor.worker.inbox import InstallCheckpoint
from conductor.worker.lifecycle import CodeLifecycle
from conductor.worker.membership import ReplicaMembership
from conductor.worker.metrics import node_registry
from conductor.worker.metrics_endpoint import MetricsEndpoint
from conductor.worker.peer_server import PeerServer
from conductor.worker.recovery import ReplicaRecovery
from conductor.worker.replica_faults import describe, fault_kind
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.restore_receiver import RestoreReceiver
from conductor.worker.retention import RetentionDriver
from conductor.worker.runtime import LocalModules, ModuleRuntime
from conductor.worker.services import AdminService, ClientService, LoopSettler, ReplicationService
from conductor.worker.store_swap import hand_over
from conductor.worker.task_thread import TaskThreadPool
from conductor.worker.transport import PeerTransport, from_proto
from pstate.checkpoint import Checked, Manifest
from pstate.errors import CorruptStore, PStateError
from replog.errors import NotLeader, ReplogError
from replog.messages import (
    ConfigChanged,
    GroupState,
    IsrChanged,
    IsrChangeFailed,
    MetastoreChanged,
    ResignRequested,
    SessionExpired,
    SessionStarted,
)
from topology.dataflow.group import Batch, GroupDataflow
from topology.dataflow.shipping import Pull
from topology.entries.port import EntryPort
from topology.group_code import GroupCode

log = logging.getLogger("millrace.node")

#: a code version no deployed module keeps is deleted after this long (a deploy in flight stores its version
#: on workers before the metastore names it)
CODE_GRACE_S = 600.0
#: peer message bodies of the replication protocol (only a group's replicas send these to each other)
REPLICATION_BODIES = frozenset({"replicate", "ack", "epoch_request", "epoch_response", "far_horizon"})
#: at most one log line per this many seconds about refused peer messages
REFUSAL_LOG_S = 10.0
#: seconds between attempts to open a module whose code no reachable worker could deliver yet
CODE_RETRY_S = 5.0


@dataclass(frozen=True)
class Running:
    """What a started worker has, built together by ``Worker.start`` (none of it exists before)."""

    loop: asyncio.AbstractEventLoop
    metastore: Metastore
    #: leaders of other groups (cross-group reads) and peers' addresses (replication)
    router: LeaderRouter
    transport: PeerTransport
    server: grpc.aio.Server
    settler: LoopSettler
    recovery: ReplicaRecovery
    #: prepares code versions, has leaders switch to the spec's, paces PState migrations
    lifecycle: CodeLifecycle
    #: opens the replicas a reassignment adds here
    membership: ReplicaMembership


class Worker:
    """One worker process: hosts task-group replicas, serves the client API and replication, follows ZooKeeper."""

    def __init__(self, zk_hosts: str, node_id: str, data_dir: Path, port: int = 0,
                 session_timeout: float = 6.0, metrics_port: int = 0, *, listen: Listen = Listen(),
                 metrics_listen: Listen | None = None, replication_port: int = 0, task_threads: int = 1,
                 hooks: WorkerHooks | None = None, tls: TlsSource | None = None, authorize: bool = False,
                 zk_auth: ZkPrincipal | None = None, token_port: int | None = None) -> None:
        self.node_id = node_id
        #: the second gRPC port, server-only TLS for apps with a bearer token (conductor.worker.grpc_ports); None: none
        self.token_port = token_port
        #: ZooKeeper digest credentials (--zk-auth): the znodes this worker creates are writable by them alone
        self.zk_auth = zk_auth
        #: this worker's certificate (mutual TLS on gRPC and the replication links); None: plaintext
        self.tls = tls
        #: check every gRPC call's identity against the module ACLs (conductor.worker.authorization); off only in
        #: the insecure development mode (no TLS, no tokens)
        self.authorizer = Authorizer(node_id) if authorize else None
        #: fault-injection seams a test's launcher passes (conductor.worker.hooks); none in production
        self.hooks = hooks or WorkerHooks()
        self.data_dir = Path(data_dir)
        self.port = port
        #: gRPC binds `listen.host` and registers `listen.advertise` in ZooKeeper (peers, clients, executors)
        self.listen = listen
        self.metrics_listen = metrics_listen or listen
        self.zk_hosts = zk_hosts
        self.session_timeout = session_timeout
        self.metrics_port = metrics_port
        #: peers' replication links arrive here (on `listen.host`; 0: a free port), registered in ZooKeeper
        self.replication_port = replication_port
        self.peer_server = PeerServer(self.deliver, tls.link_contexts() if tls is not None else None)
        #: the task threads the replicas share (0: a thread per replica); see conductor.worker.task_thread
        self.task_threads = TaskThreadPool(node_id, task_threads)
        #: the modules open here and their local replicas
        self.modules = LocalModules(self._resolve)
        self._metrics_server: MetricsEndpoint | None = None
        self._sweeper: asyncio.Task[None] | None = None
        #: depot retention checks and giving trimmed space back (conductor.worker.retention)
        self.retention = RetentionDriver(self.modules)
        self.metrics_address = ""
        self._running: Running | None = None
        #: leader side of far-horizon catchup: checkpoints kept for followers' transfers
        self.shelf = CheckpointShelf(self.data_dir / "checkpoints")
        #: module code versions this worker runs and serves (module names start with a letter: no clash)
        self.code = CodeCache(self.data_dir / "_code")
        #: when refused peer messages were last logged (see deliver)
        self._refusal_logged = -REFUSAL_LOG_S

    @property
    def running(self) -> Running:
        """What ``start`` built: everything that needs the event loop or ZooKeeper."""
        assert self._running is not None, f"node {self.node_id} is not started"
        return self._running

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.task_threads.wakes.bind(loop)  # posts made on the loop wake task threads once per iteration
        metastore = Metastore(self.zk_hosts, session_timeout=self.session_timeout, step_down=self._on_session_lost,
                              zk_auth=self.zk_auth)
        router = LeaderRouter(metastore)
        lifecycle = CodeLifecycle(self.node_id, self.code, metastore, self.modules, self._send_flow)
        settler = LoopSettler(loop)
        server = grpc.aio.server(options=GRPC_OPTIONS,
                                 interceptors=[self.authorizer] if self.authorizer is not None else None)
        # every request body is checked: one that does not decode gets INVALID_ARGUMENT (conductor.wire.checked)
        server.add_generic_rpc_handlers((
            checked_handler(admin_pb2.DESCRIPTOR.services_by_name["Admin"], AdminService(self.node_id)),
            checked_handler(code_pb2.DESCRIPTOR.services_by_name["Code"], CodeService(
                self.node_id, self.code, lifecycle.prepare, metastore.versions.referenced)),
            checked_handler(pb.DESCRIPTOR.services_by_name["Client"], ClientService(self.modules, settler.post)),
            # (who may copy a replica: the Authorizer's rule, against group_replicas)
            replication_handler(ReplicationService(self.shelf, self.checkpoint_round, self.hooks.chunk_sent,
                                                   RestoreReceiver(self.data_dir, self._module_exists).receive)),
        ))
        self._running = run = Running(
            loop, metastore, router, PeerTransport(self.node_id, loop, self._resolve_peer, router.forget,
                                                   self.peer_server.tls), server,
            settler, ReplicaRecovery(self.node_id, self.data_dir, metastore, self.modules, self.open_replica),
            lifecycle, ReplicaMembership(self.node_id, self.data_dir, metastore, self.modules, self.open_replica))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = bind_grpc_ports(server, self.node_id, self.listen, self.port, self.tls, self.token_port,
                                authorized=self.authorizer is not None)
        self.port, self.token_port = ports.main, ports.token
        await server.start()
        try:
            self.replication_port = await self.peer_server.start(self.listen.host, self.replication_port)
        except OSError as e:
            raise OSError(f"node {self.node_id} cannot bind replication on "
                          f"{self.listen.bind(self.replication_port)}: {e.strerror} (--host, --replication-port)"
                          ) from None
        await asyncio.to_thread(metastore.start)
        if self.authorizer is not None:  # before registering: no client finds us before permissions are known
            self.authorizer.attach(await asyncio.to_thread(AclCache, metastore.acls),
                                   await asyncio.to_thread(TokenCache, metastore.tokens), self.group_replicas)
        metastore.add_state_listener(self._on_zk_state)
        # a crashed predecessor's session may hold our id for up to its timeout (assumed to be ours)
        await asyncio.to_thread(functools.partial(metastore.nodes.register, self.node_id, self.address,
                                                  replication=self.replication_address, stale_wait_s=self.session_timeout * 1.5 + 2,
                                                  secure=self.tls is not None, token=self.token_address,
                                                  version=__version__))
        metastore.zk.ChildrenWatch(MODULES_PATH, self._on_modules)
        run.lifecycle.start()
        self.retention.start()
        self.metrics_address = self._start_metrics()
        await asyncio.to_thread(metastore.nodes.advertise_metrics, self.node_id, self.metrics_address)
        self._sweeper = asyncio.create_task(self._sweep_checkpoints())
        log.warning("node %s serving on %s, %s (data %s, ZooKeeper %s, session 0x%x, metrics %s://%s/metrics, %s)",
                    self.node_id, self.address, f"{self.security}, {self.authorization}", self.data_dir,
                    self.zk_hosts, self.session or 0, "https" if self.tls else "http", self.metrics_address,
                    f"replicas share {self.task_threads.size} task thread(s)"
                    if self.task_threads.size else "a task thread per replica")

    def _start_metrics(self) -> str:
        """Prometheus endpoint on `--metrics-host` (`--metrics-port`, 0 = a free port): HTTPS with the worker's
        certificate when it has TLS, scrapes authenticated like gRPC calls when it authorizes them
        (conductor.worker.metrics_endpoint); its advertised address goes in node.metrics."""
        checker = self.authorizer.checker if self.authorizer is not None else None
        guard = ViewGuard(lambda: checker.acls.acls, checker.tokens.verify) if checker is not None else None
        server = MetricsEndpoint(node_registry(self.node_id, self.modules.hosts), self.metrics_listen.host,
                                 self.metrics_port, HttpsContexts(self.tls).server() if self.tls else None,
                                 guard if self.tls else None)
        self._metrics_server = server
        address = self.metrics_listen.advertised(server.port)
        (self.data_dir / "node.metrics").write_text(address)
        return address

    @property
    def authorization(self) -> str:
        """Whether calls are checked, for the start line: off says so plainly."""
        if self.authorizer is None:
            return "authorization OFF (every caller may do everything)"
        return "authorization on (certificates and tokens checked against the module ACLs)"

    @property
    def security(self) -> str:
        """How the links are protected, for the start line (``python -m conductor.worker`` says INSECURE)."""
        if self.tls is not None:
            tokens = f", bearer tokens on {self.token_address}" if self.token_port is not None else ""
            return f"mutual TLS as {self.tls.identity}{tokens}"
        return "INSECURE: plaintext" if not is_loopback(self.listen.host) else "plaintext on loopback"

    @property
    def address(self) -> str:
        """The gRPC address others reach this worker at (registered in ZooKeeper)."""
        return self.listen.advertised(self.port)

    @property
    def token_address(self) -> str:
        """Where apps with a bearer token reach this worker (server-only TLS; "" when it serves no token port)."""
        return self.listen.advertised(self.token_port) if self.token_port is not None else ""

    @property
    def replication_address(self) -> str:
        """Where peers open replication links to this worker (registered in ZooKeeper beside `address`)."""
        return self.listen.advertised(self.replication_port)

    @property
    def session(self) -> int | None:
        return self.running.metastore.session_id

    async def _sweep_checkpoints(self) -> None:
        while True:
            await asyncio.sleep(30)
            await asyncio.to_thread(self.shelf.sweep)
            await asyncio.to_thread(self._sweep_code)

    def _sweep_code(self) -> None:
        """Delete code versions no deployed module keeps (a destroyed module's, a refused deploy's leftovers)."""
        try:
            keep = self.running.metastore.versions.referenced()
        except MetastoreError:
            return  # ZooKeeper is away: keep everything until we know
        for sha in self.code.sweep(keep, CODE_GRACE_S):
            log.warning("node %s deleted code version %s: no deployed module uses it", self.node_id, sha[:12])

    async def stop(self) -> None:
        run = self._running
        self.retention.stop()
        if run is not None:
            run.lifecycle.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.authorizer is not None:
            self.authorizer.close()
        if run is not None:
            await asyncio.to_thread(run.metastore.close)
        for rt in self.modules.clear():
            for host in rt.hosts().values():
                if host.catchup is not None:
                    host.catchup.stop()
                await asyncio.to_thread(host.stop)
        self.task_threads.stop()
        self.shelf.close()
        if run is not None:
            await run.transport.close()
        await self.peer_server.close()
        if run is not None:
            await run.server.stop(grace=0.5)

    # ------------------------------------------------------------------------------ metastore

    def _resolve(self, node_id: str) -> str | None:
        """A peer's address (None while unknown or ZooKeeper is unreachable: callers try again later)."""
        try:
            return self.running.router.address(node_id)
        except MetastoreError:
            return None

    def _resolve_peer(self, node_id: str) -> str | None:
        """A peer's replication address, read from ZooKeeper (None while unknown or unreachable: try later).

        Called once per link (re)connection, off the event loop; a worker registered without one (an older
        version) cannot be replicated to.
        """
        try:
            info = self.running.metastore.nodes.get(node_id)
        except MetastoreError:
            return None
        if info is None or not info.replication:
            return None
        return info.replication

    def _on_modules(self, names: list[str]) -> bool:
        """ChildrenWatch on /millrace/modules: open replicas of new modules, close destroyed ones."""
        # (keyed: only the newest list of modules matters, a waiting older one is replaced)
        self.running.metastore.submit(lambda: self._sync_modules(set(names)), key=MODULES_PATH)
        return True

    def _sync_modules(self, names: set[str]) -> None:
        gone = [m for m in self.modules.names() if m not in names]
        for m in gone:
            self._close_module(m, delete_data=True)
        for m in sorted(names):
            if m not in self.modules:
                try:
                    self._open_module(m)
                except CodeUnavailable as e:
                    log.warning("node %s cannot open module %s yet: %s; trying again in %.0fs", self.node_id, m, e,
                                CODE_RETRY_S)
                    self._retry_open(m)
                except Exception:
                    log.exception("node %s could not open module %s; it stays unavailable here", self.node_id, m)

    def _retry_open(self, module: str) -> None:
        """Open `module` again later (on the metastore's thread), unless it is gone or open by then."""
        ms = self.running.metastore

        def again() -> None:
            if ms.closed:
                return
            try:
                names = set(ms.modules.names())
            except MetastoreError:
                # ZooKeeper is away: look again later. Never sync on a guessed list: every module missing
                # from it would be closed and its data deleted.
                self._retry_open(module)
                return
            if module in names:
                ms.submit(lambda: self._sync_modules(names), key=MODULES_PATH)
        timer = threading.Timer(CODE_RETRY_S, again)
        timer.daemon = True
        timer.start()

    def _open_module(self, module: str) -> None:
        run = self.running
        try:
            routes = run.router.routes(module, refresh=True)  # also what cross-group reads route by
        except MetastoreError as e:
            log.info("module %s not readable yet (%s); waiting for its groups", module, e)
            return
        spec, groups = routes.spec, routes.groups
        if len(groups) < spec.threads:
            # modules.create is one transaction, so this means we raced its deletion
            return
        code = run.lifecycle.module_code(spec)
        code.get(spec.version)  # the version leaders switch to, loaded now (off the task threads)
        rt = ModuleRuntime(spec, code)
        run.membership.sweep_unlisted(module, groups)
        run.membership.sweep_stale_stores(module, groups)
        unopened: dict[int, tuple[str, str]] = {}  # group -> (fault kind, reason)
        for g, st in sorted(groups.items()):
            if self.node_id in st.replicas:
                rec = rt.hosted[g] = HostedReplica(module, g, tuple(st.replicas))
                try:
                    rec.host = self.open_replica(rt, rec)
                except (OSError, PStateError, ReplogError) as e:  # one replica's disk: the others open
                    unopened[g] = (fault_kind(e), describe(e))
        self.modules.add(rt)
        hosts = rt.hosts()
        for host in hosts.values():
            host.start()
        for g in groups:
            run.metastore.groups.watch(module, g, functools.partial(self._on_group, rt, g))
        run.metastore.modules.watch(module, functools.partial(self._on_spec, rt))
        for g in groups:  # (every group: a reassignment may add a replica here later)
            run.metastore.resigns.watch(module, g, functools.partial(self._on_resign, rt, g))
        for g, (kind, reason) in unopened.items():
            run.recovery.open_later(rt, rt.hosted[g], kind, reason)
        log.warning("node %s hosts %d replica(s) of module %s: groups %s", self.node_id, len(hosts), module,
                    sorted(hosts))

    def open_replica(self, rt: ModuleRuntime, rec: HostedReplica, *, defer_empty: bool = False) -> ReplicaHost:
        """Open the local replica ``rec`` from disk (store verified first) and its host, not started.

        Its store is defined by the code version its applied state is in; it switches where its replog says
        (``group_code``). A store that fails verification, or found by the open itself (damage done while the
        replica was down), is quarantined and the replica opens empty, to be rebuilt from the leader.
        ``defer_empty``: a store not on disk is created when first used (``ReplicaStore.deferred``).
        """
        run = self.running
        spec, module, g = rt.spec, rt.spec.name, rec.group
        gdir = self.data_dir / module / str(g)

        def open_store() -> ReplicaStore:
            code = GroupCode(rt.code, spec.tasks, spec.threads, g)
            return ReplicaStore.open_versioned(gdir / "state", code, defer_empty=defer_empty)

        def open_verified() -> ReplicaStore:
            store = open_store()
            try:
                store.verify()
            except CorruptStore:
                store.abandon()
                raise
            return store

        try:
            store = open_verified()
        except CorruptStore as e:  # damage done while the replica was down, found opening or verifying
            run.recovery.quarantine(rt, rec, describe(e))
            store = open_store()
        assert store.code is not None and store.code.runner is not None
        runner = store.code.runner
        dataflow = None
        if runner.active or store.code.runner_of(spec.version).active:  # hops exist only where topologies run
            flow = GroupDataflow(store.current, runner)  # (a far-horizon install swaps the store object)
            store.code.flow = flow
            dataflow = DataflowDriver(rec.name, flow, functools.partial(self._send_flow, module))
        task_thread = self.task_threads.claim(rec.name)
        try:
            host = ReplicaHost(self.node_id, module, g, gdir, rt.spec.replication_config(), self.session or 0,
                               store, self._send, self._change_isr, hand_off=self._hand_off,
                               on_far_horizon=self._start_catchup, segment_bytes=rt.spec.option(SEGMENT_BYTES),
                               dataflow=dataflow, on_fault=run.recovery.on_replica_fault, task_thread=task_thread,
                               entries=EntryPort(store.current, store.code), stats=rec.stats,
                               timings=rec.timings)
        except BaseException:
            task_thread.release()
            store.abandon()  # (the replog could not open: a full disk, damage) the next try needs the lock
            raise
        rec.store, rec.stream_runner = store, runner
        host.last_fault = rec.fault
        return host

    def _on_spec(self, rt: ModuleRuntime, spec: ModuleSpec | None) -> None:
        """`conductor set-option`: hand the replicas the new replication options (they apply at once);
        `conductor update`: switch to the version the spec names."""
        if spec is None or self.modules.get(spec.name) is not rt:
            return  # deleted (the modules watch closes it), or redeployed (reopened)
        old, rt.spec = rt.spec, spec
        if spec.version != rt.code.target:
            self.running.lifecycle.target(rt, spec)  # conductor update: leaders switch to the new version
        config = spec.replication_config()
        if config == old.replication_config():
            return
        changed = {k: v for k, v in spec.effective_options().items() if old.effective_options().get(k) != v}
        hosts = rt.hosts()
        log.warning("module %s options changed: %s; applying them to %d local replica(s)", spec.name,
                    ", ".join(f"{k}={v}" for k, v in sorted(changed.items())), len(hosts))
        for host in hosts.values():
            host.post(ConfigChanged(config))

    def _on_group(self, rt: ModuleRuntime, g: int, st: GroupState | None, version: int) -> None:
        if st is None:
            return
        self.running.router.observe(rt.spec.name, g, st)
        self.running.membership.on_group(rt, g, st)
        host = rt.host(g)
        if host is not None:
            host.post(MetastoreChanged(st))

    def _on_resign(self, rt: ModuleRuntime, g: int, request: dict[str, Any] | None) -> None:
        """The conductor asks group ``g``'s leader to hand off; the replica decides whether the request applies."""
        host = rt.host(g)
        if request is None or host is None:
            return
        try:
            ev = ResignRequested(str(request["to"]), int(request["to_session"]), int(request["epoch"]))
        except (KeyError, TypeError, ValueError):
            log.error("%s: ignoring a malformed resign request %r", host.name, request)
            return
        host.post(ev)

    def _close_module(self, module: str, delete_data: bool) -> None:
        rt = self.modules.pop(module)
        if rt is None:
            return
        self.running.router.forget_module(module)
        for host in rt.hosts().values():
            host.stop()
        if delete_data:
            shutil.rmtree(self.data_dir / module, ignore_errors=True)
        log.warning("node %s closed module %s%s", self.node_id, module, " and deleted its data" if delete_data else "")

    def _change_isr(self, host: ReplicaHost, expected_version: int, new: GroupState) -> None:
        """ChangeIsr action: a CAS on the group znode; the outcome comes back as an event."""
        ms = self.running.metastore
        self._group_cas(host, new, "ISR change", f"ISR now {list(new.isr)} (OSR {list(new.osr)})",
                        lambda st: ms.groups.cas(host.module, host.group, st, expected_version))

    def _hand_off(self, host: ReplicaHost, expected_version: int, new: GroupState) -> None:
        """HandOff action: the CAS to the successor plus the resign request's delete, in one transaction."""
        ms = self.running.metastore
        self._group_cas(host, new, "hand-off", f"handed leadership to {new.leader} in epoch {new.epoch}",
                        lambda st: ms.resigns.complete(host.module, host.group, st, expected_version))

    def _group_cas(self, host: ReplicaHost, new: GroupState, what: str, done: str,
                   write: Callable[[GroupState], int]) -> None:
        """Run a replica's group-znode CAS off its task thread (on the metastore's) and post the outcome back."""
        ms = self.running.metastore

        def run() -> None:
            rec = self.modules.hosted(host.module, host.group)
            # The state machine proposes the ISR change without the placement order: keep the stored one (of
            # the same replicas: a reassignment may have changed them since the proposal's znode).
            members = new.isr + new.osr
            known = [r for r in (rec.replicas if rec is not None else ()) if r in members]
            replicas = (*known, *(r for r in members if r not in known))
            try:
                version = write(dataclasses.replace(new, placement=replicas))
                assert version == new.version, (version, new.version)  # a CAS bumps the version by one
                host.post(IsrChanged(new))
                log.warning("%s: %s", host.name, done)
            except VersionConflict as e:
                host.post(IsrChangeFailed("conflict", new, e.current))
            except MetastoreError as e:
                log.warning("%s: %s failed: %s", host.name, what, e)
                host.post(IsrChangeFailed("session_expired" if not ms.connected else "conflict", new, None))

        ms.submit(run)

    def _on_session_lost(self) -> None:
        for host in self.modules.hosts():
            host.post(SessionExpired())

    def _on_zk_state(self, state: str) -> None:
        if state == "CONNECTED":
            session = self.session or 0
            for host in self.modules.hosts():
                if host.replica.session != session:
                    host.post(SessionStarted(session))

    def reopen_replica(self, module: str, group: int, discard_storage: bool, why: str) -> threading.Thread:
        """Close one replica and open it again from its directory (``ReplicaRecovery.reopen_replica``)."""
        return self.running.recovery.reopen_replica(module, group, discard_storage, why)

    # ------------------------------------------------------------------------------ far horizon

    def _start_catchup(self, host: ReplicaHost, leader: str, epoch: int) -> None:
        """Task thread of a follower the leader offered a checkpoint: fetch it in a transfer thread."""
        address = self._resolve(leader)
        if address is None:
            log.warning("%s: cannot find leader %s's address for far-horizon catchup; it will offer again",
                        host.name, leader)
            return

        def install(staging: Path, manifest: Manifest, pairs: list[tuple[int, int]], checked: Checked) -> str | None:
            prepared = host.store.prepare_install(staging, manifest, checked)  # (this thread: store_swap)
            return hand_over(prepared, lambda done: host.post(InstallCheckpoint(prepared, pairs, leader, epoch, done)),
                             INSTALL_TIMEOUT_S)

        host.catchup = Catchup(host.name, host.module, host.group, self.node_id, leader, address, epoch,
                               host.dir / "far-horizon", host.config.max_near_sync_message_lag, install,
                               channel_options=GRPC_OPTIONS, on_done=functools.partial(_count_catchup, host),
                               pacing=self.running.membership.copy_pacing(host.module, host.group))
        host.catchup.start()

    def _module_exists(self, module: str) -> bool:
        """Hosted here or deployed (blocking): a restore never writes into such a module (restore_receiver)."""
        return module in self.modules or module in self.running.metastore.modules.names()

    def group_replicas(self, module: str, group: int) -> tuple[str, ...] | None:
        """The replicas the group's znode names, as this worker's replica of it last learnt them (None: not
        hosted here); who may copy its checkpoint (conductor.worker.authorization)."""
        host = self.modules.host(module, group)
        return host.replicas if host is not None else None

    def checkpoint_round(self, request: pb.FetchCheckpointRequest) -> Shelved:
        """Leader, off the loop: a fresh checkpoint for this follower's round, or another follower's just made
        (CheckpointShelf.take); NotLeader if we no longer lead."""
        host = self.modules.leader(request.module, request.group).host
        if host.replica.epoch != request.epoch:
            raise NotLeader(host.name, host.replica.leader, host.replica.epoch)
        shelved = self.shelf.take((request.module, request.group, request.follower),
                                  lambda d: Shelved(d, *host.checkpoint_for_transfer(d)),
                                  lambda: host.replica.log_end, request.epoch)
        log.info("%s: round for %s: checkpoint at offset %d, %d file(s), %.1f MB", host.name, request.follower,
                 shelved.manifest.applied_offset, len(shelved.manifest.files), shelved.manifest.total_bytes() / 1e6)
        return shelved

    # ------------------------------------------------------------------------------ transport

    def _send(self, module: str, group: int, msgs: list[tuple[str, Any]]) -> None:
        self.running.transport.send_many(module, group, msgs)

    def _send_flow(self, module: str, group: int, node: str | None, msg: Pull | Batch) -> None:
        """A task thread's dataflow message for ``group``'s leader (``node`` when the pull said who it was).

        Not knowing the leader drops it: pulls repeat every second, and batches
        answer pulls. A message for a group led on this worker skips the network.
        """
        if node is None:
            node = self.running.router.cached_leader(module, group)
            if node is None:
                return
        if node == self.node_id:
            host = self.modules.host(module, group)
            if host is not None:
                host.post(Inflow(node, msg))
            return
        self.running.transport.send_many(module, group, [(node, msg)])

    def deliver(self, frame: pb.PeerFrame, sender: str | None = None) -> None:
        """Hand a peer's messages to their replicas; RefusedPeer / InvalidRequest for those that must not go.

        ``sender`` is the worker the link's certificate names (TLS; the link already
        refused a frame whose ``src`` differs), used instead of the self-declared
        ``frame.src``; None on a plaintext link.

        Replication messages are taken only from the group's replicas (an unknown
        node id, or one that is no longer a replica, is refused); the others of
        the frame still go. Dataflow messages come from other groups' leaders.
        A frame of which nothing was taken raises (its sender's stream ends with
        the status); one with some good messages only drops the others, so a
        peer's stream is never cut for the groups it does replicate.
        """
        if frame.dst != self.node_id:
            log.warning("dropped a replication frame for %s (this is %s)", frame.dst, self.node_id)
            return
        src = sender if sender is not None else frame.src
        refused: Exception | None = None
        taken = 0
        for m in frame.messages:
            host = self.modules.host(m.module, m.group)
            if host is None:
                continue
            if m.WhichOneof("body") in REPLICATION_BODIES:
                replicas = host.replicas
                if replicas is not None and src not in replicas:
                    refused = RefusedPeer(src, host.name, list(replicas))
                    continue
            try:
                event = from_proto(src, self.node_id, m)
            except ValueError as e:  # no body, or lengths that do not match the packed envelopes
                refused = InvalidRequest("peer message", str(e))
                continue
            host.post(event)
            taken += 1
        if refused is not None:
            now = time.monotonic()
            if now >= self._refusal_logged + REFUSAL_LOG_S:  # a misbehaving peer must not flood the log
                self._refusal_logged = now
                log.warning("node %s: %s", self.node_id, refused)
            if not taken:
                raise refused


def _count_catchup(host: ReplicaHost, p: CatchupProgress) -> None:
    """A finished transfer's totals, for the node's metrics (its thread is the only writer of these keys)."""
    host.stats["far_horizon_bytes"] += p.copied_total
    host.stats["far_horizon_refetched_files"] += p.refetched
    if host.timings is not None and p.copied_total:
        host.timings.transferred(p.copied_total, time.monotonic() - p.started)
