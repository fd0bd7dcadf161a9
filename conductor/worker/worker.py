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
import concurrent.futures
import dataclasses
import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import start_http_server

from conductor.client.code import CodeCache, CodeUnavailable
from conductor.client.router import LeaderRouter
from conductor.metastore import MODULES_PATH, Metastore, MetastoreError, VersionConflict
from conductor.metastore.module_spec import SEGMENT_BYTES, ModuleSpec
from conductor.settings import Listen
from conductor.wire import admin_pb2, code_pb2
from conductor.wire import millrace_pb2 as pb
from conductor.wire.checked import checked_handler
from conductor.wire.errors import InvalidRequest, RefusedPeer
from conductor.wire.options import GRPC_OPTIONS
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
from conductor.worker.group_code import GroupCode
from conductor.worker.lifecycle import CodeLifecycle
from conductor.worker.metrics import node_registry
from conductor.worker.peer_server import PeerServer
from conductor.worker.recovery import ReplicaRecovery
from conductor.worker.replica_faults import describe, fault_kind
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.runtime import ModuleRuntime
from conductor.worker.services import AdminService, ClientService, LoopSettler, ReplicationService
from conductor.worker.task_thread import TaskThread
from conductor.worker.transport import PeerTransport, from_proto
from pstate.checkpoint import Manifest
from pstate.errors import CorruptStore, PStateError
from replog.errors import NotLeader, ReplicaFailed, ReplogError
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


class Worker(ReplicaRecovery):
    """One worker process: hosts task-group replicas, serves the client API and replication, follows ZooKeeper."""

    def __init__(self, zk_hosts: str, node_id: str, data_dir: Path, port: int = 0,
                 session_timeout: float = 6.0, metrics_port: int = 0, *, listen: Listen = Listen(),
                 metrics_listen: Listen | None = None, replication_port: int = 0, task_threads: int = 1) -> None:
        self.node_id = node_id
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
        self.peer_server = PeerServer(self.deliver)
        #: how many task threads the replicas share (0: a thread per replica); see conductor.worker.task_thread
        assert task_threads >= 0, task_threads
        self.task_threads = task_threads
        self._runners: list[TaskThread] = []
        self.modules: dict[str, ModuleRuntime] = {}
        self._lock = threading.Lock()  # guards self.modules against metastore callbacks
        self._tasks: list[concurrent.futures.Future[None]] = []
        self._metrics_server: Any = None
        self.metrics_address = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metastore: Metastore | None = None
        #: leaders of other groups (cross-group reads) and peers' addresses (replication)
        self.router: LeaderRouter | None = None
        self.transport: PeerTransport | None = None
        self.server: grpc.aio.Server | None = None
        self.settler: LoopSettler | None = None
        #: leader side of far-horizon catchup: checkpoints kept for followers' transfers
        self.shelf = CheckpointShelf(self.data_dir / "checkpoints")
        #: module code versions this worker runs and serves (module names start with a letter: no clash)
        self.code = CodeCache(self.data_dir / "_code")
        #: prepares code versions, has leaders switch to the spec's, paces PState migrations
        self.lifecycle = CodeLifecycle(self)
        #: when refused peer messages were last logged (see deliver)
        self._refusal_logged = -REFUSAL_LOG_S

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.settler = LoopSettler(self.loop)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        # every request body is checked: one that does not decode gets INVALID_ARGUMENT (conductor.wire.checked)
        self.server.add_generic_rpc_handlers((
            checked_handler(admin_pb2.DESCRIPTOR.services_by_name["Admin"], AdminService(self)),
            checked_handler(code_pb2.DESCRIPTOR.services_by_name["Code"], CodeService(self)),
            checked_handler(pb.DESCRIPTOR.services_by_name["Client"], ClientService(self)),
            replication_handler(ReplicationService(self)),
        ))
        try:
            bound = self.server.add_insecure_port(self.listen.bind(self.port))
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(f"node {self.node_id} cannot bind gRPC on {self.listen.bind(self.port)}: the address "
                          "is not on this machine or the port is taken (--host, --port)")
        self.port = bound
        await self.server.start()
        try:
            self.replication_port = await self.peer_server.start(self.listen.host, self.replication_port)
        except OSError as e:
            raise OSError(f"node {self.node_id} cannot bind replication on "
                          f"{self.listen.bind(self.replication_port)}: {e.strerror} (--host, --replication-port)"
                          ) from None
        self.metastore = Metastore(self.zk_hosts, session_timeout=self.session_timeout,
                                   step_down=self._on_session_lost)
        self.router = LeaderRouter(self.metastore)
        self.transport = PeerTransport(self.node_id, self.loop, self._resolve_peer, self.router.forget)
        await asyncio.to_thread(self.metastore.start)
        self.metastore.add_state_listener(self._on_zk_state)
        # a crashed predecessor's session may hold our id for up to its timeout (assumed to be ours)
        await asyncio.to_thread(functools.partial(self.metastore.nodes.register, self.node_id, self.address,
                                                  replication=self.replication_address, stale_wait_s=self.session_timeout * 1.5 + 2))
        self.metastore.zk.ChildrenWatch(MODULES_PATH, self._on_modules)
        self.lifecycle.start()
        self.metrics_address = self._start_metrics()
        await asyncio.to_thread(self.metastore.nodes.advertise_metrics, self.node_id, self.metrics_address)
        self._sweeper = asyncio.create_task(self._sweep_checkpoints())
        log.warning("node %s serving on %s (data %s, ZooKeeper %s, session 0x%x, metrics http://%s/metrics, %s)",
                    self.node_id, self.address, self.data_dir, self.zk_hosts, self.session or 0,
                    self.metrics_address, f"replicas share {self.task_threads} task thread(s)" if self.task_threads
                    else "a task thread per replica")

    def _start_metrics(self) -> str:
        """Prometheus endpoint on `--metrics-host` (`--metrics-port`, 0 = a free port); its advertised address
        goes in node.metrics."""
        server, _thread = start_http_server(self.metrics_port, addr=self.metrics_listen.host,
                                            registry=node_registry(self.node_id, self._all_hosts))
        self._metrics_server = server
        address = self.metrics_listen.advertised(server.server_port)
        (self.data_dir / "node.metrics").write_text(address)
        return address

    @property
    def address(self) -> str:
        """The gRPC address others reach this worker at (registered in ZooKeeper)."""
        return self.listen.advertised(self.port)

    @property
    def replication_address(self) -> str:
        """Where peers open replication links to this worker (registered in ZooKeeper beside `address`)."""
        return self.listen.advertised(self.replication_port)

    @property
    def session(self) -> int | None:
        return self.metastore.session_id if self.metastore else None

    async def _sweep_checkpoints(self) -> None:
        while True:
            await asyncio.sleep(30)
            await asyncio.to_thread(self.shelf.sweep)
            await asyncio.to_thread(self._sweep_code)

    def _sweep_code(self) -> None:
        """Delete code versions no deployed module keeps (a destroyed module's, a refused deploy's leftovers)."""
        assert self.metastore is not None
        try:
            keep = self.metastore.versions.referenced()
        except MetastoreError:
            return  # ZooKeeper is away: keep everything until we know
        for sha in self.code.sweep(keep, CODE_GRACE_S):
            log.warning("node %s deleted code version %s: no deployed module uses it", self.node_id, sha[:12])

    async def stop(self) -> None:
        self.lifecycle.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if getattr(self, "_sweeper", None) is not None:
            self._sweeper.cancel()
        for t in self._tasks:
            t.cancel()
        if self.metastore is not None:
            await asyncio.to_thread(self.metastore.close)
        with self._lock:
            runtimes = list(self.modules.values())
            self.modules.clear()
        for rt in runtimes:
            for host in rt.hosts.values():
                if host.catchup is not None:
                    host.catchup.stop()
                await asyncio.to_thread(host.stop)
        for runner in self._runners:
            runner.stop()
        self.shelf.close()
        if self.transport is not None:
            await self.transport.close()
        await self.peer_server.close()
        if self.server is not None:
            await self.server.stop(grace=0.5)

    # ------------------------------------------------------------------------------ metastore

    def _resolve(self, node_id: str) -> str | None:
        """A peer's address (None while unknown or ZooKeeper is unreachable: callers try again later)."""
        if self.router is None:
            return None
        try:
            return self.router.address(node_id)
        except MetastoreError:
            return None

    def _resolve_peer(self, node_id: str) -> str | None:
        """A peer's replication address, read from ZooKeeper (None while unknown or unreachable: try later).

        Called once per link (re)connection, off the event loop; a worker registered without one (an older
        version) cannot be replicated to.
        """
        if self.metastore is None:
            return None
        try:
            info = self.metastore.nodes.get(node_id)
        except MetastoreError:
            return None
        if info is None or not info.replication:
            return None
        return info.replication

    def _on_modules(self, names: list[str]) -> bool:
        """ChildrenWatch on /millrace/modules: open replicas of new modules, close destroyed ones."""
        assert self.metastore is not None
        self.metastore.submit(lambda: self._sync_modules(set(names)))
        return True

    def _sync_modules(self, names: set[str]) -> None:
        with self._lock:
            gone = [m for m in self.modules if m not in names]
        for m in gone:
            self._close_module(m, delete_data=True)
        for m in sorted(names):
            with self._lock:
                known = m in self.modules
            if not known:
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
        def again() -> None:
            if self.metastore is None or self.metastore.closed:
                return
            try:
                names = set(self.metastore.modules.names())
            except MetastoreError:
                names = {module}
            if module in names:
                self.metastore.submit(lambda: self._sync_modules(names))
        timer = threading.Timer(CODE_RETRY_S, again)
        timer.daemon = True
        timer.start()

    def _open_module(self, module: str) -> None:
        assert self.metastore is not None and self.router is not None
        try:
            routes = self.router.routes(module, refresh=True)  # also what cross-group reads route by
        except MetastoreError as e:
            log.info("module %s not readable yet (%s); waiting for its groups", module, e)
            return
        spec, groups = routes.spec, routes.groups
        if len(groups) < spec.threads:
            # modules.create is one transaction, so this means we raced its deletion
            return
        code = self.lifecycle.module_code(spec)
        code.get(spec.version)  # the version leaders switch to, loaded now (off the task threads)
        rt = ModuleRuntime(spec, code)
        unopened: dict[int, tuple[str, str]] = {}  # group -> (fault kind, reason)
        for g, st in sorted(groups.items()):
            rt.replicas[g] = tuple(st.replicas)
            if self.node_id in st.replicas:
                try:
                    rt.hosts[g] = self._open_replica(rt, g)
                except (OSError, PStateError, ReplogError) as e:  # one replica's disk: the others open
                    unopened[g] = (fault_kind(e), describe(e))
        with self._lock:
            self.modules[module] = rt
        for host in rt.hosts.values():
            host.start()
        for g in groups:
            self.metastore.groups.watch(module, g, functools.partial(self._on_group, rt, g))
        self.metastore.modules.watch(module, functools.partial(self._on_spec, rt))
        for g in [*rt.hosts, *unopened]:
            self.metastore.resigns.watch(module, g, functools.partial(self._on_resign, rt, g))
        for g, (kind, reason) in unopened.items():
            self._open_later(rt, g, kind, reason)
        log.warning("node %s hosts %d replica(s) of module %s: groups %s", self.node_id, len(rt.hosts), module,
                    sorted(rt.hosts))

    def _task_thread(self, name: str) -> TaskThread:
        """The task thread replica ``name`` will run on, claimed: the least loaded (started as replicas need
        them), or one dedicated to it (``task_threads`` 0), which ends with it."""
        if self.task_threads == 0:
            dedicated = TaskThread(f"task-{name}", dedicated=True)
            dedicated.claim()
            return dedicated
        with self._lock:
            if len(self._runners) < self.task_threads:
                self._runners.append(TaskThread(f"task-{self.node_id}-{len(self._runners)}"))
            chosen = min(self._runners, key=lambda r: r.load)
            chosen.claim()
            return chosen

    def _open_replica(self, rt: ModuleRuntime, g: int) -> ReplicaHost:
        """Open the local replica of group ``g`` from disk (store verified first) and its host, not started.

        Its store is defined by the code version its applied state is in; it
        switches where its replog says (``group_code``). A store that fails
        verification, or found by the open itself (damage done while the replica was
        down), is quarantined and the replica opens empty, to be rebuilt from the leader.
        """
        spec, module = rt.spec, rt.spec.name
        gdir = self.data_dir / module / str(g)

        def open_store() -> ReplicaStore:
            return ReplicaStore.open_versioned(gdir / "state", GroupCode(rt.code, spec.tasks, spec.threads, g))

        def open_verified() -> ReplicaStore:
            store = open_store()
            try:
                store.store.verify()
            except CorruptStore:
                store.abandon()
                raise
            return store

        try:
            store = open_verified()
        except CorruptStore as e:  # damage done while the replica was down, found opening or verifying
            self._quarantine(rt, g, describe(e))
            store = open_store()
        assert store.code is not None and store.code.runner is not None
        runner = rt.runners[g] = store.code.runner
        dataflow = None
        if runner.active or store.code.runner_of(spec.version).active:  # hops exist only where topologies run
            flow = GroupDataflow(store.current, runner)  # (a far-horizon install swaps the store object)
            store.code.flow = flow
            dataflow = DataflowDriver(f"{module}/{g}", flow, functools.partial(self._send_flow, module))
        task_thread = self._task_thread(f"{module}/{g}")
        try:
            host = ReplicaHost(self.node_id, module, g, gdir, rt.spec.replication_config(), self.session or 0,
                               store, self._send, self._change_isr, hand_off=self._hand_off,
                               on_far_horizon=self._start_catchup, segment_bytes=rt.spec.option(SEGMENT_BYTES),
                               dataflow=dataflow, on_fault=self._on_replica_fault, runner=task_thread)
        except BaseException:
            task_thread.release()
            store.abandon()  # (the replog could not open: a full disk, damage) the next try needs the lock
            raise
        rt.stores[g] = store
        host.last_fault = rt.faults.get(g)
        return host

    def _on_spec(self, rt: ModuleRuntime, spec: ModuleSpec | None) -> None:
        """`conductor set-option`: hand the replicas the new replication options (they apply at once);
        `conductor update`: switch to the version the spec names."""
        if spec is None or self.modules.get(spec.name) is not rt:
            return  # deleted (the modules watch closes it), or redeployed (reopened)
        old, rt.spec = rt.spec, spec
        if spec.version != rt.code.target:
            self.lifecycle.target(rt, spec)  # conductor update: leaders switch to the new version
        config = spec.replication_config()
        if config == old.replication_config():
            return
        changed = {k: v for k, v in spec.effective_options().items() if old.effective_options().get(k) != v}
        log.warning("module %s options changed: %s; applying them to %d local replica(s)", spec.name,
                    ", ".join(f"{k}={v}" for k, v in sorted(changed.items())), len(rt.hosts))
        for host in rt.hosts.values():
            host.post(ConfigChanged(config))

    def _on_group(self, rt: ModuleRuntime, g: int, st: GroupState | None, version: int) -> None:
        if st is None:
            return
        if self.router is not None:
            self.router.observe(rt.spec.name, g, st)
        host = rt.hosts.get(g)
        if host is not None:
            host.post(MetastoreChanged(st))

    def _on_resign(self, rt: ModuleRuntime, g: int, request: dict[str, Any] | None) -> None:
        """The conductor asks group ``g``'s leader to hand off; the replica decides whether the request applies."""
        host = rt.hosts.get(g)
        if request is None or host is None:
            return
        try:
            ev = ResignRequested(str(request["to"]), int(request["to_session"]), int(request["epoch"]))
        except (KeyError, TypeError, ValueError):
            log.error("%s: ignoring a malformed resign request %r", host.name, request)
            return
        host.post(ev)

    def _close_module(self, module: str, delete_data: bool) -> None:
        with self._lock:
            rt = self.modules.pop(module, None)
        if rt is None:
            return
        if self.router is not None:
            self.router.forget_module(module)
        for host in rt.hosts.values():
            host.stop()
        if delete_data:
            shutil.rmtree(self.data_dir / module, ignore_errors=True)
        log.warning("node %s closed module %s%s", self.node_id, module, " and deleted its data" if delete_data else "")

    def _change_isr(self, host: ReplicaHost, expected_version: int, new: GroupState) -> None:
        """ChangeIsr action: a CAS on the group znode; the outcome comes back as an event."""
        assert self.metastore is not None
        ms = self.metastore
        self._group_cas(host, new, "ISR change", f"ISR now {list(new.isr)} (OSR {list(new.osr)})",
                        lambda st: ms.groups.cas(host.module, host.group, st, expected_version))

    def _hand_off(self, host: ReplicaHost, expected_version: int, new: GroupState) -> None:
        """HandOff action: the CAS to the successor plus the resign request's delete, in one transaction."""
        assert self.metastore is not None
        ms = self.metastore
        self._group_cas(host, new, "hand-off", f"handed leadership to {new.leader} in epoch {new.epoch}",
                        lambda st: ms.resigns.complete(host.module, host.group, st, expected_version))

    def _group_cas(self, host: ReplicaHost, new: GroupState, what: str, done: str,
                   write: Callable[[GroupState], int]) -> None:
        """Run a replica's group-znode CAS off its task thread (on the metastore's) and post the outcome back."""
        assert self.metastore is not None
        ms = self.metastore

        def run() -> None:
            rt = self.modules.get(host.module)
            replicas = rt.replicas[host.group] if rt else new.replicas
            try:
                # The state machine proposes the ISR change without the placement order: keep the stored one.
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
        for host in self._all_hosts():
            host.post(SessionExpired())

    def _on_zk_state(self, state: str) -> None:
        if state == "CONNECTED" and self.metastore is not None:
            session = self.session or 0
            for host in self._all_hosts():
                if host.replica.session != session:
                    host.post(SessionStarted(session))

    def _all_hosts(self) -> list[ReplicaHost]:
        with self._lock:
            return [h for rt in self.modules.values() for h in rt.hosts.values()]

    # ------------------------------------------------------------------------------ far horizon

    def _start_catchup(self, host: ReplicaHost, leader: str, epoch: int) -> None:
        """Task thread of a follower the leader offered a checkpoint: fetch it in a transfer thread."""
        address = self._resolve(leader)
        if address is None:
            log.warning("%s: cannot find leader %s's address for far-horizon catchup; it will offer again",
                        host.name, leader)
            return

        def install(staging: Path, manifest: Manifest, pairs: list[tuple[int, int]]) -> str | None:
            done: concurrent.futures.Future[str | None] = concurrent.futures.Future()

            def run(h: ReplicaHost) -> None:
                try:
                    done.set_result(h.install_checkpoint(staging, manifest, pairs, leader, epoch))
                except Exception as e:
                    done.set_exception(e)
            host.post(run)
            return done.result(timeout=INSTALL_TIMEOUT_S)

        host.catchup = Catchup(host.name, host.module, host.group, self.node_id, leader, address, epoch,
                               host.dir / "far-horizon", host.config.max_near_sync_message_lag, install,
                               channel_options=GRPC_OPTIONS, on_done=functools.partial(_count_catchup, host))
        host.catchup.start()

    def checkpoint_round(self, request: pb.FetchCheckpointRequest) -> Shelved:
        """Leader, off the loop: a fresh checkpoint for this follower's round (NotLeader if we no longer lead)."""
        host = self.leader_host(request.module, request.group)
        if host.replica.epoch != request.epoch:
            raise NotLeader(host.name, host.replica.leader, host.replica.epoch)

        def make(directory: Path) -> Shelved:
            manifest, pairs, log_end = host.checkpoint_for_transfer(directory)
            return Shelved(directory, manifest, pairs, log_end)
        shelved = self.shelf.take((request.module, request.group, request.follower), make)
        log.info("%s: round for %s: checkpoint at offset %d, %d file(s), %.1f MB", host.name, request.follower,
                 shelved.manifest.applied_offset, len(shelved.manifest.files), shelved.manifest.total_bytes() / 1e6)
        return shelved

    # ------------------------------------------------------------------------------ transport

    def _send(self, module: str, group: int, msgs: list[tuple[str, Any]]) -> None:
        assert self.transport is not None
        self.transport.send_many(module, group, msgs)

    def _send_flow(self, module: str, group: int, node: str | None, msg: Pull | Batch) -> None:
        """A task thread's dataflow message for ``group``'s leader (``node`` when the pull said who it was).

        Not knowing the leader drops it: pulls repeat every second, and batches
        answer pulls. A message for a group led on this worker skips the network.
        """
        if node is None:
            node = self.router.cached_leader(module, group) if self.router is not None else None
            if node is None:
                return
        if node == self.node_id:
            host = self.host(module, group)
            if host is not None:
                host.post(Inflow(node, msg))
            return
        assert self.transport is not None
        self.transport.send_many(module, group, [(node, msg)])

    def deliver(self, frame: pb.PeerFrame) -> None:
        """Hand a peer's messages to their replicas; RefusedPeer / InvalidRequest for those that must not go.

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
        refused: Exception | None = None
        taken = 0
        for m in frame.messages:
            host = self.host(m.module, m.group)
            if host is None:
                continue
            if m.WhichOneof("body") in REPLICATION_BODIES:
                replicas = host.replicas
                if replicas is not None and frame.src not in replicas:
                    refused = RefusedPeer(frame.src, host.name, list(replicas))
                    continue
            try:
                event = from_proto(frame.src, self.node_id, m)
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

    def host(self, module: str, group: int) -> ReplicaHost | None:
        rt = self.modules.get(module)
        return rt.hosts.get(group) if rt else None

    def leader_host(self, module: str, group: int) -> ReplicaHost:
        """The local replica if it leads `group`; NotLeader (with where to go) otherwise."""
        host = self.host(module, group)
        if host is None:
            raise NotLeader(f"{module}/{group}", None, None)
        r = host.replica
        if host.fault is not None:
            raise ReplicaFailed(host.name, host.fault.kind, host.fault.reason)
        if not r.is_leader:
            retry = self._resolve(r.leader) if r.leader else None
            raise NotLeader(host.name, r.leader, r.epoch, retry_at=retry)
        return host


def _count_catchup(host: ReplicaHost, p: CatchupProgress) -> None:
    """A finished transfer's totals, for the node's metrics (its thread is the only writer of these keys)."""
    host.stats["far_horizon_bytes"] += p.copied_total
    host.stats["far_horizon_refetched_files"] += p.refetched
