"""The worker's gRPC services: the client API, replication between workers, and admin.

Every RPC that can fail on bad input or a replication condition goes through
:func:`maps_errors`, the one place where a typed error becomes its gRPC status
(and the trailing metadata the client rebuilds the typed error from); streamed
appends carry the same errors in-band. Appends and batch commits are posted to
the replica's task thread; replies come back through a :class:`LoopSettler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar, cast

import grpc
import msgpack

from conductor import __version__
from conductor.wire import admin_pb2, admin_pb2_grpc
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import InvalidRequest, error_json, status_of
from conductor.worker.backup_folder import check_folder, folder_round
from conductor.worker.depot_stream import DepotStreams
from conductor.worker.far_horizon import CheckpointShelf, Shelved, served_chunk_bytes, stream_checkpoint
from conductor.worker.hooks import ChunkFilter
from conductor.worker.lifecycle import code_status
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.query_service import QueryService
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_status import replica_status
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.retention import depot_partitions
from conductor.worker.runtime import LocalModules
from conductor.worker.subscription_service import subscription_stream
from pstate.errors import CorruptStore, PStateError
from pstate.packed_records import PackedRecords
from replog.errors import EntryTooLarge, NotLeader, ReplogError
from replog.messages import Ack
from topology.entries.requests import BatchChange, BatchCommit, DepotAppend, DepotTrim
from topology.errors import TopologyError

log = logging.getLogger("millrace.node")
#: the installed Millrace version, in every Ping reply
VERSION = __version__

#: what a service answers with a typed gRPC status; anything else is a bug (INTERNAL)
SERVICE_ERRORS = (ReplogError, PStateError, TopologyError, ValueError)

#: requests an AppendStream reads and has not answered yet; the client's own pipelines stay far below
#: (append_async keeps max_inflight_per_group=8 requests out, a blocking append one per thread; the
#: benchmark's wire diagnostic about 340)
MAX_PIPELINED_APPENDS = 1024

_ACKS = {pb.ACK_NONE: Ack.NONE, pb.ACK_APPEND: Ack.APPEND, pb.ACK_APPLIED: Ack.APPLIED}

F = TypeVar("F", bound=Callable[..., Any])
#: receives one group's restored checkpoint (conductor.worker.restore_receiver.RestoreReceiver.receive)
RestoreFn = Callable[[AsyncIterator[pb.RestoreChunk]], Awaitable[pb.RestoreReply]]


def maps_errors(method: F) -> F:
    """Abort the RPC with the status of a :data:`SERVICE_ERRORS` error (unary and server-streaming methods)."""

    async def abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
        code, details, meta = status_of(exc)
        context.set_trailing_metadata(meta)
        await context.abort(code, details)

    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except SERVICE_ERRORS as e:
                await abort(context, e)

        return cast(F, stream)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except SERVICE_ERRORS as e:
            await abort(context, e)
            raise AssertionError("unreachable") from e

    return cast(F, unary)


@contextlib.contextmanager
def reports_damage(host: ReplicaHost) -> Iterator[None]:
    """A read that finds damaged data fails (CorruptStore, DATA_LOSS) and stops the replica: it is rebuilt.

    The reader sees a typed error, never partial data; the replica stops serving
    at once, gives up leadership and is rebuilt from an intact replica.
    """
    try:
        yield
    except CorruptStore as e:
        host.report(e)
        raise


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    async def Ping(self, request: admin_pb2.PingRequest, context: Any) -> admin_pb2.PingReply:
        return admin_pb2.PingReply(payload=request.payload, node_id=self.node_id, version=VERSION)


class ReplicationService(pbg.ReplicationServicer):
    """Far-horizon transfers: ``checkpoint_round`` makes a follower's checkpoint (off the loop), ``shelf`` keeps it;
    ``chunk_sent`` is a test launcher's hook on each data chunk (:class:`~conductor.worker.hooks.WorkerHooks`)."""

    def __init__(self, shelf: CheckpointShelf, checkpoint_round: Callable[[pb.FetchCheckpointRequest], Shelved],
                 chunk_sent: ChunkFilter | None = None, restore: RestoreFn | None = None) -> None:
        self.shelf = shelf
        self.checkpoint_round = checkpoint_round
        self.chunk_sent = chunk_sent
        #: conductor restore's receiver (conductor.worker.restore_receiver); None: refused
        self.restore = restore

    @maps_errors
    async def FetchCheckpoint(self, request: pb.FetchCheckpointRequest,
                              context: Any) -> AsyncIterator[pb.CheckpointChunk | bytes]:
        key = (request.module, request.group, request.follower)
        if request.release:  # (deleting the checkpoint's directory took 11-15 ms of the event loop)
            await asyncio.to_thread(self.shelf.release, key)
            return
        shelved = await asyncio.to_thread(self.checkpoint_round, request)
        async for chunk in stream_checkpoint(shelved, list(request.have), self.chunk_sent,
                                             served_chunk_bytes(request.chunk_bytes)):
            yield chunk

    # conductor backup: the same rounds, shelved under the backup's id (the interceptor's rule differs: admin)
    BackupCheckpoint = FetchCheckpoint

    @maps_errors
    async def BackupToFolder(self, request: pb.BackupToFolderRequest,
                             context: Any) -> AsyncIterator[pb.BackupToFolderProgress]:
        """conductor backup into a folder this worker sees: it copies the checkpoint's files there itself
        (conductor.worker.backup_folder; UNIMPLEMENTED when it may not: the CLI streams them instead)."""
        await asyncio.to_thread(check_folder, request)
        key = (request.module, request.group, f"backup-{request.backup}-{request.group}")
        shelved = await asyncio.to_thread(self.checkpoint_round, pb.FetchCheckpointRequest(
            module=request.module, group=request.group, follower=key[2], epoch=request.epoch))
        try:
            async for progress in folder_round(request, shelved):
                yield progress
        finally:
            self.shelf.release(key)

    @maps_errors
    async def RestoreCheckpoint(self, requests: AsyncIterator[pb.RestoreChunk], context: Any) -> pb.RestoreReply:
        if self.restore is None:
            raise InvalidRequest("RestoreCheckpoint", "this worker takes no restores")
        return await self.restore(requests)


class ClientService(pbg.ClientServicer):
    """The client API over the local replicas (``modules``); ``settle`` runs a completion on the event loop."""

    #: requests one AppendStream reads ahead of its replies (see AppendStream)
    max_pipelined = MAX_PIPELINED_APPENDS

    def __init__(self, modules: LocalModules, settle: Callable[..., None]) -> None:
        self.modules = modules
        self.settle = settle
        #: paged scans and query topologies (conductor/worker/query_service.py)
        self.queries = QueryService(modules, reports_damage)
        #: the Spark source's streamed depot reads (conductor/worker/depot_stream.py)
        self.depot_streams = DepotStreams()

    def _start_append(self, request: pb.AppendRequest) -> asyncio.Future[pb.AppendReply]:
        """Post `request` to its leader's task thread; the future gets the reply (or the error)."""
        received = time.perf_counter()
        ack = _ACKS.get(request.ack)
        if ack is None:  # a newer client's level, or garbage: never a weaker guarantee than asked for
            raise InvalidRequest("ack", f"unknown ack level {request.ack}; use ACK_NONE, ACK_APPEND or ACK_APPLIED")
        leader = self.modules.leader(request.module, request.group)
        host, spec = leader.host, leader.spec
        appends = []
        nbytes = 0
        for d in request.appends:
            if spec.group_of(d.task) != request.group:
                raise ValueError(f"task {d.task} of depot {d.depot} belongs to group {spec.group_of(d.task)}, "
                                 f"not {request.group}; refresh the module metadata")
            records = list(d.records)
            nbytes += sum(map(len, records))
            biggest = max(map(len, records), default=0)
            if biggest > host.config.max_record_bytes:  # refused before it reaches the task thread
                raise EntryTooLarge(host.name, "record", biggest, host.config.max_record_bytes)
            appends.append((d.depot, d.task, records))
        fut: asyncio.Future[pb.AppendReply] = asyncio.get_running_loop().create_future()
        settle = self.settle

        def done(first: int, result: Any, error: Exception | None) -> None:
            settle(_resolve, fut, first, result, error, host.replica.epoch)

        event_ms = request.timestamp_ms if request.HasField("timestamp_ms") else None  # None: the leader's clock
        host.post(PendingEntry(DepotAppend(appends, request.producer, request.sequence, event_ms), nbytes, ack, done,
                               received=received))
        return fut

    @maps_errors
    async def Append(self, request: pb.AppendRequest, context: Any) -> pb.AppendReply:
        return await self._start_append(request)

    async def AppendStream(self, request_iterator: AsyncIterator[pb.AppendRequest], context: Any) -> AsyncIterator[pb.AppendReply]:
        """Pipelined appends: every request is posted to its task thread as it is read (no task per request).

        Replies go out in request order (clients match by order). At most
        ``max_pipelined`` requests are read and not yet answered: past that the
        reader stops reading, so the next requests stay in gRPC's buffers and
        HTTP/2 flow control holds the client back; a fast pipelining client
        never grows this stream's queue.
        """
        bound = self.max_pipelined
        # (the end marker needs a slot of its own: it goes in however many replies are owed)
        pending: asyncio.Queue[tuple[int, asyncio.Future[pb.AppendReply]] | None] = asyncio.Queue(bound + 1)
        loop = asyncio.get_running_loop()
        requests = aiter(request_iterator)
        # Requests read and not answered, and what the reader waits on at the bound: a counter, not a
        # semaphore, so a request costs no acquire coroutine and no release wake-up below the bound.
        owed = 0
        room: asyncio.Future[None] | None = None

        async def reader() -> None:
            nonlocal owed, room
            try:
                while True:
                    if owed >= bound:
                        room = loop.create_future()
                        await room  # set when a reply went out
                    try:
                        req = await anext(requests)
                    except StopAsyncIteration:
                        break
                    owed += 1
                    try:
                        fut = self._start_append(req)
                    except SERVICE_ERRORS as e:
                        fut = loop.create_future()
                        fut.set_exception(e)
                    pending.put_nowait((req.seq, fut))  # (QueueFull here would be a bug: `room` bounds it)
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
                except SERVICE_ERRORS as e:
                    yield pb.AppendReply(seq=seq, error=error_json(e))
                owed -= 1
                if room is not None and not room.done():
                    room.set_result(None)
            await rtask  # the request stream's own error, if any
        finally:
            rtask.cancel()

    def _leader_store(self, module: str, task: int) -> tuple[ReplicaHost, ReplicaStore]:
        """The store of the local leader of the group owning `task` (reads see applied state only)."""
        rt = self.modules.get(module)
        if rt is None:
            raise NotLeader(f"{module}/?", None, None)
        if not 0 <= task < rt.spec.tasks:
            raise ValueError(f"task {task} is outside [0, {rt.spec.tasks}) for module {module}")
        leader = self.modules.leader(module, rt.spec.group_of(task))
        return leader.host, leader.store

    @maps_errors
    async def Select(self, request: pb.SelectRequest, context: Any) -> pb.SelectReply:
        host, store = self._leader_store(request.module, request.task)
        with reports_damage(host):
            values, applied = store.select(request.pstate, request.task, request.path, request.one,
                                           self.queries.resolve_fn(request.module))
        return pb.SelectReply(values=values, applied_offset=max(applied, 0))

    @maps_errors
    async def DepotRead(self, request: pb.DepotReadRequest, context: Any) -> pb.DepotReadReply:
        host, store = self._leader_store(request.module, request.task)
        with reports_damage(host):
            records, start, nxt, offsets = store.depot_read(request.depot, request.task, request.start,
                                                            request.end or None, request.max_bytes or 1 << 20,
                                                            request.strict)
        if request.packed:  # one bytes field instead of one per record: the reader slices it without copies
            reply = pb.DepotReadReply(packed=records.data, lengths=records.lengths, start=start, next=nxt,
                                      epoch=host.replica.epoch, offsets=offsets)
        else:
            reply = pb.DepotReadReply(records=records.split(), start=start, next=nxt, epoch=host.replica.epoch,
                                      offsets=offsets)
        if request.times:  # the records' times, as runs
            with reports_damage(host):
                runs = store.depot_times(request.depot, request.task, start, nxt)
            reply.time_offsets.extend(o for o, _t in runs)
            reply.time_ms.extend(t for _o, t in runs)
        return reply

    @maps_errors
    async def DepotStream(self, request: pb.DepotStreamRequest, context: Any) -> AsyncIterator[pb.DepotStreamReply]:
        """A Spark partition's ranges on one stream; each reply read as a strict, packed ``DepotRead``."""

        def read(task: int, start: int, end: int, max_bytes: int) -> tuple[PackedRecords, int, int, list[int], int]:
            host, store = self._leader_store(request.module, task)
            with reports_damage(host):
                records, first, nxt, offsets = store.depot_read(request.depot, task, start, end, max_bytes, True)
            return records, first, nxt, offsets, host.replica.epoch

        async for reply in self.depot_streams.serve(request, read):
            yield reply

    @maps_errors
    async def PartitionInfo(self, request: pb.PartitionInfoRequest, context: Any) -> pb.PartitionInfoReply:
        host, store = self._leader_store(request.module, request.task)
        with reports_damage(host):
            start, end = store.depot_info(request.depot, request.task)
            found = (store.depot_offset_for_time(request.depot, request.task, request.time_ms)
                     if request.HasField("time_ms") else None)
        reply = pb.PartitionInfoReply(start=start, end=end, epoch=host.replica.epoch)
        if found is not None:
            reply.offset_for_time = found
        return reply

    @maps_errors
    async def CommitBatch(self, request: pb.CommitBatchRequest, context: Any) -> pb.CommitBatchReply:
        """One task group's share of a Spark microbatch, applied once whatever the retries."""
        leader = self.modules.leader(request.module, request.group)
        host = leader.host
        for c in request.changes:
            if leader.spec.group_of(c.task) != request.group:
                raise ValueError(f"change for task {c.task} sent to group {request.group}; route by task")
            if len(c.value) > host.config.max_record_bytes:
                raise EntryTooLarge(host.name, "record", len(c.value), host.config.max_record_bytes)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        settle = self.settle

        def done(first: int, result: Any, error: Exception | None) -> None:
            settle(settle_future, fut, (first, result), error)

        changes = [BatchChange(c.target, c.task, c.key, c.op, c.value) for c in request.changes]
        host.post(PendingEntry(BatchCommit(request.topology, request.batch_id, changes), request.ByteSize(),
                               Ack.APPLIED, done, received=time.perf_counter()))
        first, skipped = await fut
        return pb.CommitBatchReply(skipped=bool(skipped), replog_offset=max(first, 0))

    @maps_errors
    async def Progress(self, request: pb.ProgressRequest, context: Any) -> pb.ProgressReply:
        leader = self.modules.leader(request.module, request.group)  # only the leader answers (NotLeader otherwise)
        last = leader.store.store.last_batch(request.topology)
        return pb.ProgressReply(last_batch=-1 if last is None else last)

    # ---- queries: paged scans and query topologies (conductor/worker/query_service.py)
    @maps_errors
    async def Scan(self, request: pb.ScanRequest, context: Any) -> pb.ScanReply:
        return await self.queries.scan(request)

    @maps_errors
    async def ScanStream(self, request: pb.ScanRequest, context: Any) -> AsyncIterator[pb.ScanReply]:
        async for reply in self.queries.scan_stream(request):
            yield reply

    @maps_errors
    async def QueryRun(self, request: pb.QueryRunRequest, context: Any) -> pb.QueryRunReply:
        return await self.queries.run(request)

    # ---- reactive subscriptions (conductor/worker/subscription_service.py)
    @maps_errors
    async def Subscribe(self, request: pb.SubscribeRequest, context: Any) -> AsyncIterator[pb.SubscribeEvents]:
        async for events in subscription_stream(self.modules, request, self.settle):
            yield events

    async def GroupStatus(self, request: pb.GroupStatusRequest, context: Any) -> pb.GroupStatusReply:
        rec = self.modules.hosted(request.module, request.group)
        host = rec.host if rec is not None else None
        if host is None:
            return pb.GroupStatusReply(role="none", apply_offset=-1, applied_offset=-1)
        s = replica_status(host)
        c = s["catchup"]
        catchup = None if c is None else pb.CatchupStatus(
            leader=c.leader, round=c.round, bytes_done=c.bytes_done, bytes_total=c.bytes_total,
            bytes_per_s=c.rate(), state=c.state)
        return pb.GroupStatusReply(
            role=s["role"], epoch=s["epoch"], log_start=s["log_start"], log_end=s["log_end"],
            apply_offset=s["apply_offset"], applied_offset=s["applied"], follower_offsets=s["followers"],
            catchup=catchup, fault=s["fault"].line() if s["fault"] is not None else "", **(s["dataflow"] or {}),
            **code_status(rec), depot_partitions=depot_partitions(rec),
            depot_bytes=self._depot_bytes(rec.store if rec else None),
        )

    @staticmethod
    def _depot_bytes(store: ReplicaStore | None) -> dict[str, int]:
        """GroupStatus's bytes of each depot's flushed data on this replica (its partitions come from retention)."""
        if store is None:
            return {}
        try:
            return store.depot_bytes()
        except PStateError:  # closed under us (a fault, a far-horizon install): the next status has them
            return {}

    @maps_errors
    async def DepotTrim(self, request: pb.DepotTrimRequest, context: Any) -> pb.DepotTrimReply:
        """Trim one depot partition below an offset: a replog entry, answered once applied."""
        host, _store = self._leader_store(request.module, request.task)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        settle = self.settle

        def done(first: int, result: Any, error: Exception | None) -> None:
            settle(settle_future, fut, result, error)

        host.post(PendingEntry(DepotTrim(request.depot, request.task, request.before), request.ByteSize(),
                                      Ack.APPLIED, done, received=time.perf_counter()))
        return pb.DepotTrimReply(start=int(await fut))


class LoopSettler:
    """Runs callbacks posted from task threads on the event loop, one loop wake-up per burst.

    A task thread answers a whole group of appends at once (one `done` per
    request); a ``call_soon_threadsafe`` each would cost a self-pipe write and a
    loop iteration per request. Here the first post of a burst schedules one
    drain and the others only append to the list.

    Bounded by the requests in flight, not by a limit of its own: each request
    posted to a task thread (a ``PendingEntry``) posts its ``done`` exactly once,
    so the list holds at most one callback per request in flight on this
    worker, which ``AppendStream`` caps per stream (``max_pipelined``) and a
    unary ``Append`` or ``CommitBatch`` at one per call. Blocking a task thread
    here instead would stall every replica on it behind the event loop.
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


def settle_future(fut: asyncio.Future[Any], result: Any, error: Exception | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
