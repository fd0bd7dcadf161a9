"""A Millrace worker node: hosts task-group replicas and serves the client and replication RPCs.

Threads: the asyncio event loop runs gRPC (client API and replication
streams); every replica has its own task thread (:mod:`conductor.replica_host`);
kazoo runs its own threads and hands callbacks to the metastore dispatcher,
which forwards them to the task threads as events. Nothing but a task thread
touches a replica's replog or store.

Run as ``python -m conductor.node --zk HOST:PORT --node-id n1 --data-dir DIR``.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import concurrent.futures
import functools
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import msgpack
from prometheus_client import start_http_server

from conductor import placement
from conductor.far_horizon import (
    INSTALL_TIMEOUT_S,
    Catchup,
    CatchupProgress,
    CheckpointShelf,
    Shelved,
    read_chunk_into,
    replication_handler,
    stream_checkpoint,
)
from conductor.group_store import GroupStore
from conductor.metastore import MODULES_PATH, Metastore, MetastoreError, VersionConflict
from conductor.metrics import node_registry
from conductor.module_spec import SEGMENT_BYTES, ModuleSpec
from conductor.replica_host import PendingEntry, ReplicaHost
from conductor.transport import GRPC_OPTIONS, PeerTransport, from_proto
from conductor.wire_errors import error_json, status_of
from proto import admin_pb2, admin_pb2_grpc
from proto import millrace_pb2 as pb
from proto import millrace_pb2_grpc as pbg
from pstate.checkpoint import Manifest
from pstate.errors import PStateError
from replog.config import ReplicationConfig
from replog.errors import NotLeader, ReplogError
from replog.messages import (
    Ack,
    ConfigChanged,
    GroupState,
    IsrChanged,
    IsrChangeFailed,
    MetastoreChanged,
    ResignRequested,
    SessionExpired,
    SessionStarted,
)
from topology.module import ModuleDefinition, load_module
from topology.stream import StreamRunner, TopologyError

log = logging.getLogger("millrace.node")
VERSION = "0.1.0"

_ACKS = {pb.ACK_NONE: Ack.NONE, pb.ACK_APPEND: Ack.APPEND, pb.ACK_APPLIED: Ack.APPLIED}


def replog_state(st: placement.GroupState, version: int) -> GroupState:
    """The metastore's znode as the state machine sees it."""
    return GroupState(st.leader, st.epoch, tuple(st.isr), tuple(st.osr), version, st.leader_session)


def metastore_state(st: GroupState, replicas: tuple[str, ...]) -> placement.GroupState:
    return placement.GroupState(leader=st.leader, epoch=st.epoch, isr=st.isr, osr=st.osr, replicas=replicas,
                                leader_session=st.leader_session)


def replication_config(spec: ModuleSpec) -> ReplicationConfig:
    return ReplicationConfig(
        replication_factor=spec.replication_factor,
        min_isr=spec.option("replication.min.isr"),
        max_time_lag_ms=spec.option("replication.max.time.lag.millis"),
        append_timeout_ms=spec.option("replication.depot.append.timeout.millis"),
        max_near_sync_message_lag=spec.option("replication.max.near.sync.message.lag"),
    )


class ModuleRuntime:
    """What a node knows of one deployed module: its spec, its code's declarations, its local replicas."""

    def __init__(self, spec: ModuleSpec, definition: ModuleDefinition) -> None:
        self.spec = spec
        self.definition = definition
        self.hosts: dict[int, ReplicaHost] = {}
        self.stores: dict[int, GroupStore] = {}
        self.runners: dict[int, StreamRunner] = {}
        #: current leader of every group (hosted here or not), from metastore watches
        self.leaders: dict[int, str | None] = {}
        self.replicas: dict[int, tuple[str, ...]] = {}


class Node:
    def __init__(self, zk_hosts: str, node_id: str, data_dir: Path, port: int = 0,
                 session_timeout: float = 6.0, metrics_port: int = 0) -> None:
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.port = port
        self.zk_hosts = zk_hosts
        self.session_timeout = session_timeout
        self.metrics_port = metrics_port
        self.modules: dict[str, ModuleRuntime] = {}
        self._lock = threading.Lock()  # guards self.modules against metastore callbacks
        self._addresses: dict[str, str] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tasks: list[concurrent.futures.Future[None]] = []
        self._metrics_server: Any = None
        self.metrics_address = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metastore: Metastore | None = None
        self.transport: PeerTransport | None = None
        self.server: grpc.aio.Server | None = None
        self.settler: LoopSettler | None = None
        #: leader side of far-horizon catchup: checkpoints kept for followers' transfers
        self.shelf = CheckpointShelf(self.data_dir / "checkpoints")

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.settler = LoopSettler(self.loop)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        admin_pb2_grpc.add_AdminServicer_to_server(_AdminService(self), self.server)
        pbg.add_ClientServicer_to_server(_ClientService(self), self.server)
        self.server.add_generic_rpc_handlers((replication_handler(_ReplicationService(self)),))
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()
        self.transport = PeerTransport(self.node_id, self.loop, self._resolve,
                                       self._forget_address)
        self.metastore = Metastore(self.zk_hosts, session_timeout=self.session_timeout,
                                   step_down=self._on_session_lost)
        await asyncio.to_thread(self.metastore.start)
        self.metastore.add_state_listener(self._on_zk_state)
        await asyncio.to_thread(self.metastore.register_node, self.node_id, self.address)
        self.metastore.zk.ChildrenWatch(MODULES_PATH, self._on_modules)
        self.metrics_address = self._start_metrics()
        self._sweeper = asyncio.create_task(self._sweep_checkpoints())
        log.warning("node %s serving on %s (data %s, ZooKeeper %s, session 0x%x, metrics http://%s/metrics)",
                    self.node_id, self.address, self.data_dir, self.zk_hosts, self.session or 0,
                    self.metrics_address)

    def _start_metrics(self) -> str:
        """Prometheus endpoint on 127.0.0.1 (`--metrics-port`, 0 = a free port); its address goes in node.metrics."""
        server, _thread = start_http_server(self.metrics_port, addr="127.0.0.1",
                                            registry=node_registry(self.node_id, self._all_hosts))
        self._metrics_server = server
        address = f"127.0.0.1:{server.server_port}"
        (self.data_dir / "node.metrics").write_text(address)
        return address

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def session(self) -> int | None:
        return self.metastore.session_id if self.metastore else None

    async def _sweep_checkpoints(self) -> None:
        while True:
            await asyncio.sleep(30)
            await asyncio.to_thread(self.shelf.sweep)

    async def stop(self) -> None:
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
        self.shelf.close()
        if self.transport is not None:
            await self.transport.close()
        for ch in self._channels.values():
            await ch.close(grace=None)
        if self.server is not None:
            await self.server.stop(grace=0.5)

    # ------------------------------------------------------------------------------ metastore

    def _resolve(self, node_id: str) -> str | None:
        addr = self._addresses.get(node_id)
        if addr is None and self.metastore is not None:
            try:
                info = self.metastore.get_node(node_id)
            except MetastoreError:
                return None
            if info is not None:
                addr = self._addresses[node_id] = info.address
        return addr

    def _forget_address(self, node_id: str) -> None:
        """A stream to `node_id` broke: look its address up again (it may have restarted elsewhere)."""
        self._addresses.pop(node_id, None)

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
                except Exception:
                    log.exception("node %s could not open module %s; it stays unavailable here", self.node_id, m)

    def _open_module(self, module: str) -> None:
        assert self.metastore is not None
        try:
            spec, _ = self.metastore.get_module(module)
            groups = self.metastore.list_groups(module)
        except MetastoreError as e:
            log.info("module %s not readable yet (%s); waiting for its groups", module, e)
            return
        if len(groups) < spec.threads:
            # create_module is one transaction, so this means we raced its deletion
            return
        definition = load_module(spec.module_ref).build()
        rt = ModuleRuntime(spec, definition)
        config = replication_config(spec)
        for g, (st, _version) in sorted(groups.items()):
            rt.replicas[g] = tuple(st.replicas)
            rt.leaders[g] = st.leader
            if self.node_id not in st.replicas:
                continue
            rt.runners[g] = StreamRunner(definition, spec.tasks, spec.threads, g)
            gdir = self.data_dir / module / str(g)
            store = GroupStore.open(gdir / "state", definition)
            rt.stores[g] = store
            host = ReplicaHost(self.node_id, module, g, gdir, config, self.session or 0, store,
                               self._send, self._change_isr, hand_off=self._hand_off,
                               on_far_horizon=self._start_catchup, segment_bytes=spec.option(SEGMENT_BYTES))
            rt.hosts[g] = host
        with self._lock:
            self.modules[module] = rt
        for host in rt.hosts.values():
            host.start()
        for g in groups:
            self.metastore.watch_group(module, g, functools.partial(self._on_group, rt, g))
        self.metastore.watch_module(module, functools.partial(self._on_spec, rt))
        for g in rt.hosts:
            self.metastore.watch_resign(module, g, functools.partial(self._on_resign, rt, g))
        log.warning("node %s hosts %d replica(s) of module %s: groups %s", self.node_id, len(rt.hosts), module,
                    sorted(rt.hosts))

    def _on_spec(self, rt: ModuleRuntime, spec: ModuleSpec | None) -> None:
        """`conductor set-option`: hand the replicas the new replication options (they apply at once)."""
        if spec is None or spec.module_ref != rt.spec.module_ref:
            return  # deleted (the modules watch closes it), or redeployed as another module (reopened)
        config = replication_config(spec)
        if config == replication_config(rt.spec):
            return
        changed = {k: v for k, v in spec.effective_options().items() if rt.spec.effective_options().get(k) != v}
        rt.spec = spec
        log.warning("module %s options changed: %s; applying them to %d local replica(s)", spec.name,
                    ", ".join(f"{k}={v}" for k, v in sorted(changed.items())), len(rt.hosts))
        for host in rt.hosts.values():
            host.post(ConfigChanged(config))

    def _on_group(self, rt: ModuleRuntime, g: int, st: placement.GroupState | None, version: int) -> None:
        if st is None:
            return
        rt.leaders[g] = st.leader
        host = rt.hosts.get(g)
        if host is not None:
            host.post(MetastoreChanged(replog_state(st, version)))

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

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
        return ch

    def _close_module(self, module: str, delete_data: bool) -> None:
        with self._lock:
            rt = self.modules.pop(module, None)
        if rt is None:
            return
        for host in rt.hosts.values():
            host.stop()
        if delete_data:
            shutil.rmtree(self.data_dir / module, ignore_errors=True)
        log.warning("node %s closed module %s%s", self.node_id, module, " and deleted its data" if delete_data else "")

    def _change_isr(self, host: ReplicaHost, expected_version: int, new: GroupState) -> None:
        """ChangeIsr action: a CAS on the group znode; the outcome comes back as an event."""
        assert self.metastore is not None
        ms = self.metastore
        self._group_cas(host, new, "ISR change", f"ISR changed to {list(new.isr)} (OSR {list(new.osr)})",
                        lambda st: ms.cas_group(host.module, host.group, st, expected_version))

    def _hand_off(self, host: ReplicaHost, expected_version: int, new: GroupState) -> None:
        """HandOff action: the CAS to the successor plus the resign request's delete, in one transaction."""
        assert self.metastore is not None
        ms = self.metastore
        self._group_cas(host, new, "hand-off", f"handed leadership to {new.leader} in epoch {new.epoch}",
                        lambda st: ms.complete_resign(host.module, host.group, st, expected_version))

    def _group_cas(self, host: ReplicaHost, new: GroupState, what: str, done: str,
                   write: Callable[[placement.GroupState], int]) -> None:
        """Run a replica's group-znode CAS off its task thread (on the metastore's) and post the outcome back."""
        assert self.metastore is not None
        ms = self.metastore

        def run() -> None:
            rt = self.modules.get(host.module)
            replicas = rt.replicas[host.group] if rt else new.replicas
            try:
                version = write(metastore_state(new, replicas))
                assert version == new.version, (version, new.version)  # a CAS bumps the version by one
                host.post(IsrChanged(new))
                log.warning("%s: %s", host.name, done)
            except VersionConflict as e:
                cur = replog_state(e.current, e.current_version) if e.current is not None else None
                host.post(IsrChangeFailed("conflict", new, cur))
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

    def deliver(self, frame: pb.PeerFrame) -> None:
        if frame.dst != self.node_id:
            log.warning("dropped a replication frame for %s (this is %s)", frame.dst, self.node_id)
            return
        for m in frame.messages:
            host = self.host(m.module, m.group)
            if host is not None:
                host.post(from_proto(frame.src, self.node_id, m))

    def host(self, module: str, group: int) -> ReplicaHost | None:
        rt = self.modules.get(module)
        return rt.hosts.get(group) if rt else None

    def leader_host(self, module: str, group: int) -> ReplicaHost:
        """The local replica if it leads `group`; NotLeader (with where to go) otherwise."""
        host = self.host(module, group)
        if host is None:
            raise NotLeader(f"{module}/{group}", None, None)
        r = host.replica
        if not r.is_leader:
            retry = self._resolve(r.leader) if r.leader else None
            raise NotLeader(host.name, r.leader, r.epoch, retry_at=retry)
        return host


def _count_catchup(host: ReplicaHost, p: CatchupProgress) -> None:
    """A finished transfer's totals, for the node's metrics (its thread is the only writer of these keys)."""
    host.stats["far_horizon_bytes"] += p.copied_total
    host.stats["far_horizon_refetched_files"] += p.refetched


# ------------------------------------------------------------------------------------ services


def _lengths(records: list[bytes]) -> bytes:
    """Record lengths as the little-endian uint32 array of ``DepotReadReply.lengths``."""
    lengths = array.array("I", map(len, records))
    if sys.byteorder != "little":
        lengths.byteswap()
    return lengths.tobytes()


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    code, details, meta = status_of(exc)
    context.set_trailing_metadata(meta)
    await context.abort(code, details)


class _AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    async def Ping(self, request: admin_pb2.PingRequest, context: Any) -> admin_pb2.PingReply:
        return admin_pb2.PingReply(payload=request.payload, node_id=self.node.node_id, version=VERSION)


class _ReplicationService(pbg.ReplicationServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    async def Deliver(self, request_iterator: AsyncIterator[pb.PeerFrame], context: Any) -> pb.DeliverSummary:
        n = 0
        try:
            async for frame in request_iterator:
                self.node.deliver(frame)
                n += 1
        except asyncio.CancelledError:
            pass  # the node is stopping: peers reconnect to whoever leads next
        return pb.DeliverSummary(frames=n)

    async def FetchCheckpoint(self, request: pb.FetchCheckpointRequest,
                              context: Any) -> AsyncIterator[pb.CheckpointChunk | bytes]:
        node = self.node
        key = (request.module, request.group, request.follower)
        if request.release:
            node.shelf.release(key)
            return
        try:
            shelved = await asyncio.to_thread(node.checkpoint_round, request)
        except (ReplogError, PStateError, ValueError) as e:
            await _abort(context, e)
            return

        async def read_into(path: Path, offset: int, buf: bytearray) -> int:
            return await asyncio.to_thread(read_chunk_into, path, offset, buf)
        async for chunk in stream_checkpoint(shelved, list(request.have), read_into):
            yield chunk


class _ClientService(pbg.ClientServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    def _start_append(self, request: pb.AppendRequest) -> asyncio.Future[pb.AppendReply]:
        """Post `request` to its leader's task thread; the future gets the reply (or the error)."""
        node = self.node
        host = node.leader_host(request.module, request.group)
        rt = node.modules[request.module]
        appends = []
        nbytes = 0
        for d in request.appends:
            if rt.spec.group_of(d.task) != request.group:
                raise ValueError(f"task {d.task} of depot {d.depot} belongs to group {rt.spec.group_of(d.task)}, "
                                 f"not {request.group}; refresh the module metadata")
            records = list(d.records)
            nbytes += sum(map(len, records))
            appends.append((d.depot, d.task, records))
        fut: asyncio.Future[pb.AppendReply] = asyncio.get_running_loop().create_future()
        settle = node.settler.post if node.settler is not None else None
        assert settle is not None

        def done(first: int, result: Any, error: Exception | None) -> None:
            settle(_resolve, fut, first, result, error, host.replica.epoch)

        store = rt.stores[request.group]
        runner = rt.runners.get(request.group)
        host.post(PendingEntry(functools.partial(_client_entry, store, appends, runner), nbytes,
                               _ACKS.get(request.ack, Ack.APPEND), done))
        return fut

    async def _append(self, request: pb.AppendRequest) -> pb.AppendReply:
        return await self._start_append(request)

    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendReply:
        try:
            return await self._append(request)
        except (ReplogError, PStateError, TopologyError, ValueError) as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    async def AppendStream(self, request_iterator: AsyncIterator[pb.AppendRequest], context: Any) -> AsyncIterator[pb.AppendReply]:
        # Pipelined: every request is posted to its task thread as it is read (no task per request);
        # replies go out in request order (clients match by order).
        pending: asyncio.Queue[tuple[int, asyncio.Future[pb.AppendReply]] | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def reader() -> None:
            try:
                async for req in request_iterator:
                    try:
                        fut = self._start_append(req)
                    except (ReplogError, PStateError, TopologyError, ValueError) as e:
                        fut = loop.create_future()
                        fut.set_exception(e)
                    pending.put_nowait((req.seq, fut))
            finally:
                pending.put_nowait(None)

        rtask = asyncio.ensure_future(reader())
        try:
            while True:
                item = await pending.get()
                if item is None:
                    break
                seq, fut = item
                try:
                    reply = await fut
                    reply.seq = seq
                    yield reply
                except (ReplogError, PStateError, TopologyError, ValueError) as e:
                    yield pb.AppendReply(seq=seq, error=error_json(e))
            await rtask  # the request stream's own error, if any
        finally:
            rtask.cancel()

    def _leader_store(self, module: str, task: int) -> tuple[ReplicaHost, GroupStore]:
        """The store of the local leader of the group owning `task` (reads see applied state only)."""
        rt = self.node.modules.get(module)
        if rt is None:
            raise NotLeader(f"{module}/?", None, None)
        if not 0 <= task < rt.spec.tasks:
            raise ValueError(f"task {task} is outside [0, {rt.spec.tasks}) for module {module}")
        group = rt.spec.group_of(task)
        return self.node.leader_host(module, group), rt.stores[group]

    async def Select(self, request: pb.SelectRequest, context: Any) -> pb.SelectReply:
        try:
            _host, store = self._leader_store(request.module, request.task)
            values, applied = store.select(request.pstate, request.task, request.path, request.one)
            return pb.SelectReply(values=values, applied_offset=max(applied, 0))
        except (ReplogError, PStateError, ValueError) as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    async def DepotRead(self, request: pb.DepotReadRequest, context: Any) -> pb.DepotReadReply:
        try:
            host, store = self._leader_store(request.module, request.task)
            records, start, nxt = store.depot_read(request.depot, request.task, request.start,
                                                   request.end or None, request.max_bytes or 1 << 20)
            if request.packed:  # one bytes field instead of one per record: the reader slices it without copies
                return pb.DepotReadReply(packed=b"".join(records), lengths=_lengths(records), start=start, next=nxt,
                                         epoch=host.replica.epoch)
            return pb.DepotReadReply(records=records, start=start, next=nxt, epoch=host.replica.epoch)
        except (ReplogError, PStateError, ValueError) as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    async def PartitionInfo(self, request: pb.PartitionInfoRequest, context: Any) -> pb.PartitionInfoReply:
        try:
            host, store = self._leader_store(request.module, request.task)
            start, end = store.depot_info(request.depot, request.task)
            return pb.PartitionInfoReply(start=start, end=end, epoch=host.replica.epoch)
        except (ReplogError, PStateError, ValueError) as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    async def CommitBatch(self, request: pb.CommitBatchRequest, context: Any) -> pb.CommitBatchReply:
        """One task group's share of a Spark microbatch, applied once whatever the retries."""
        try:
            node = self.node
            host = node.leader_host(request.module, request.group)
            rt = node.modules[request.module]
            for c in request.changes:
                if rt.spec.group_of(c.task) != request.group:
                    raise ValueError(f"change for task {c.task} sent to group {request.group}; route by task")
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            settle = node.settler.post if node.settler is not None else None
            assert settle is not None

            def done(first: int, result: Any, error: Exception | None) -> None:
                settle(_settle, fut, (first, result), error)

            build = functools.partial(_commit_entry, rt.stores[request.group], request.topology, request.batch_id,
                                      list(request.changes))
            host.post(PendingEntry(build, request.ByteSize(), Ack.APPLIED, done))
            first, skipped = await fut
            return pb.CommitBatchReply(skipped=bool(skipped), replog_offset=max(first, 0))
        except (ReplogError, PStateError, ValueError) as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    async def Progress(self, request: pb.ProgressRequest, context: Any) -> pb.ProgressReply:
        try:
            self.node.leader_host(request.module, request.group)  # only the leader answers (NotLeader otherwise)
            last = self.node.modules[request.module].stores[request.group].store.last_batch(request.topology)
            return pb.ProgressReply(last_batch=-1 if last is None else last)
        except (ReplogError, PStateError, ValueError) as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e

    async def GroupStatus(self, request: pb.GroupStatusRequest, context: Any) -> pb.GroupStatusReply:
        host = self.node.host(request.module, request.group)
        if host is None:
            return pb.GroupStatusReply(role="none", apply_offset=-1, applied_offset=-1)
        s = host.status()
        c = s["catchup"]
        catchup = None if c is None else pb.CatchupStatus(
            leader=c.leader, round=c.round, bytes_done=c.bytes_done, bytes_total=c.bytes_total,
            bytes_per_s=c.rate(), state=c.state)
        return pb.GroupStatusReply(
            role=s["role"], epoch=s["epoch"], log_start=s["log_start"], log_end=s["log_end"],
            apply_offset=s["apply_offset"], applied_offset=s["applied"], follower_offsets=s["followers"],
            catchup=catchup,
        )


class LoopSettler:
    """Runs callbacks posted from task threads on the event loop, one loop wake-up per burst.

    A task thread answers a whole group of appends at once (one `done` per
    request); a ``call_soon_threadsafe`` each would cost a self-pipe write and a
    loop iteration per request. Here the first post of a burst schedules one
    drain and the others only append to the list.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._items.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the node is stopping, nobody awaits these
            pass

    def _drain(self) -> None:
        with self._lock:
            items = self._items
            self._items = deque()
            self._scheduled = False
        for fn, args in items:
            try:
                fn(*args)
            except Exception:
                log.exception("a completion callback failed")


def _resolve(fut: asyncio.Future[pb.AppendReply], first: int, result: Any, error: Exception | None,
             epoch: int) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        firsts, acks = result if isinstance(result, tuple) else ([], {})
        fut.set_result(pb.AppendReply(replog_offset=first, first_offsets=firsts, epoch=epoch,
                                      ack_values=msgpack.packb(acks, use_bin_type=True) if acks else b""))


def _settle(fut: asyncio.Future[Any], result: Any, error: Exception | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def _client_entry(store: GroupStore, appends: list[tuple[str, int, list[bytes]]],
                  runner: StreamRunner | None) -> tuple[Any, Any]:
    builder, firsts, acks = store.build_client_append(appends, runner)
    return builder, (firsts, acks)


def _commit_entry(store: GroupStore, topology: str, batch_id: int, changes: list[Any]) -> tuple[Any, Any]:
    builder = store.build_batch_commit(topology, batch_id, changes)
    return builder, builder is None


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m conductor.node", description="Run a Millrace worker node.")
    p.add_argument("--zk", required=True, help="ZooKeeper connect string, e.g. 127.0.0.1:2181")
    p.add_argument("--node-id", required=True)
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--port", type=int, default=0, help="gRPC port on 127.0.0.1 (0 = any free port)")
    p.add_argument("--session-timeout", type=float, default=6.0, help="ZooKeeper session timeout, seconds")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port on 127.0.0.1 (0 = free)")
    p.add_argument("--log-level", default=os.environ.get("MILLRACE_LOG_LEVEL", "WARNING"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {args.node_id} %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        node = Node(args.zk, args.node_id, args.data_dir, args.port, args.session_timeout, args.metrics_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await node.start()
        # Written last: tests and `conductor dev` wait for this file to know the node is serving.
        (args.data_dir / "node.address").write_text(node.address)
        await stop.wait()
        log.warning("node %s stopping", args.node_id)
        t0 = time.monotonic()
        await node.stop()
        log.warning("node %s stopped in %.1fs", args.node_id, time.monotonic() - t0)

    asyncio.run(run())


if __name__ == "__main__":
    main()
