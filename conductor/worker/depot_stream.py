"""The worker's side of ``DepotStream``: a Spark task's depot ranges pushed on one server stream as they are read.

A ``DepotRead`` call per slice of a range costs the reader a call each (session 13: 0.3 ms of CPU and
1.2-1.5 ms of wall a call, and a restart of gRPC's channel thread whenever no call is in flight); here the
whole of a Spark partition's ranges is one call, and the worker pushes reply after reply.

Bounded: the stream holds one reply. Its next read starts only once gRPC took the reply before (an async
generator's ``yield`` returns when the message was handed to the transport, within the reader's HTTP/2
flow-control window), so a reader that stops reading stops the reads, and a cancelled stream (the reader
went away) ends at that ``yield``. Every reply is read as a strict ``DepotRead`` is: from the group's local
leader at that moment (``NotLeader`` once leadership moved: the reader looks the leader up again and
opens a new stream where the last reply ended), and a start below the partition's start (trimmed) fails
the stream with ``OffsetOutOfRange``. A read that makes no progress before its range's end (the applied
end is below it: truncated records) is sent as it is and ends the stream: the reader checks the range
and fails with the truncation error, as with ``DepotRead``.

**Read-ahead** (``DepotPrefetch``, session 15; the source's ``readAhead`` option, off by default). On two
shared cores a Spark job over a depot is CPU-bound while its tasks read, and the leader's reads (the RocksDB
iterator, the packing: 0.05 CPU-s per 200,000 records) compete there with the Python workers' decoding and
Spark's JVM; meanwhile, on a quiet box, the ~100 ms in which Spark plans the stage after the source's
``partitions()`` leave a core idle (``bench.spark_timeline``; on a loaded one they do not, and the read-ahead
then delays Spark's planning as much as it shortens the read: docs/performance.md).
The planner then sends each partition's stream request ahead (:func:`topology.spark.fetch.prefetch`),
and the worker runs the very reads of that stream into a buffer then, one reply per turn of the event loop;
the stream with the same request takes the buffer and goes on live where it stopped. The buffer is bounded
(``PREFETCH_BYTES`` over all requests, ``PREFETCH_REQUESTS`` requests) and dropped when no stream claims it
within ``PREFETCH_TTL_S``. The replies were read as strict reads from the local leader; before serving them
the stream checks that each task's group is still led here in the same epoch and that no trim passed its
start, or else throws the buffer away and reads live (which then fails as a live read would).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest
from conductor.wire.packing import pack_lengths

#: records per reply when the request does not say (the Spark source's ``recordsPerRequest`` default)
DEFAULT_RECORDS = 8192
#: records per reply at most, whatever the request asks
MAX_RECORDS = 1 << 16
#: record bytes per reply at most (the most the source's ``maxBytesPerRequest`` may be; gRPC's limit is 64 MiB)
MAX_BYTES = 48 << 20
#: record bytes per reply when the request does not say (the source's ``maxBytesPerRequest`` default)
DEFAULT_BYTES = 16 << 20
#: record bytes read ahead for streams not opened yet, over all requests (then no more is read ahead)
PREFETCH_BYTES = 64 << 20
#: requests read ahead at once, at most
PREFETCH_REQUESTS = 64
#: a read-ahead that no stream claimed within this long is dropped
PREFETCH_TTL_S = 10.0

#: ``read(task, start, end, max_bytes)``: (records, first offset, next, offsets of a compacted partition or [],
#: the leader epoch it was read in); a strict ``DepotRead`` on the group's local leader, or its typed error
ReadFn = Callable[[int, int, int, int], tuple[list[bytes], int, int, list[int], int]]

#: ``holds(task, start, epoch)``: the task's group is still led here in ``epoch`` and no trim passed ``start``
HoldsFn = Callable[[int, int, int], bool]


def replies(request: pb.DepotStreamRequest, read: ReadFn) -> Iterator[pb.DepotStreamReply]:
    """Every record of ``request.ranges``, in order, as replies of at most ``records`` records and ``max_bytes``
    bytes (the first one ``first_records``): one read per reply, when the reply is asked for."""
    for r in request.ranges:
        if r.end < r.start:
            raise InvalidRequest("ranges", f"range of task {r.task} ends at {r.end}, before its start {r.start}")
    size = min(request.records or DEFAULT_RECORDS, MAX_RECORDS)
    first = min(request.first_records or size, size)
    max_bytes = min(request.max_bytes or DEFAULT_BYTES, MAX_BYTES)
    for r in request.ranges:
        at = r.start
        while at < r.end:
            records, start, nxt, offsets, epoch = read(r.task, at, min(r.end, at + first), max_bytes)
            first = size
            yield pb.DepotStreamReply(task=r.task, start=start, next=nxt, epoch=epoch, packed=b"".join(records),
                                      lengths=pack_lengths(records), offsets=offsets)
            if nxt <= at:  # no progress before the range's end: the reader checks the range
                return
            at = nxt


@dataclass
class _ReadAhead:
    """One request's replies read ahead, and the reads that follow them (the same generator, live)."""

    source: Iterator[pb.DepotStreamReply]
    expires: float
    buffered: deque[pb.DepotStreamReply] = field(default_factory=deque)
    size: int = 0
    #: a stream took it (or it expired): no more is read ahead
    taken: bool = False
    #: the read-ahead's task on the event loop (kept so that it is not collected while it runs)
    filling: asyncio.Task[None] | None = None


class DepotStreams:
    """Serves ``DepotStream`` and ``DepotPrefetch`` requests, on the event loop only; ``open`` counts the streams
    being served now, ``prefetched`` the replies served from a read-ahead since start."""

    def __init__(self) -> None:
        self.open = 0
        self.prefetched = 0
        self._ahead: dict[bytes, _ReadAhead] = {}
        self._ahead_bytes = 0

    async def serve(self, request: pb.DepotStreamRequest, read: ReadFn,
                    holds: HoldsFn | None = None) -> AsyncIterator[pb.DepotStreamReply]:
        """The request's replies (:func:`replies`): first those read ahead for it, if they still hold."""
        ahead = self._take(request, holds)
        source = replies(request, read) if ahead is None else ahead.source
        self.open += 1
        try:
            if ahead is not None:
                while ahead.buffered:
                    self.prefetched += 1
                    yield ahead.buffered.popleft()
            for reply in source:
                yield reply
        finally:
            self.open -= 1

    def prefetch(self, request: pb.DepotStreamRequest, read: ReadFn) -> bool:
        """Start reading the replies of a stream with this request ahead; False if it is read ahead already or
        the read-ahead is full."""
        self._expire()
        key = request.SerializeToString(deterministic=True)
        if key in self._ahead or len(self._ahead) >= PREFETCH_REQUESTS or self._ahead_bytes >= PREFETCH_BYTES:
            return False
        ahead = self._ahead[key] = _ReadAhead(replies(request, read), time.monotonic() + PREFETCH_TTL_S)
        loop = asyncio.get_running_loop()
        ahead.filling = loop.create_task(self._fill(key, ahead))
        loop.call_later(PREFETCH_TTL_S + 0.01, self._expire)  # unclaimed: its memory goes back even if nothing follows
        return True

    async def _fill(self, key: bytes, ahead: _ReadAhead) -> None:
        """Read one reply a turn of the event loop until a stream takes them, all are read or the buffer is full."""
        while not ahead.taken and self._ahead_bytes < PREFETCH_BYTES:
            try:
                reply = next(ahead.source)
            except StopIteration:
                return
            except Exception:
                self._drop(key)
                return
            ahead.buffered.append(reply)
            ahead.size += len(reply.packed)
            self._ahead_bytes += len(reply.packed)
            await asyncio.sleep(0)

    def _take(self, request: pb.DepotStreamRequest, holds: HoldsFn | None) -> _ReadAhead | None:
        """The read-ahead of this request, now the stream's, if its replies still hold (else it is dropped)."""
        self._expire()
        key = request.SerializeToString(deterministic=True)
        ahead = self._drop(key)
        if ahead is None:
            return None
        epochs = {r.task: r.epoch for r in reversed(ahead.buffered)}  # the epoch of each task's first reply
        if holds is not None and not all(holds(r.task, r.start, epochs[r.task])
                                         for r in request.ranges if r.task in epochs):
            return None
        return ahead

    def _drop(self, key: bytes) -> _ReadAhead | None:
        ahead = self._ahead.pop(key, None)
        if ahead is not None:
            ahead.taken = True
            self._ahead_bytes -= ahead.size
            assert self._ahead_bytes >= 0, self._ahead_bytes
        return ahead

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, a in self._ahead.items() if a.expires < now]:
            self._drop(key)
