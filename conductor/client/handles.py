"""What an app holds to work with one depot or one PState: :class:`Depot` and :class:`PState`.

Records are routed with the depot's own partitioner and a query's first key
picks its task, exactly as the module's code does on the workers; the calls
themselves go through the :class:`~conductor.client.cluster.Cluster`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from bisect import bisect_right
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from conductor.client.batching import MANY_INFLIGHT_PER_GROUP, append_request, encode_record, frame_group
from conductor.client.errors import ClientError
from conductor.client.queries import ScanPage, scan_pages
from conductor.client.subscriptions import Change, Subscription, subscribe_request
from conductor.wire import millrace_pb2 as pb
from pstate.errors import SchemaMismatch
from pstate.path import Path
from pstate.query import encode_query
from topology.partitioners import task_for_key
from topology.refs import path_function_ref

if TYPE_CHECKING:
    from conductor.client.cluster import Cluster

ACKS = {"none": pb.ACK_NONE, "append": pb.ACK_APPEND, "applied": pb.ACK_APPLIED}


def _check_time(timestamp_ms: int | None) -> int | None:
    """An event time as the wire takes it: whole milliseconds since the epoch, in [0, 2**63)."""
    if timestamp_ms is not None and (type(timestamp_ms) is not int or not 0 <= timestamp_ms < 1 << 63):
        raise ClientError(f"timestamp_ms must be whole milliseconds since the epoch (an int >= 0), "
                          f"got {timestamp_ms!r}")
    return timestamp_ms


def _ack(ack: str) -> int:
    try:
        return ACKS[ack]
    except KeyError:
        raise ClientError(f"ack must be one of {sorted(ACKS)}, got {ack!r}") from None


@dataclass(frozen=True)
class PartitionStatus:
    """Depot partition `task` as its leader sees it: records in [start, end) are applied; `epoch` is the leader's."""

    task: int
    start: int
    end: int
    epoch: int


@dataclass(frozen=True)
class DepotBatch:
    """Records [start, next) of one partition, read from the leader of `epoch` (KIP-320 style checks).

    ``offsets``: each record's offset when the partition is key-compacted (its offsets have gaps); None when
    the records are dense from ``start``.
    """

    records: list[Any]
    start: int
    next: int
    epoch: int
    offsets: list[int] | None = None
    #: each record's time in ms since the epoch (the leader's append time or the app's event time);
    #: None for records stored before depots kept times
    timestamps: list[int | None] = field(default_factory=list)


def _record_times(run_offsets: Sequence[int], run_times: Sequence[int], start: int, nxt: int,
                  offsets: Sequence[int] | None) -> list[int | None]:
    """Each record's time from a DepotRead reply's runs (run i: ``run_times[i]`` from ``run_offsets[i]`` up to
    the next run; -1 = stored without a time); the records are ``offsets`` (a compacted partition) or dense."""
    out: list[int | None] = []
    for o in offsets if offsets is not None else range(start, nxt):
        i = bisect_right(run_offsets, o) - 1
        out.append(None if i < 0 or run_times[i] < 0 else run_times[i])
    return out


class Depot:
    """Appends to and reads from one depot; records are routed by the depot's partitioner."""

    def __init__(self, cluster: Cluster, module: str, name: str) -> None:
        self.c = cluster
        self.module = module
        self.name = name

    def _route(self, record: Any) -> tuple[int, int]:
        meta = self.c._module(self.module)
        task = self._task(meta.definition.depots[self.name].partitioner, record, meta.spec.tasks)
        return task, meta.spec.group_of(task)

    def _task(self, partitioner: Any, record: Any, ntasks: int) -> int:
        """The record's task; SchemaMismatch when the depot's partitioner cannot take it (not its bare error)."""
        try:
            task = partitioner(record, ntasks)
        except Exception as e:
            raise SchemaMismatch(f"{self.module} depot {self.name} record",
                                 f"a record its partitioner accepts ({type(e).__name__}: {e})",
                                 f"{type(record).__name__} {record!r:.80}") from None
        if type(task) is not int or not 0 <= task < ntasks:
            raise ClientError(f"the partitioner of depot {self.name} returned task {task!r} for {record!r:.80}; "
                              f"a task is an int in [0, {ntasks})")
        return task

    def append_async(self, record: Any, ack: str = "applied") -> concurrent.futures.Future[int]:
        """Queue one record; the future yields its depot offset (ack="applied") or -1."""
        a = _ack(ack)
        data = encode_record(record)
        meta = self.c._module(self.module)
        partitioner = meta.definition.depots[self.name].partitioner
        ntasks = meta.spec.tasks
        if partitioner.sticky:  # one task per batch window (StickyTasks), as append_many's one per request
            task = self.c.sticky.task(self.module, self.name, lambda: self._task(partitioner, record, ntasks))
        else:
            task = self._task(partitioner, record, ntasks)
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        self.c._enqueue((self.module, meta.spec.group_of(task), a, self.name, task, data, fut))
        return fut

    def append(self, record: Any, ack: str = "applied", timestamp_ms: int | None = None) -> int:
        """Append one record and wait for `ack`; returns its depot offset when ack="applied".

        ``ack="applied"`` returns once the record's whole processing is applied:
        its topologies' effects on the record's own task group and every hop
        they made to other task groups, transitively. ``timestamp_ms`` is the
        record's event time (ms since the epoch); by default the leader's clock
        when it appends (``read_batch`` returns it, ``offset_for_time`` finds it).
        """
        reply = self._append_one(record, ack, timestamp_ms)
        return reply.first_offsets[0] if reply.first_offsets else -1

    def append_with_acks(self, record: Any, ack: str = "applied",
                         timestamp_ms: int | None = None) -> tuple[int, dict[str, Any]]:
        """`append`, plus what each stream topology on this depot returned for the record: ``{topology: value}``."""
        reply = self._append_one(record, ack, timestamp_ms)
        acks = msgpack.unpackb(reply.ack_values, raw=False, strict_map_key=False) if reply.ack_values else {}
        return (reply.first_offsets[0] if reply.first_offsets else -1), {t: v[0] for t, v in acks.items() if v}

    def _append_one(self, record: Any, ack: str, timestamp_ms: int | None) -> pb.AppendReply:
        a = _ack(ack)
        data = encode_record(record)
        task, group = self._route(record)
        req = append_request(self.module, group, a, [(self.name, task, [data])], _check_time(timestamp_ms))
        return self.c._append_sync(self.module, group, self.c.stamp(req))

    def append_many(self, records: Sequence[Any] | Iterable[Any], ack: str = "applied",
                    timestamp_ms: int | None = None) -> list[int]:
        """Append many records: one request per task group, sent in parallel; offsets in input order.

        ``timestamp_ms`` is every record's event time (default: the leader's clock, as for `append`).

        Records are encoded and routed in the calling thread; a group with more than
        the client's `max_batch_records` gets several requests, two in flight at a time.
        A depot partitioner that ignores the record (``random``) is asked once per
        `max_batch_records` records, which all go to the task it chose.
        """
        a = _ack(ack)
        c = self.c
        meta = c._module(self.module)
        partitioner = meta.definition.depots[self.name].partitioner
        ntasks = meta.spec.tasks
        pack = msgpack.Packer(use_bin_type=True).pack
        limit = max(1, c.max_batch_records)
        sticky = partitioner.sticky  # one task per request's worth of records (see Partitioner.sticky)
        records = records if isinstance(records, list) else list(records)
        n = len(records)
        if n == 0:
            return []
        try:  # one comprehension: the batched path's records cost one C call each
            datas = [pack(record) for record in records]
        except (TypeError, ValueError, OverflowError):
            for record in records:
                encode_record(record)  # raises the ClientError that says what the first bad one is
            raise
        by_task: dict[int, tuple[list[int], list[bytes]]] = {}
        if sticky:  # a task per request's worth of records: whole slices, no step per record
            for start in range(0, n, limit):
                slot = by_task.setdefault(self._task(partitioner, records[start], ntasks), ([], []))
                slot[0].extend(range(start, min(n, start + limit)))
                slot[1].extend(datas[start:start + limit])
        else:
            for i, task in enumerate([self._task(partitioner, record, ntasks) for record in records]):
                found = by_task.get(task)
                if found is None:
                    found = by_task[task] = ([], [])
                found[0].append(i)
                found[1].append(datas[i])
        by_group: dict[int, list[int]] = {}
        for task in sorted(by_task):
            by_group.setdefault(meta.spec.group_of(task), []).append(task)
        event_ms = _check_time(timestamp_ms)
        requests = {g: frame_group(self.module, self.name, g, a, [(t, *by_task[t]) for t in tasks], limit, event_ms)
                    for g, tasks in by_group.items()}
        done: list[tuple[list[tuple[int, list[int]]], Sequence[int]]] = []
        errors: list[BaseException] = []

        async def send_group(group: int, reqs: list[tuple[Any, list[tuple[int, list[int]]]]]) -> None:
            it = iter(reqs)

            async def worker() -> None:
                for req, parts in it:
                    c.stamp(req)  # numbered when first sent, so this group's numbers follow its sending order
                    try:
                        reply = await c._call(self.module, group, "Append", req)
                    except Exception as e:
                        errors.append(e)
                        return
                    done.append((parts, reply.first_offsets))

            await asyncio.gather(*(worker() for _ in range(min(MANY_INFLIGHT_PER_GROUP, len(reqs)))))

        async def send_all() -> None:
            await asyncio.gather(*(send_group(g, r) for g, r in requests.items()))

        c._run(send_all()).result(timeout=c.timeout_s + 5)
        if errors:
            raise errors[0]
        out = [-1] * n
        for parts, firsts in done:  # offsets are filled here, in the caller's thread, not on the event loop
            for k, (_task, idx) in enumerate(parts):
                if k < len(firsts) and idx:
                    base = firsts[k]
                    if idx[-1] - idx[0] == len(idx) - 1:  # a run of inputs (indexes only increase): one slice
                        out[idx[0]:idx[-1] + 1] = range(base, base + len(idx))
                    else:
                        for j, i in enumerate(idx):
                            out[i] = base + j
        return out

    def _group(self, task: int) -> int:
        meta = self.c._module(self.module)
        if not 0 <= task < meta.spec.tasks:
            raise ClientError(f"task {task} is outside [0, {meta.spec.tasks}) for module {self.module}")
        return meta.spec.group_of(task)

    def read_batch(self, task: int, start: int = 0, end: int | None = None, max_bytes: int = 1 << 20,
                   *, strict: bool | None = None) -> DepotBatch:
        """Applied records of partition `task` from `start` (up to `end`, about `max_bytes`), with the epoch.

        A `start` below the partition's start (records trimmed by retention) raises ``OffsetOutOfRange``
        when `strict`, which is the default for any `start` but 0 (0 reads from the first record kept).
        """
        strict = start > 0 if strict is None else strict
        req = pb.DepotReadRequest(module=self.module, depot=self.name, task=task, start=start, end=end or 0,
                                  max_bytes=max_bytes, strict=strict, times=True)
        reply = self.c._call_sync(self.module, self._group(task), "DepotRead", req)
        records = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in reply.records]
        offsets = list(reply.offsets) or None
        times = _record_times(reply.time_offsets, reply.time_ms, reply.start, reply.next, offsets)
        if len(times) != len(records):  # a worker from before record times sends no runs
            times = [None] * len(records)
        return DepotBatch(records, reply.start, reply.next, reply.epoch, offsets, times)

    def trim(self, task: int, before_offset: int) -> int:
        """Delete partition `task`'s records below `before_offset` (one replog entry, so on every replica;
        never past the applied end); returns the partition's start offset after it."""
        req = pb.DepotTrimRequest(module=self.module, depot=self.name, task=task, before=before_offset)
        return int(self.c._call_sync(self.module, self._group(task), "DepotTrim", req).start)

    def read(self, task: int, start: int = 0, end: int | None = None, max_bytes: int = 1 << 20) -> list[Any]:
        """Applied records of partition `task` in [start, end), at most about `max_bytes`."""
        return self.read_batch(task, start, end, max_bytes).records

    def partition_status(self, task: int) -> PartitionStatus:
        req = pb.PartitionInfoRequest(module=self.module, depot=self.name, task=task)
        reply = self.c._call_sync(self.module, self._group(task), "PartitionInfo", req)
        return PartitionStatus(task, reply.start, reply.end, reply.epoch)

    def partition_info(self, task: int) -> tuple[int, int]:
        """(start, end) offsets of partition `task`: records in [start, end) are applied and readable."""
        st = self.partition_status(task)
        return st.start, st.end

    def offset_for_time(self, task: int, timestamp_ms: int) -> int | None:
        """The first offset of partition `task` holding a record at or after `timestamp_ms` (Kafka's offsetsForTimes).

        Defined on each record's max-so-far time (the largest time up to it), so
        with event times that go backwards every record before the answer is
        older than `timestamp_ms`, and a late one after it may be older too.
        None: no record is that recent (a read from the time starts at the end).
        """
        req = pb.PartitionInfoRequest(module=self.module, depot=self.name, task=task,
                                      time_ms=_check_time(timestamp_ms))
        reply = self.c._call_sync(self.module, self._group(task), "PartitionInfo", req)
        return int(reply.offset_for_time) if reply.HasField("offset_for_time") else None


class PState:
    """Queries one PState; a path's first key picks the task (the one `hash_partition(key)` picks)."""

    def __init__(self, cluster: Cluster, module: str, name: str) -> None:
        self.c = cluster
        self.module = module
        self.name = name

    def _query(self, key: Any, path: Sequence[Any], one: bool, task: int | None) -> Any:
        meta = self.c._module(self.module)
        if task is None:
            task = task_for_key(key, meta.spec.tasks)
        req = pb.SelectRequest(module=self.module, pstate=self.name, task=task, one=one,
                               path=encode_query(key, path, path_function_ref))
        reply = self.c._call_sync(self.module, meta.spec.group_of(task), "Select", req)
        return msgpack.unpackb(reply.values, raw=False, strict_map_key=False)

    def select_one(self, key: Any, *path: Any, task: int | None = None) -> Any:
        """The single value at `key` (then `path` navigators), or None."""
        return self._query(key, path, True, task)

    def select(self, key: Any, *path: Any, task: int | None = None) -> list[Any]:
        """Every value `path` navigates to under `key`."""
        return list(self._query(key, path, False, task))

    # ---- reactive subscriptions (conductor/client/subscriptions.py, docs/subscriptions.md)
    def subscribe(self, key: Any, callback: Callable[[Change], None] | None = None) -> Subscription:
        """A live value of top-level `key`: `callback` gets its value, then every applied entry's diffs."""
        meta = self.c._module(self.module)
        task = task_for_key(key, meta.spec.tasks)
        return Subscription(self.c, self.module, meta.spec.group_of(task),
                            subscribe_request(self.module, self.name, task, key, False), callback)

    def subscribe_all(self, task: int, callback: Callable[[Change], None] | None = None) -> Subscription:
        """A live value of the whole PState in the task group owning `task` (every task of that group)."""
        meta = self.c._module(self.module)
        return Subscription(self.c, self.module, meta.spec.group_of(task),
                            subscribe_request(self.module, self.name, task, None, True), callback)

    def subscribe_groups(self, callback: Callable[[Change], None] | None = None) -> list[Subscription]:
        """The whole PState, live: one :meth:`subscribe_all` per task group (their keys never overlap)."""
        spec = self.c._module(self.module).spec
        first = {spec.group_of(t): t for t in reversed(range(spec.tasks))}
        return [self.subscribe_all(t, callback) for _, t in sorted(first.items())]

    async def watch(self, key: Any) -> AsyncIterator[Change]:
        """``async for change in pstate.watch(key)``: the value, then its changes, until the loop is left."""
        sub = self.subscribe(key)
        try:
            async for ch in sub.changes():
                yield ch
        finally:
            sub.close()

    def scan(self, task: int | None = None, start: Any = None, end: Any = None) -> list[tuple[Any, Any]]:
        """(key, value) pairs of a Map PState on `task` (None: every task) with start <= key < end (None = open),
        in key order per task group; read a page at a time, but all held: for large ranges use
        :meth:`scan_pages`."""
        return [kv for page in self.scan_pages(task, start, end) for kv in page.items]

    def scan_pages(self, task: int | None = None, start: Any = None, end: Any = None, *path: Path,
                   page_size: int = 1000, resume: bytes | None = None) -> Iterator[ScanPage]:
        """A Map PState's entries of `task` (None: every task) in [start, end), streamed a page at a time.

        Each page is one bounded call to a group leader; ``page.token`` passed as ``resume`` continues after
        that page. ``path`` navigates each (key, value) pair on the worker (as after ``P.all()``), e.g.
        ``P.filter(is_long)`` with a module-level ``is_long`` (a server-side filter).
        """
        return scan_pages(self.c, self.module, self.name, task, start, end, path, page_size, resume)

    def scan_iter(self, task: int | None = None, start: Any = None, end: Any = None, *path: Path,
                  page_size: int = 1000) -> Iterator[Any]:
        """:meth:`scan_pages`' results one by one (one page held at a time)."""
        for page in self.scan_pages(task, start, end, *path, page_size=page_size):
            yield from page.items
