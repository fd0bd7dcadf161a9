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
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest
from pstate.packed_records import PackedRecords

#: records per reply when the request does not say (the Spark source's ``recordsPerRequest`` default)
DEFAULT_RECORDS = 8192
#: records per reply at most, whatever the request asks
MAX_RECORDS = 1 << 16
#: record bytes per reply at most (the most the source's ``maxBytesPerRequest`` may be; gRPC's limit is 64 MiB)
MAX_BYTES = 48 << 20
#: record bytes per reply when the request does not say (the source's ``maxBytesPerRequest`` default)
DEFAULT_BYTES = 16 << 20

#: ``read(task, start, end, max_bytes)``: (records as stored, packed; first offset, next, offsets of a compacted partition or [],
#: the leader epoch it was read in); a strict ``DepotRead`` on the group's local leader, or its typed error
ReadFn = Callable[[int, int, int, int], tuple[PackedRecords, int, int, list[int], int]]


class DepotStreams:
    """Serves ``DepotStream`` requests; ``open`` counts the streams being served now (on the event loop only)."""

    def __init__(self) -> None:
        self.open = 0

    async def serve(self, request: pb.DepotStreamRequest, read: ReadFn) -> AsyncIterator[pb.DepotStreamReply]:
        """Every record of ``request.ranges``, in order, as replies of at most ``records`` records and
        ``max_bytes`` bytes (the first one ``first_records``)."""
        for r in request.ranges:
            if r.end < r.start:
                raise InvalidRequest("ranges", f"range of task {r.task} ends at {r.end}, before its start {r.start}")
        size = min(request.records or DEFAULT_RECORDS, MAX_RECORDS)
        first = min(request.first_records or size, size)
        max_bytes = min(request.max_bytes or DEFAULT_BYTES, MAX_BYTES)
        self.open += 1
        try:
            for r in request.ranges:
                at = r.start
                while at < r.end:
                    records, start, nxt, offsets, epoch = read(r.task, at, min(r.end, at + first), max_bytes)
                    first = size
                    yield pb.DepotStreamReply(task=r.task, start=start, next=nxt, epoch=epoch,
                                              packed=records.data, lengths=records.lengths,
                                              offsets=offsets)
                    if nxt <= at:  # no progress before the range's end: the reader checks the range
                        return
                    at = nxt
        finally:
            self.open -= 1
