"""``DepotStream`` without a cluster: the worker's service over a fake leader's store, on a real gRPC server.

The ranges come back exactly, in order and in replies of the asked sizes; a trimmed start fails with
OffsetOutOfRange (and the Spark reader's DepotOffsetOutOfRange); a reader that stops reading stops the reads
(flow control), and a stream cancelled midway is let go on the worker; the Spark reader falls back to
``DepotRead`` calls on a worker without the stream.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.checked import checked_handler
from conductor.wire.errors import error_from_rpc
from conductor.worker.depot_stream import DepotStreams
from conductor.worker.services import ClientService
from pstate.packed_records import PackedRecords
from replog.errors import NotLeader, OffsetOutOfRange
from topology.spark.errors import DepotOffsetOutOfRange
from topology.spark.fetch import Fetcher
from topology.spark.planning import DepotPartition, TaskRange

EPOCH = 3


class _Store:
    """A leader's depot partitions in memory: task -> records from offset ``start[task]`` (below it: trimmed)."""

    def __init__(self, records: dict[int, list[bytes]]) -> None:
        self.records = records
        self.start = dict.fromkeys(records, 0)
        self.reads = 0

    def depot_read(self, depot: str, task: int, start: int, end: int | None, max_bytes: int,
                   strict: bool = False) -> tuple[PackedRecords, int, int, list[int]]:
        assert strict, "the stream's reads are strict"
        self.reads += 1
        if start < self.start[task]:
            raise OffsetOutOfRange(start, self.start[task], len(self.records[task]))
        stop = min(len(self.records[task]), end if end is not None else 1 << 62)
        out, size = [], 0
        for rec in self.records[task][start:stop]:
            if out and size + len(rec) > max_bytes:
                break
            out.append(rec)
            size += len(rec)
        return PackedRecords.of(out), start, start + len(out), []

    def depot_info(self, depot: str, task: int) -> tuple[int, int]:
        return self.start[task], len(self.records[task])


class _Host:
    class replica:  # (what ClientService reads of a host: replica.epoch)
        epoch = EPOCH

    def report(self, e: Exception) -> None:
        raise AssertionError(e)


def _service(store: _Store) -> ClientService:
    svc = object.__new__(ClientService)  # (no worker: only the read path runs)
    svc.depot_streams = DepotStreams()
    svc._leader_store = lambda module, task: (_Host(), store)  # type: ignore[method-assign,assignment,return-value]
    return svc


class _OldWorker(pbg.ClientServicer):
    """A worker of a version without ``DepotStream``: ``DepotRead`` and ``PartitionInfo`` only."""

    def __init__(self, svc: ClientService) -> None:
        self.svc = svc

    async def DepotRead(self, request: pb.DepotReadRequest, context: Any) -> pb.DepotReadReply:
        return await self.svc.DepotRead(request, context)

    async def PartitionInfo(self, request: pb.PartitionInfoRequest, context: Any) -> pb.PartitionInfoReply:
        return await self.svc.PartitionInfo(request, context)


@contextmanager
def _serving(servicer: Any) -> Iterator[str]:
    """``servicer`` on a gRPC asyncio server on loopback, on a thread of its own; yields its address."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop: asyncio.Future[None] | None = None
    port = 0

    async def serve() -> None:
        nonlocal stop, port
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((checked_handler(pb.DESCRIPTOR.services_by_name["Client"], servicer),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop = loop.create_future()
        ready.set()
        await stop
        await server.stop(None)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(lambda: stop.set_result(None) if stop and not stop.done() else None)
        thread.join(10)


def _records(task: int, n: int) -> list[bytes]:
    return [f"{task}:{i}".encode() for i in range(n)]


def _request(ranges: list[tuple[int, int, int]], records: int = 100, first: int = 10) -> pb.DepotStreamRequest:
    return pb.DepotStreamRequest(module="M", depot="*d", records=records, first_records=first,
                                 ranges=[pb.DepotRange(task=t, start=s, end=e) for t, s, e in ranges])


def _unpack(reply: pb.DepotStreamReply) -> list[bytes]:
    out, at = [], 0
    for i in range(0, len(reply.lengths), 4):
        n = int.from_bytes(reply.lengths[i:i + 4], "little")
        out.append(reply.packed[at:at + n])
        at += n
    return out


def test_a_stream_returns_its_ranges_in_order_in_replies_of_the_asked_sizes() -> None:
    store = _Store({0: _records(0, 500), 1: _records(1, 500)})
    with _serving(_service(store)) as address, grpc.insecure_channel(address) as ch:
        replies = list(pbg.ClientStub(ch).DepotStream(_request([(1, 7, 257), (0, 450, 500), (0, 3, 3)]), timeout=10))
    assert [(r.task, r.start, r.next) for r in replies] == [
        (1, 7, 17), (1, 17, 117), (1, 117, 217), (1, 217, 257), (0, 450, 500)]
    assert all(r.epoch == EPOCH for r in replies)
    got = [rec for r in replies for rec in _unpack(r)]
    assert got == store.records[1][7:257] + store.records[0][450:500]


def test_a_trimmed_start_fails_with_offset_out_of_range_and_the_reader_with_the_truncation_error() -> None:
    store = _Store({0: _records(0, 300), 1: _records(1, 300)})
    store.start[1] = 50
    with _serving(_service(store)) as address:
        with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as info:
            list(pbg.ClientStub(ch).DepotStream(_request([(0, 0, 300), (1, 20, 300)]), timeout=10))
        assert isinstance(error_from_rpc(info.value), OffsetOutOfRange)
        p = DepotPartition("zk", "M", "*d", 0, [TaskRange(0, 0, 300, EPOCH), TaskRange(1, 20, 300, EPOCH)],
                           address, 100, 1 << 20)
        read: list[bytes] = []
        with pytest.raises(DepotOffsetOutOfRange, match="trimmed"):
            for _task, _first, _epoch, raw, _offsets in Fetcher(p).chunks():
                read.extend(raw.to_pylist())
        assert read == store.records[0]  # what precedes the trimmed range was read once


def test_a_reader_that_stops_reading_stops_the_reads_and_a_cancelled_stream_is_let_go() -> None:
    store = _Store({0: [b"x" * 1000] * 100_000})  # 100 MB in replies of 100 KB
    svc = _service(store)
    with _serving(svc) as address, grpc.insecure_channel(address) as ch:
        call = pbg.ClientStub(ch).DepotStream(_request([(0, 0, 100_000)], records=100, first=100), timeout=30)
        assert len(_unpack(next(call))) == 100
        time.sleep(1.0)
        held = store.reads
        assert svc.depot_streams.open == 1
        assert held < 100, held  # flow control: the transport's windows, not the whole range (1,000 replies)
        time.sleep(0.5)
        assert store.reads == held  # and no more while nobody reads
        call.cancel()
        _wait(lambda: svc.depot_streams.open == 0)
        assert store.reads <= held + 1


def test_a_worker_without_the_stream_is_read_with_depot_read_calls() -> None:
    store = _Store({2: _records(2, 1000), 3: _records(3, 1000)})
    with _serving(_OldWorker(_service(store))) as address:
        p = DepotPartition("zk", "M", "*d", 1, [TaskRange(2, 0, 1000, EPOCH), TaskRange(3, 500, 600, EPOCH)],
                           address, 256, 1 << 20)
        fetcher = Fetcher(p)
        chunks = list(fetcher.chunks())
    assert not fetcher.streams
    assert [rec for *_h, raw, _o in chunks for rec in raw.to_pylist()] == store.records[2] + store.records[3][500:600]
    assert [(c[0], c[1]) for c in chunks] == [(2, 0), (2, 256), (2, 512), (2, 768), (3, 500)]


def test_the_reader_follows_a_stream_that_fails_midway_from_its_last_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """NotLeader after some replies (the leader moved): the reader looks the leader up and opens a new stream
    where the last reply ended; nothing is read twice."""
    store = _Store({0: _records(0, 1000)})
    svc = _service(store)
    real: Callable[[str, int], Any] = svc._leader_store
    calls = 0

    def moving(module: str, task: int) -> Any:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise NotLeader("M/0", None, EPOCH)
        return real(module, task)

    svc._leader_store = moving  # type: ignore[method-assign]
    with _serving(svc) as address:
        p = DepotPartition("zk", "M", "*d", 0, [TaskRange(0, 0, 1000, EPOCH)], address, 100, 1 << 20)
        fetcher = Fetcher(p)
        relocated: list[str] = []
        monkeypatch.setattr(fetcher, "_relocate", lambda why: relocated.append(str(why)))
        chunks = list(fetcher.chunks())
    assert fetcher.streams and len(relocated) == 1
    assert [rec for *_h, raw, _o in chunks for rec in raw.to_pylist()] == store.records[0]


def _wait(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
