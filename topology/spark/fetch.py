"""Fetching a planned partition (executor side): pipelined ``DepotRead`` calls straight to the planned leader."""

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

log = logging.getLogger("millrace.spark")


#: DepotRead requests a Spark task keeps in flight: enough to hide a round trip behind decoding
READ_WINDOW = 4


#: a Spark task's first DepotRead is this small, so decoding (and Spark) start while the big ones are read
FIRST_REQUEST_RECORDS = 4096


#: rows per Arrow batch handed to Spark (slices of a reply's batch)
ARROW_BATCH_ROWS = 8192


class Fetcher:
    """Reads the ranges of one Spark partition from their group's leader, several requests in flight.

    Offsets never change, so request boundaries are known before any reply
    comes back: up to ``READ_WINDOW`` requests travel while the caller
    decodes. A reply cut short by ``max_bytes`` is continued at once. Requests
    are strict (a start below the partition's start, trimmed, fails with
    OffsetOutOfRange rather than reading on from the start), and each reply is
    checked: it must not come from an epoch older than planned (a zombie
    leader), and one that makes no progress before ``end`` means the leader
    lost applied records (truncation); the first makes it look the leader up
    again, trims and truncations fail the read with DepotOffsetOutOfRange.

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

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()

    def _request(self, r: TaskRange) -> Any:
        p = self.p
        req = pb.DepotReadRequest(module=p.module, depot=p.depot, task=r.task, start=r.start, end=r.end,
                                  max_bytes=p.max_bytes, packed=True, strict=True)
        return client_stub(self.address, p.tls).DepotRead.future(req, timeout=RPC_TIMEOUT_S)

    def _relocate(self, why: Exception | str, deadline: float) -> None:
        p = self.p
        if time.monotonic() > deadline:
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

    def chunks(self) -> Iterator[tuple[int, int, int, Raw, np.ndarray | None]]:
        """(task, first offset, epoch, msgpack records, each record's offset or None: dense from the first) per
        reply with records, in plan order."""
        p = self.p
        deadline = time.monotonic() + RETRY_S
        todo: deque[TaskRange] = deque()
        size = min(p.records_per_request, FIRST_REQUEST_RECORDS)
        for r in p.ranges:
            s = r.start
            while s < r.end:
                todo.append(TaskRange(r.task, s, min(r.end, s + size), r.epoch))
                s += size
                size = p.records_per_request
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
                    if reply.epoch < self.min_epoch:
                        raise NotLeader(f"{p.module}/{p.group}", None, int(reply.epoch))
                except (grpc.RpcError, NotLeader) as exc:
                    err = error_from_rpc(exc) if isinstance(exc, grpc.RpcError) else exc
                    requeue(r)
                    if isinstance(err, DepotNotFound):
                        raise SourceOptionError(f"module {p.module} has no depot {p.depot!r} (any more)") from None
                    if isinstance(err, OffsetOutOfRange):  # trimmed below the planned start: names it, fails
                        self._check_range(r, None, deadline)
                        continue
                    if not retryable(err):
                        raise err from None
                    self._relocate(err, deadline)
                    continue
                raw = unpack_reply(reply)
                if not reply.offsets and len(raw) and reply.start != r.start:  # dense, yet not where asked
                    requeue(r)
                    self._check_range(r, reply, deadline)
                    continue
                offsets = self._offsets(r, reply, len(raw))
                if reply.next <= r.start:  # no progress before the planned end: truncated, or a stale leader
                    requeue(r)
                    self._check_range(r, reply, deadline)
                    continue
                self.min_epoch = max(self.min_epoch, int(reply.epoch))
                if len(raw):
                    yield r.task, int(reply.start), int(reply.epoch), raw, offsets
                deadline = time.monotonic() + RETRY_S  # progress: the retry budget is per stall, not per read
                if reply.next < r.end:  # cut by max_bytes: continue this range before the ones in flight
                    rest = TaskRange(r.task, int(reply.next), r.end, r.epoch)
                    pending.appendleft((rest, self._request(rest)))
        finally:
            for _r, f in pending:
                f.cancel()
            self.close()

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

    def _check_range(self, r: TaskRange, reply: Any, deadline: float) -> None:
        """An empty or misplaced reply: trimmed start or truncated end fails the read; anything else retries."""
        p = self.p
        try:
            st = self._status(r.task)
        except grpc.RpcError as e:
            self._relocate(error_from_rpc(e), deadline)
            return
        if st.start > r.start or st.end < r.end:
            validate_offsets(p.module, p.depot, {r.task: (r.start if st.start > r.start else r.end, r.epoch)},
                             {r.task: st})
        got = "OffsetOutOfRange" if reply is None else f"reply [{reply.start}, {reply.next}) at epoch {reply.epoch}"
        self._relocate(f"{got} for requested [{r.start}, {r.end}) while the partition holds [{st.start}, {st.end}) "
                       f"at epoch {st.epoch}", deadline)


def read_partition(p: DepotPartition, rows: RowBuilder) -> Iterator[pa.RecordBatch]:
    """The partition's records as Arrow batches of at most ``ARROW_BATCH_ROWS`` rows (zero-copy slices).

    Spark's task thread reads a batch from the Python worker only after it has
    processed the one before, so smaller batches keep it busy while this
    process decodes the next reply, and leave it less to do once we are done.
    """
    for task, first, epoch, raw, offsets in Fetcher(p).chunks():
        batch = rows.batch(task, first, epoch, raw, offsets)
        if batch.num_rows <= ARROW_BATCH_ROWS:
            yield batch
        else:
            for i in range(0, batch.num_rows, ARROW_BATCH_ROWS):
                yield batch.slice(i, ARROW_BATCH_ROWS)
