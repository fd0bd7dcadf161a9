"""How the client frames records into requests: ``append_async``'s per-group batcher and ``append_many``'s framing.

Python pays per object and per gRPC message, so records waiting for the same
task group leave together in one ``AppendRequest``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from conductor.client.errors import ClientError
from conductor.wire import millrace_pb2 as pb

if TYPE_CHECKING:
    from conductor.client.cluster import Cluster


def encode_record(record: Any) -> bytes:
    try:
        raw: bytes = msgpack.packb(record, use_bin_type=True)
        return raw
    except (TypeError, ValueError, OverflowError) as e:  # an unknown type, an int beyond 64 bits, too deep
        raise ClientError(f"record {record!r:.200} cannot be encoded: use str, int (64 bits), float, bytes, bool, "
                          f"None, lists, tuples and dicts of those ({e})") from None


def _set_result(fut: concurrent.futures.Future[int], value: int) -> None:
    try:
        fut.set_result(value)
    except concurrent.futures.InvalidStateError:  # cancelled by its owner
        pass


def _set_exception(fut: concurrent.futures.Future[int], exc: BaseException) -> None:
    try:
        fut.set_exception(exc)
    except concurrent.futures.InvalidStateError:
        pass


_Item = tuple[str, int, bytes, concurrent.futures.Future[int]]


def append_request(module: str, group: int, ack: int, appends: list[tuple[str, int, list[bytes]]],
                   timestamp_ms: int | None = None) -> pb.AppendRequest:
    """An ``AppendRequest`` of (depot, task, records) parts, each built in the request's own repeated field.

    Not ``AppendRequest(appends=[DepotRecords(...)])``: protobuf merges a message built apart by serializing
    and parsing it again, every record a second and a third time; for 10,000 records of 100 bytes that was
    2.2-3.2 ms against 0.16 here (0.32 when malloc reuses the freed megabytes, which glibc mostly gives back
    to the kernel, so each copy faults fresh pages in: 880 page faults per ``append_many`` then, 8 now)."""
    req = pb.AppendRequest(module=module, group=group, ack=ack, timestamp_ms=timestamp_ms)  # type: ignore[arg-type]
    for depot, task, records in appends:
        req.appends.add(depot=depot, task=task, records=records)
    return req


class StickyTasks:
    """``append_async``'s task per depot whose partitioner ignores the record (``random``): one per batch window.

    Kafka's sticky partitioner (KIP-480): every record goes to the task chosen last until the batch that holds
    them leaves (:meth:`left`, when :class:`GroupBatcher` frames its request), then the next record chooses again.
    A burst of records then costs one request and one replog entry on one task group, not one per group, and
    the choices still spread evenly over many batches. Any thread chooses (:meth:`task`), the event loop ends
    a window: a record racing with the end of its window goes to either task, both right for ``random``.
    Bounded by the depots this client appends to (one entry each).
    """

    def __init__(self) -> None:
        self._current: dict[tuple[str, str], int] = {}

    def task(self, module: str, depot: str, choose: Callable[[], int]) -> int:
        """The task of the current window of ``depot``, chosen with ``choose`` if none is open."""
        key = (module, depot)
        task = self._current.get(key)
        if task is None:
            task = self._current[key] = choose()  # (only here is a window opened: `left` only closes one)
        return task

    def left(self, module: str, depot: str, task: int) -> None:
        """A batch with records of ``depot`` for ``task`` left: if that was the window's task, the window ends."""
        key = (module, depot)
        if self._current.get(key) == task:
            del self._current[key]


class GroupBatcher:
    """Frames the records waiting for one task group into as few requests as possible (event loop only).

    A request goes out at once when fewer than `max_inflight_per_group` are in
    flight; otherwise records wait and leave together with the next free slot,
    so batching grows exactly when the group is busy and costs no latency when
    it is idle (optionally plus `linger_ms`).
    """

    def __init__(self, cluster: Cluster, module: str, group: int) -> None:
        self.c = cluster
        self.module = module
        self.group = group
        self.waiting: dict[int, list[_Item]] = {}
        self.inflight = 0
        self.scheduled = False
        self.tasks: set[asyncio.Future[None]] = set()

    def add(self, ack: int, depot: str, task: int, data: bytes, fut: concurrent.futures.Future[int]) -> None:
        w = self.waiting.get(ack)
        if w is None:
            w = self.waiting[ack] = []
        w.append((depot, task, data, fut))
        if not self.scheduled:
            self.scheduled = True
            if self.c.linger_ms > 0:
                self.c._loop.call_later(self.c.linger_ms / 1000, self._pump)
            else:
                self.c._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self.scheduled = False
        limit = self.c.max_batch_records
        while self.waiting and self.inflight < self.c.max_inflight_per_group:
            ack = next(iter(self.waiting))
            items = self.waiting[ack]
            if len(items) > limit:
                self.waiting[ack] = items[limit:]
                items = items[:limit]
            else:
                del self.waiting[ack]
            self.inflight += 1
            by_part: dict[tuple[str, int], list[_Item]] = {}
            for it in items:
                part = (it[0], it[1])
                lst = by_part.get(part)
                if lst is None:
                    lst = by_part[part] = []
                lst.append(it)
            sticky = self.c.sticky
            for depot, t in by_part:  # this batch leaves: a sticky depot's next record chooses a task again
                sticky.left(self.module, depot, t)
            task = asyncio.ensure_future(self._send(ack, items, list(by_part.items())))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, ack: int, items: list[_Item], parts: list[tuple[tuple[str, int], list[_Item]]]) -> None:
        nbytes = sum(len(it[2]) for it in items)
        req = append_request(self.module, self.group, ack, [(d, t, [it[2] for it in its]) for (d, t), its in parts])
        self.c.stamp(req)
        try:
            reply = await self.c._append_aio(self.module, self.group, req)
            firsts = list(reply.first_offsets)
            for n, (_key, its) in enumerate(parts):
                base = firsts[n] if n < len(firsts) else None
                for k, it in enumerate(its):
                    _set_result(it[3], base + k if base is not None else -1)
        except Exception as e:
            for it in items:
                _set_exception(it[3], e)
        finally:
            self.c._answered(len(items), nbytes)
            self.inflight -= 1
            if self.waiting and not self.scheduled:
                self.scheduled = True
                self.c._loop.call_soon(self._pump)


def frame_group(module: str, depot: str, group: int, ack: int, partitions: list[tuple[int, list[int], list[bytes]]],
                 limit: int, timestamp_ms: int | None = None) -> list[tuple[pb.AppendRequest, list[tuple[int, list[int]]]]]:
    """append_many: requests of at most `limit` records for one group from (task, input indexes, records).

    Whole partitions go together; a partition larger than the room left is split.
    Each request comes with its (task, input indexes) in request order.
    """
    out: list[tuple[pb.AppendRequest, list[tuple[int, list[int]]]]] = []
    parts: list[tuple[int, list[int], list[bytes]]] = []
    size = 0

    def cut() -> None:
        req = append_request(module, group, ack, [(depot, t, recs) for t, _idx, recs in parts], timestamp_ms)
        out.append((req, [(t, idx) for t, idx, _recs in parts]))
        parts.clear()

    for task, idx, recs in partitions:
        pos = 0
        while pos < len(idx):
            take = min(limit - size, len(idx) - pos)
            parts.append((task, idx[pos:pos + take], recs[pos:pos + take]))
            pos += take
            size += take
            if size >= limit:
                cut()
                size = 0
    if parts:
        cut()
    return out


#: append_many: requests in flight per task group within one call
MANY_INFLIGHT_PER_GROUP = 2
