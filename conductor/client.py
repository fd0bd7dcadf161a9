"""The Python client: append to depots and query PStates of a running Millrace cluster.

    cluster = Cluster.connect("127.0.0.1:2181")
    cluster.depot("WordCount", "*sentences").append("the cat sat", ack="applied")
    cluster.pstate("WordCount", "$$counts").select_one("cat")

The client reads module metadata from ZooKeeper (never data), routes each record
with the depot's own partitioner to the leader of the task group that owns its
task, and refreshes metadata and retries when a leader moves (``NotLeader``) or a
node is unreachable. Python pays per gRPC message, so appends are framed: every
record waiting for the same group goes out in one request, and ``append_many``
sends one request per group. A background thread runs the gRPC event loop; the
public methods block, or return futures with ``append_async``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgpack

from conductor.metastore import Metastore, MetastoreError
from conductor.module_spec import ModuleSpec
from conductor.placement import GroupState
from conductor.transport import GRPC_OPTIONS
from conductor.wire_errors import MillraceError, Unavailable, error_from_rpc
from proto import millrace_pb2 as pb
from proto import millrace_pb2_grpc as pbg
from replog.errors import Backpressure, NotLeader, StalledGroup
from topology.module import ModuleDefinition, load_module
from topology.partitioners import task_for_key

log = logging.getLogger("millrace.client")

ACKS = {"none": pb.ACK_NONE, "append": pb.ACK_APPEND, "applied": pb.ACK_APPLIED}


class ClientError(MillraceError):
    """Bad use of the client (unknown module, depot or ack level); the message says what exists."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_ARGUMENT", message)


def _ack(ack: str) -> int:
    try:
        return ACKS[ack]
    except KeyError:
        raise ClientError(f"ack must be one of {sorted(ACKS)}, got {ack!r}") from None


@dataclass(frozen=True)
class PartitionStatus:
    """A depot partition as its leader sees it: records in [start, end) are applied; `epoch` is the leader's."""

    start: int
    end: int
    epoch: int


@dataclass(frozen=True)
class DepotBatch:
    """Records [start, next) of one partition, read from the leader of `epoch` (KIP-320 style checks)."""

    records: list[Any]
    start: int
    next: int
    epoch: int


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    tasks: int
    groups: int
    depots: list[str]
    pstates: list[str]


@dataclass
class _ModuleMeta:
    spec: ModuleSpec
    definition: ModuleDefinition
    groups: dict[int, GroupState]
    fetched: float = field(default_factory=time.monotonic)


class Cluster:
    """A connection to one Millrace cluster (through its ZooKeeper)."""

    def __init__(self, zk_hosts: str, *, timeout_s: float = 45.0, linger_ms: float = 0.0,
                 max_batch_records: int = 10_000, max_inflight_per_group: int = 8) -> None:
        self.zk_hosts = zk_hosts
        self.timeout_s = timeout_s
        self.linger_ms = linger_ms
        self.max_batch_records = max_batch_records
        self.max_inflight_per_group = max_inflight_per_group
        self._ms = Metastore(zk_hosts, session_timeout=10.0)
        self._meta: dict[str, _ModuleMeta] = {}
        self._meta_lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="millrace-client", daemon=True)
        self._channels: dict[str, grpc.aio.Channel] = {}
        #: set (then replaced) when a group's leader changes, to abandon calls to the old leader
        self._leader_moved: dict[tuple[str, int], asyncio.Event] = {}
        self._batchers: dict[tuple[str, int], _GroupBatcher] = {}
        self._closed = False

    @classmethod
    def connect(cls, zk_hosts: str, **kwargs: Any) -> Cluster:
        """Connect to the cluster whose ZooKeeper is at `zk_hosts` ("host:port")."""
        c = cls(zk_hosts, **kwargs)
        try:
            c._ms.start()
        except MetastoreError as e:
            raise Unavailable("UNAVAILABLE", f"cannot reach ZooKeeper at {zk_hosts}: {e}") from e
        c._thread.start()
        return c

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            for ch in self._channels.values():
                await ch.close(grace=None)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._ms.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def depot(self, module: str, name: str) -> Depot:
        meta = self._module(module)
        if name not in meta.definition.depots:
            raise ClientError(f"module {module} has no depot {name!r}; its depots: {meta.definition.depot_names()}")
        return Depot(self, module, name)

    def pstate(self, module: str, name: str) -> PState:
        meta = self._module(module)
        if name not in meta.definition.pstates:
            raise ClientError(f"module {module} has no PState {name!r}; its PStates: {meta.definition.pstate_names()}")
        return PState(self, module, name)

    def modules(self) -> list[str]:
        return self._ms.list_modules()

    def module_info(self, module: str) -> ModuleInfo:
        meta = self._module(module)
        return ModuleInfo(module, meta.spec.tasks, meta.spec.threads, meta.definition.depot_names(),
                          meta.definition.pstate_names())

    # ------------------------------------------------------------------------------ metadata

    def _module(self, module: str, refresh: bool = False) -> _ModuleMeta:
        with self._meta_lock:
            meta = self._meta.get(module)
        if meta is not None and not refresh:
            return meta
        try:
            spec, _ = self._ms.get_module(module)
            groups = {g: st for g, (st, _v) in self._ms.list_groups(module).items()}
        except MetastoreError as e:
            known = self._ms.list_modules()
            raise ClientError(f"module {module!r} is not deployed ({e}); deployed modules: {known}") from e
        first = meta is None
        definition = meta.definition if meta is not None else load_module(spec.module_ref).build()
        meta = _ModuleMeta(spec, definition, groups)
        with self._meta_lock:
            self._meta[module] = meta
        if first:
            for g in groups:
                self._ms.watch_group(module, g, functools.partial(self._on_group, module, g))
        return meta

    def _on_group(self, module: str, group: int, st: GroupState | None, _version: int) -> None:
        """Metastore watch: a leader change abandons in-flight calls to the old leader at once."""
        with self._meta_lock:
            meta = self._meta.get(module)
            if meta is None or st is None:
                return
            old = meta.groups.get(group)
            meta.groups[group] = st
        if old is None or (old.leader, old.epoch) != (st.leader, st.epoch):
            self._loop.call_soon_threadsafe(self._signal_moved, module, group)

    def _signal_moved(self, module: str, group: int) -> None:
        ev = self._leader_moved.pop((module, group), None)
        if ev is not None:
            ev.set()

    def _leader_address(self, module: str, group: int, refresh: bool = False) -> str:
        meta = self._module(module, refresh)
        st = meta.groups[group]
        if st.leader is None:
            meta = self._module(module, True)
            st = meta.groups[group]
            if st.leader is None:
                raise Unavailable("UNAVAILABLE", f"task group {module}/{group} has no leader: no in-sync replica "
                                  f"of {list(st.isr)} is live; it resumes when one returns (see `conductor status`)")
        addr = None if refresh else self._addresses.get(st.leader)
        if addr is None:
            info = self._ms.get_node(st.leader)
            if info is None:
                raise Unavailable("UNAVAILABLE", f"leader {st.leader} of {module}/{group} is not registered")
            addr = self._addresses[st.leader] = info.address
        return addr

    def _stub(self, address: str) -> pbg.ClientStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
        return pbg.ClientStub(ch)

    def _run(self, coro: Any) -> Any:
        if self._closed:
            raise ClientError("the cluster client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _call(self, module: str, group: int, method: str, request: Any) -> Any:
        """One RPC to the group leader, following leader moves until `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        refresh = False
        delay = 0.02
        while True:
            try:
                address = await asyncio.to_thread(self._leader_address, module, group, refresh)
                stub = self._stub(address)
                moved = self._leader_moved.setdefault((module, group), asyncio.Event())
                call = getattr(stub, method)(request, timeout=max(0.1, deadline - time.monotonic()))
                rpc = asyncio.ensure_future(call)
                watch = asyncio.ensure_future(moved.wait())
                await asyncio.wait({rpc, watch}, return_when=asyncio.FIRST_COMPLETED)
                watch.cancel()
                if not rpc.done():
                    # The leader moved while we waited: it can no longer apply this (it is fenced by
                    # the new epoch), so ask the new leader. Delivery is at-least-once, like Kafka's.
                    call.cancel()
                    rpc.cancel()
                    raise NotLeader(f"{module}/{group}", None, None)
                return rpc.result()
            except grpc.RpcError as e:
                err = error_from_rpc(e)
            except (Unavailable, NotLeader) as e:
                err = e
            # StalledGroup is not retried: the leader already waited the append timeout for its ISR.
            if not isinstance(err, NotLeader | Unavailable) or time.monotonic() + delay > deadline:
                raise err
            log.debug("%s/%s: %s; refreshing metadata and retrying", module, group, err)
            refresh = True
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 2)


def _encode(record: Any) -> bytes:
    try:
        raw: bytes = msgpack.packb(record, use_bin_type=True)
        return raw
    except TypeError as e:
        raise ClientError(f"record {record!r} cannot be encoded: use str, int, float, bytes, bool, None, "
                          f"lists, tuples and dicts of those ({e})") from None


class _GroupBatcher:
    """Frames the records waiting for one task group into as few requests as possible.

    A request goes out at once when fewer than `max_inflight_per_group` are in
    flight; otherwise records wait and leave together with the next free slot,
    so batching grows exactly when the group is busy and costs no latency when
    it is idle (optionally plus `linger_ms`).
    """

    def __init__(self, cluster: Cluster, module: str, group: int) -> None:
        self.c = cluster
        self.module = module
        self.group = group
        self.waiting: dict[int, list[tuple[str, int, bytes, asyncio.Future[int]]]] = defaultdict(list)
        self.inflight = 0
        self.scheduled = False
        self.tasks: set[asyncio.Future[None]] = set()

    def add(self, ack: int, depot: str, task: int, data: bytes, fut: asyncio.Future[int]) -> None:
        self.waiting[ack].append((depot, task, data, fut))
        if not self.scheduled:
            self.scheduled = True
            loop = asyncio.get_running_loop()
            if self.c.linger_ms > 0:
                loop.call_later(self.c.linger_ms / 1000, self._pump)
            else:
                loop.call_soon(self._pump)

    def _pump(self) -> None:
        self.scheduled = False
        while self.waiting and self.inflight < self.c.max_inflight_per_group:
            ack = next(iter(self.waiting))
            items = self.waiting[ack][: self.c.max_batch_records]
            rest = self.waiting[ack][self.c.max_batch_records:]
            if rest:
                self.waiting[ack] = rest
            else:
                del self.waiting[ack]
            self.inflight += 1
            task = asyncio.ensure_future(self._send(ack, items))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, ack: int, items: list[tuple[str, int, bytes, asyncio.Future[int]]]) -> None:
        by_part: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, (depot, task, _d, _f) in enumerate(items):
            by_part[(depot, task)].append(i)
        parts = list(by_part.items())
        req = pb.AppendRequest(module=self.module, group=self.group, ack=ack, appends=[  # type: ignore[arg-type]
            pb.DepotRecords(depot=d, task=t, records=[items[i][2] for i in idx]) for (d, t), idx in parts])
        try:
            reply = await self.c._call(self.module, self.group, "Append", req)
            firsts = list(reply.first_offsets)
            for n, (_key, idx) in enumerate(parts):
                base = firsts[n] if n < len(firsts) else None
                for k, i in enumerate(idx):
                    fut = items[i][3]
                    if not fut.done():
                        fut.set_result(base + k if base is not None else -1)
        except Exception as e:
            for *_x, fut in items:
                if not fut.done():
                    fut.set_exception(e)
        finally:
            self.inflight -= 1
            if self.waiting and not self.scheduled:
                self.scheduled = True
                asyncio.get_running_loop().call_soon(self._pump)


class Depot:
    """Appends to and reads from one depot; records are routed by the depot's partitioner."""

    def __init__(self, cluster: Cluster, module: str, name: str) -> None:
        self.c = cluster
        self.module = module
        self.name = name

    def _route(self, record: Any) -> tuple[int, int]:
        meta = self.c._module(self.module)
        task = meta.definition.depots[self.name].partitioner(record, meta.spec.tasks)
        return task, meta.spec.group_of(task)

    def append_async(self, record: Any, ack: str = "applied") -> concurrent.futures.Future[int]:
        """Queue one record; the future yields its depot offset (ack="applied") or -1."""
        a = _ack(ack)
        data = _encode(record)
        task, group = self._route(record)

        async def go() -> int:
            key = (self.module, group)
            b = self.c._batchers.get(key)
            if b is None:
                b = self.c._batchers[key] = _GroupBatcher(self.c, self.module, group)
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            b.add(a, self.name, task, data, fut)
            return await fut

        fut: concurrent.futures.Future[int] = self.c._run(go())
        return fut

    def append(self, record: Any, ack: str = "applied") -> int:
        """Append one record and wait for `ack`; returns its depot offset when ack="applied"."""
        return self.append_async(record, ack).result(timeout=self.c.timeout_s + 5)

    def append_many(self, records: Sequence[Any] | Iterable[Any], ack: str = "applied") -> list[int]:
        """Append many records: one request per task group, sent in parallel; offsets in input order."""
        futs = [self.append_async(r, ack) for r in records]
        return [f.result(timeout=self.c.timeout_s + 5) for f in futs]

    def _group(self, task: int) -> int:
        meta = self.c._module(self.module)
        if not 0 <= task < meta.spec.tasks:
            raise ClientError(f"task {task} is outside [0, {meta.spec.tasks}) for module {self.module}")
        return meta.spec.group_of(task)

    def read_batch(self, task: int, start: int = 0, end: int | None = None, max_bytes: int = 1 << 20) -> DepotBatch:
        """Applied records of partition `task` from `start` (up to `end`, about `max_bytes`), with the epoch."""
        req = pb.DepotReadRequest(module=self.module, depot=self.name, task=task, start=start, end=end or 0,
                                  max_bytes=max_bytes)
        reply = self.c._run(self.c._call(self.module, self._group(task), "DepotRead", req)).result()
        records = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in reply.records]
        return DepotBatch(records, reply.start, reply.next, reply.epoch)

    def read(self, task: int, start: int = 0, end: int | None = None, max_bytes: int = 1 << 20) -> list[Any]:
        """Applied records of partition `task` in [start, end), at most about `max_bytes`."""
        return self.read_batch(task, start, end, max_bytes).records

    def partition_status(self, task: int) -> PartitionStatus:
        req = pb.PartitionInfoRequest(module=self.module, depot=self.name, task=task)
        reply = self.c._run(self.c._call(self.module, self._group(task), "PartitionInfo", req)).result()
        return PartitionStatus(reply.start, reply.end, reply.epoch)

    def partition_info(self, task: int) -> tuple[int, int]:
        """(start, end) offsets of partition `task`: records in [start, end) are applied and readable."""
        st = self.partition_status(task)
        return st.start, st.end


class PState:
    """Queries one PState; a path's first key picks the task (the one `hash_partition(key)` picks)."""

    def __init__(self, cluster: Cluster, module: str, name: str) -> None:
        self.c = cluster
        self.module = module
        self.name = name

    def _query(self, key: Any, path: Sequence[Any], one: bool, task: int | None) -> Any:
        from conductor.group_store import encode_query

        meta = self.c._module(self.module)
        if task is None:
            task = task_for_key(key, meta.spec.tasks)
        req = pb.SelectRequest(module=self.module, pstate=self.name, task=task, path=encode_query(key, path),
                               one=one)
        reply = self.c._run(self.c._call(self.module, meta.spec.group_of(task), "Select", req)).result()
        return msgpack.unpackb(reply.values, raw=False, strict_map_key=False)

    def select_one(self, key: Any, *path: Any, task: int | None = None) -> Any:
        """The single value at `key` (then `path` navigators), or None."""
        return self._query(key, path, True, task)

    def select(self, key: Any, *path: Any, task: int | None = None) -> list[Any]:
        """Every value `path` navigates to under `key`."""
        return list(self._query(key, path, False, task))

    def scan(self, task: int, start: Any = None, end: Any = None) -> list[tuple[Any, Any]]:
        """(key, value) pairs of a Map PState on `task` with start <= key < end (None = open), in key order."""
        from pstate import P

        pairs = self._query(P.sorted_range(start, end).all(), (), False, task)
        return [(k, v) for k, v in pairs]


__all__ = ["Backpressure", "ClientError", "Cluster", "Depot", "NotLeader", "PState", "StalledGroup"]
