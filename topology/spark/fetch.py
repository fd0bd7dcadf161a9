"""Fetching a planned partition (executor side): one ``DepotStream`` straight from the planned leader."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

from conductor.client.handles import PartitionStatus
from conductor.client.retry import retryable
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import error_from_rpc
from pstate.errors import DepotNotFound
from replog.errors import NotLeader, OffsetOutOfRange
from topology.spark.arrow import Raw, RowBuilder, unpack_reply
from topology.spark.errors import MillraceSourceError, SourceOptionError
from topology.spark.planning import (
    RETRY_S,
    RPC_TIMEOUT_S,
    DepotPartition,
    ModuleMeta,
    TaskRange,
    client_stub,
    validate_offsets,
)
from topology.spark.timeline import mark

log = logging.getLogger("millrace.spark")


#: DepotRead requests a Spark task keeps in flight (a worker without DepotStream): enough to hide a round trip
READ_WINDOW = 4


#: a Spark task's first reply is this small, so decoding (and Spark) start while the big ones are read
FIRST_REQUEST_RECORDS = 4096


#: rows per Arrow batch handed to Spark (slices of a reply's batch)
ARROW_BATCH_ROWS = 8192


#: (task, first offset, epoch, msgpack records, each record's offset or None: dense from the first)
Chunk = tuple[int, int, int, Raw, np.ndarray | None]


class Fetcher:
    """Reads the ranges of one Spark partition from their group's leader: one ``DepotStream`` call for them all.

    The leader pushes the ranges' records reply after reply, under gRPC's flow
    control (``conductor.worker.depot_stream``); a worker without the stream
    (UNIMPLEMENTED) is read with pipelined ``DepotRead`` calls instead, up to
    ``READ_WINDOW`` in flight (offsets never change, so request boundaries are
    known before any reply comes back). Reads are strict (a start below the
    partition's start, trimmed, fails with OffsetOutOfRange rather than reading
    on from the start), and each reply is checked: it must not come from an
    epoch older than planned (a zombie leader), and one that makes no progress
    before the range's end means the leader lost applied records (truncation);
    the first makes it look the leader up again and read on from the last
    reply (a new stream), trims and truncations fail the read with
    DepotOffsetOutOfRange.

    A key-compacted partition has gaps (pstate.compaction: deleted records
    keep their offsets free): its replies list each record's offset
    (``offsets``), may start past the requested start, and a stretch of gaps
    comes back empty with ``next`` past it. Those are read as they are; the
    rows carry the records' own offsets.
    """

    def __init__(self, p: DepotPartition) -> None:
        self.p = p
        self.address = p.address
        self.min_epoch = max((r.epoch for r in p.ranges), default=0)
        self._meta: ModuleMeta | None = None
        #: the ranges not read yet, the first one from where the last reply ended
        self.todo: deque[TaskRange] = deque(r for r in p.ranges if r.start < r.end)
        #: False once the leader answered UNIMPLEMENTED (a worker without DepotStream): DepotRead calls
        self.streams = True
        self._first = True
        self._deadline = time.monotonic() + RETRY_S

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()

    def _request(self, r: TaskRange) -> Any:
        p = self.p
        req = pb.DepotReadRequest(module=p.module, depot=p.depot, task=r.task, start=r.start, end=r.end,
                                  max_bytes=p.max_bytes, packed=True, strict=True)
        return client_stub(self.address, p.tls).DepotRead.future(req, timeout=RPC_TIMEOUT_S)

    def _relocate(self, why: Exception | str) -> None:
        p = self.p
        if time.monotonic() > self._deadline:
            cause = why if isinstance(why, Exception) else None
            raise MillraceSourceError(f"depot {p.module}/{p.depot} task group {p.group}: could not reach a serving "
                                      f"leader within {RETRY_S:.0f}s ({why}); check `conductor status`") from cause
        log.info("depot %s/%s group %d: %s; looking up the leader again", p.module, p.depot, p.group, why)
        time.sleep(0.1)
        if self._meta is None:
            self._meta = ModuleMeta(p.zk_hosts, p.module, tls=p.tls)
        else:
            self._meta.refresh()
        self.address, _ = self._meta.leader(p.group)

    def _status(self, task: int) -> PartitionStatus:
        r = client_stub(self.address, self.p.tls).PartitionInfo(
            pb.PartitionInfoRequest(module=self.p.module, depot=self.p.depot, task=task), timeout=RPC_TIMEOUT_S)
        return PartitionStatus(task, int(r.start), int(r.end), int(r.epoch))

    def chunks(self) -> Iterator[Chunk]:
        """(task, first offset, epoch, msgpack records, each record's offset or None: dense from the first) per
        reply with records, in plan order."""
        try:
            while self.todo:
                if self.streams:
                    yield from self._streamed()
                else:
                    yield from self._called()
        finally:
            self.close()

    def _checked(self, r: TaskRange, reply: Any) -> tuple[Raw, np.ndarray | None] | str:
        """A reply for ``r``: its records and their offsets, or what is wrong with it (the caller drops what it has
        in flight, then :meth:`_recover`)."""
        if reply.epoch < self.min_epoch:
            return "stale"
        raw = unpack_reply(reply)
        if not reply.offsets and len(raw) and reply.start != r.start:  # dense, yet not where asked
            return "misplaced"
        offsets = self._offsets(r, reply, len(raw))
        if reply.next <= r.start:  # no progress before the planned end: truncated, or a stale leader
            return "no progress"
        self.min_epoch = max(self.min_epoch, int(reply.epoch))
        self._deadline = time.monotonic() + RETRY_S  # progress: the retry budget is per stall, not per read
        return raw, offsets

    def _recover(self, r: TaskRange, reply: Any, why: str) -> None:
        if why == "stale":
            self._relocate(NotLeader(f"{self.p.module}/{self.p.group}", None, int(reply.epoch)))
        else:
            self._check_range(r, reply)

    def _failed(self, r: TaskRange, err: Exception) -> None:
        """A read of ``r`` failed with ``err``: fail the read (no depot, a trim, an error not worth retrying), or
        look the leader up again to read on."""
        if isinstance(err, DepotNotFound):
            raise SourceOptionError(f"module {self.p.module} has no depot {self.p.depot!r} (any more)") from None
        if isinstance(err, OffsetOutOfRange):  # trimmed below the planned start: names it, fails
            self._check_range(r, None)
            return
        if not retryable(err):
            raise err from None
        self._relocate(err)

    def _streamed(self) -> Iterator[Chunk]:
        """Read on from ``todo`` on one stream, until done, a failure (handled: the caller opens the next stream)
        or UNIMPLEMENTED (``streams`` turns False)."""
        p = self.p
        size = min(p.records_per_request, 0xFFFFFFFF)  # (a uint32; the node caps it further)
        first = min(size, FIRST_REQUEST_RECORDS) if self._first else size
        self._first = False
        req = pb.DepotStreamRequest(module=p.module, depot=p.depot, records=size,
                                    first_records=first, max_bytes=p.max_bytes,
                                    ranges=[pb.DepotRange(task=r.task, start=r.start, end=r.end) for r in self.todo])
        # as long as one call a request would have had, however slowly Spark takes the batches
        timeout = RPC_TIMEOUT_S * (1 + sum(r.end - r.start for r in self.todo) // max(1, p.records_per_request))
        call = client_stub(self.address, p.tls).DepotStream(req, timeout=timeout)
        mark("stream_open", p.group)
        try:
            for reply in call:
                mark("reply", len(reply.lengths) // 4)
                if not self.todo or reply.task != self.todo[0].task:
                    raise MillraceSourceError(f"depot {p.module}/{p.depot}: a DepotStream reply for task {reply.task} "
                                              f"while reading {self.todo[0] if self.todo else 'nothing'}; the node "
                                              "and this client disagree on the protocol")
                r = self.todo[0]
                got = self._checked(r, reply)
                if isinstance(got, str):
                    call.cancel()
                    self._recover(r, reply, got)
                    return
                raw, offsets = got
                if len(raw):
                    yield r.task, int(reply.start), int(reply.epoch), raw, offsets
                if reply.next < r.end:
                    self.todo[0] = TaskRange(r.task, int(reply.next), r.end, r.epoch)
                else:
                    self.todo.popleft()
            if self.todo:  # ended early without an error: the node stopped serving
                self._relocate(f"DepotStream ended before {self.todo[0]}")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.streams = False
            elif self.todo:
                self._failed(self.todo[0], error_from_rpc(exc))
        finally:
            call.cancel()

    def _called(self) -> Iterator[Chunk]:
        """Read all of ``todo`` with pipelined ``DepotRead`` calls (a worker without ``DepotStream``)."""
        p = self.p
        todo: deque[TaskRange] = deque()
        size = min(p.records_per_request, FIRST_REQUEST_RECORDS) if self._first else p.records_per_request
        self._first = False
        for r in self.todo:
            s = r.start
            while s < r.end:
                todo.append(TaskRange(r.task, s, min(r.end, s + size), r.epoch))
                s += size
                size = p.records_per_request
        self.todo.clear()
        pending: deque[tuple[TaskRange, Any]] = deque()

        def requeue(current: TaskRange) -> None:
            """Put the failed request and every one in flight back, in order, to send again."""
            back = [current, *(r for r, _f in pending)]
            for _r, f in pending:
                f.cancel()
            pending.clear()
            todo.extendleft(reversed(back))

        try:
            while todo or pending:
                while len(pending) < READ_WINDOW and todo:
                    r = todo.popleft()
                    pending.append((r, self._request(r)))
                r, fut = pending.popleft()
                try:
                    reply = fut.result()
                except grpc.RpcError as exc:
                    requeue(r)
                    self._failed(r, error_from_rpc(exc))
                    continue
                got = self._checked(r, reply)
                if isinstance(got, str):
                    requeue(r)
                    self._recover(r, reply, got)
                    continue
                raw, offsets = got
                if len(raw):
                    yield r.task, int(reply.start), int(reply.epoch), raw, offsets
                if reply.next < r.end:  # cut by max_bytes: continue this range before the ones in flight
                    rest = TaskRange(r.task, int(reply.next), r.end, r.epoch)
                    pending.appendleft((rest, self._request(rest)))
        finally:
            for _r, f in pending:
                f.cancel()

    def _offsets(self, r: TaskRange, reply: Any, got: int) -> np.ndarray | None:
        """A reply's record offsets (None: dense from ``reply.start``), checked against the request's range."""
        p = self.p
        where = f"depot {p.module}/{p.depot} partition {r.task}: reply for [{r.start}, {r.end})"
        if not reply.offsets:  # dense: exactly the records from the start asked for
            if got and reply.next != reply.start + got:
                raise MillraceSourceError(f"{where} holds {got} records but spans [{reply.start}, {reply.next})")
            return None
        offsets = np.array(reply.offsets, dtype=np.int64)
        if (len(offsets) != got or offsets[0] != reply.start or offsets[0] < r.start or offsets[-1] >= reply.next
                or reply.next > r.end or (len(offsets) > 1 and not (np.diff(offsets) > 0).all())):
            raise MillraceSourceError(f"{where} holds {got} records at offsets out of order or outside "
                                      f"[{r.start}, {reply.next})")
        return offsets

    def _check_range(self, r: TaskRange, reply: Any) -> None:
        """An empty or misplaced reply: trimmed start or truncated end fails the read; anything else retries."""
        p = self.p
        try:
            st = self._status(r.task)
        except grpc.RpcError as e:
            self._relocate(error_from_rpc(e))
            return
        if st.start > r.start or st.end < r.end:
            validate_offsets(p.module, p.depot, {r.task: (r.start if st.start > r.start else r.end, r.epoch)},
                             {r.task: st})
        got = "OffsetOutOfRange" if reply is None else f"reply [{reply.start}, {reply.next}) at epoch {reply.epoch}"
        self._relocate(f"{got} for requested [{r.start}, {r.end}) while the partition holds [{st.start}, {st.end}) "
                       f"at epoch {st.epoch}")


def read_partition(p: DepotPartition, rows: RowBuilder) -> Iterator[pa.RecordBatch]:
    """The partition's records as Arrow batches of at most ``ARROW_BATCH_ROWS`` rows (zero-copy slices).

    Spark's task thread reads a batch from the Python worker only after it has
    processed the one before, so smaller batches keep it busy while this
    process decodes the next reply, and leave it less to do once we are done.
    """
    mark("read_start", p.group)
    for task, first, epoch, raw, offsets in Fetcher(p).chunks():
        batch = rows.batch(task, first, epoch, raw, offsets)
        mark("decoded", batch.num_rows)
        if batch.num_rows <= ARROW_BATCH_ROWS:
            yield batch
        else:
            for i in range(0, batch.num_rows, ARROW_BATCH_ROWS):
                yield batch.slice(i, ARROW_BATCH_ROWS)
        mark("taken", p.group)  # Spark asked for the next batch
    mark("read_end", p.group)
