"""The client's queues are bounded: past the bound a caller waits for room, then gets QueueFull naming the option.

No cluster: append_async's records go through the real hand-off, batcher and
accounting to a fake leader call; the blocking appends' stream talks to an
in-process gRPC server that never answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from conductor.client import QueueFull
from conductor.client.cluster import Cluster
from conductor.client.streams import StreamBroken, SyncAppendStream
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg


class _Leader:
    """Stands for the group leader's AppendStream: answers append_async's requests when released."""

    def __init__(self, cluster: Cluster) -> None:
        self.requests = 0
        self.offset = 0
        self.release = asyncio.run_coroutine_threadsafe(self._event(), cluster._loop).result()

    async def _event(self) -> asyncio.Event:
        return asyncio.Event()

    async def append(self, module: str, group: int, request: pb.AppendRequest) -> pb.AppendReply:
        self.requests += 1
        await self.release.wait()
        first = self.offset  # one depot partition (task 0 of *d): offsets follow the records in order
        self.offset += len(request.appends[0].records)
        return pb.AppendReply(first_offsets=[first])


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, _Leader]]:
    c = Cluster("127.0.0.1:1", timeout_s=0.3, max_queued_records=3, max_queued_bytes=1000)  # never connected
    c._thread.start()
    leader = _Leader(c)
    c._append_aio = leader.append  # type: ignore[method-assign]
    yield c, leader
    c._loop.call_soon_threadsafe(leader.release.set)
    c.close()


def _append_async(c: Cluster, data: bytes = b"r") -> concurrent.futures.Future[int]:
    """What Depot.append_async hands the client, routed and encoded (task 0 of group 0)."""
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    c._enqueue(("M", 0, pb.ACK_APPLIED, "*d", 0, data, fut))
    return fut


def test_append_async_past_max_queued_records_waits_then_raises_queue_full(cluster: tuple[Cluster, _Leader]) -> None:
    c, leader = cluster
    futs = [_append_async(c) for _ in range(3)]
    start = time.monotonic()
    with pytest.raises(QueueFull, match="max_queued_records=3") as e:
        _append_async(c)
    assert time.monotonic() - start >= 0.25  # it waited for room, about timeout_s
    assert e.value.option == "max_queued_records" and e.value.code == "RESOURCE_EXHAUSTED"
    assert c._outstanding == 3  # the refused record was not queued
    # a caller waiting for room goes on as soon as earlier records are answered
    c.timeout_s = 10
    late: list[concurrent.futures.Future[int]] = []
    waiter = threading.Thread(target=lambda: late.append(_append_async(c)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()
    c._loop.call_soon_threadsafe(leader.release.set)
    waiter.join(5)
    assert not waiter.is_alive() and late
    assert [f.result(5) for f in futs] == [0, 1, 2]
    assert late[0].result(5) == 3
    deadline = time.monotonic() + 5
    while c._outstanding and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c._outstanding == 0 and c._outstanding_bytes == 0


def test_append_async_past_max_queued_bytes_raises_queue_full(cluster: tuple[Cluster, _Leader]) -> None:
    c, _leader = cluster
    _append_async(c, b"x" * 600)
    with pytest.raises(QueueFull, match="max_queued_bytes=1,000"):
        _append_async(c, b"x" * 600)
    _append_async(c, b"x" * 400)  # what fits still goes


def test_one_record_over_max_queued_bytes_goes_when_nothing_waits(cluster: tuple[Cluster, _Leader]) -> None:
    c, _leader = cluster
    _append_async(c, b"x" * 5000)  # it could never go otherwise; the node's record limit judges it
    assert c._outstanding == 1


def test_append_async_on_the_event_loop_does_not_wait_for_itself(cluster: tuple[Cluster, _Leader]) -> None:
    c, _leader = cluster
    for _ in range(3):
        _append_async(c)

    async def on_loop() -> float:
        start = time.monotonic()
        with pytest.raises(QueueFull):
            _append_async(c)
        return time.monotonic() - start

    assert asyncio.run_coroutine_threadsafe(on_loop(), c._loop).result(5) < 0.2


class _Silent(pbg.ClientServicer):
    """An AppendStream that reads every request and never answers."""

    def AppendStream(self, request_iterator: Iterator[pb.AppendRequest], context: grpc.ServicerContext
                     ) -> Iterator[pb.AppendReply]:
        for _ in request_iterator:
            pass
        return iter(())


def test_blocking_appends_past_the_bound_wait_then_raise_queue_full() -> None:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    pbg.add_ClientServicer_to_server(_Silent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stream = SyncAppendStream(channel, max_waiting=2)
    outcomes: list[BaseException] = []

    def append() -> None:
        try:
            stream.request(pb.AppendRequest(module="M"), time.monotonic() + 30)
        except BaseException as e:  # (the test looks at what each caller got)
            outcomes.append(e)

    callers = [threading.Thread(target=append) for _ in range(2)]
    try:
        for t in callers:
            t.start()
        time.sleep(0.2)
        start = time.monotonic()
        with pytest.raises(QueueFull, match="max_blocking_appends_per_group=2"):
            stream.request(pb.AppendRequest(module="M"), time.monotonic() + 0.3)
        assert time.monotonic() - start >= 0.25
        assert all(t.is_alive() for t in callers)  # the two in line still wait for their replies
    finally:
        stream.cancel()
        for t in callers:
            t.join(5)
        channel.close()
        server.stop(None)
    assert len(outcomes) == 2 and all(isinstance(e, StreamBroken) for e in outcomes)
    assert stream._room.acquire(blocking=False)  # their slots were given back


def test_query_senders_keep_their_threads_and_never_make_a_request_wait() -> None:
    from conductor.client.queries import Senders

    senders = Senders(2)
    release = threading.Event()
    busy = [senders.submit(release.wait, 5) for _ in range(2)]
    assert all(f is not None for f in busy)
    assert senders.submit(time.sleep, 0) is None  # every kept thread busy: the caller sends a gRPC future instead
    release.set()
    assert all(f is not None and f.result(timeout=5) for f in busy)
    deadline = time.monotonic() + 5  # (a thread counts as free once its future's callbacks ran, just after)
    while (done := senders.submit(threading.current_thread)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done is not None and done.result(timeout=5).name.startswith("millrace-query-send")
    senders.close()
    assert senders.submit(time.sleep, 0) is None
