"""The worker's AppendStream reads at most ``max_pipelined`` requests ahead of its replies.

A client that pipelines faster than the leader answers is held back: past the
bound the stream stops reading, the next requests stay in gRPC's buffers and
HTTP/2 flow control stops the client's writes. The completions those requests
post back to the event loop (:class:`LoopSettler`) are one per request in
flight, so the same bound holds them. No worker, no replica: ``_start_append``
is replaced by a fake task thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc

from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.worker.services import ClientService, LoopSettler, settle_future

BOUND = 4
#: requests the gRPC test's client writes (256 KiB each)
N = 400


class _FakeLeader:
    """Stands for a leader's task thread: keeps every request's future until the test answers it."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[pb.AppendReply]] = []

    def start(self, request: pb.AppendRequest) -> asyncio.Future[pb.AppendReply]:
        fut: asyncio.Future[pb.AppendReply] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    def answer(self, n: int) -> None:
        for fut in self.futures:
            if n == 0:
                return
            if not fut.done():
                fut.set_result(pb.AppendReply(replog_offset=0))
                n -= 1


def _service(leader: _FakeLeader, bound: int = BOUND) -> ClientService:
    svc = object.__new__(ClientService)  # (no worker: only the stream's own logic runs)
    svc.max_pipelined = bound
    svc._start_append = leader.start  # type: ignore[method-assign]
    return svc


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_a_fast_client_is_not_read_past_the_bound() -> None:
    async def scenario() -> None:
        leader = _FakeLeader()
        read = 0

        async def client() -> AsyncIterator[pb.AppendRequest]:  # pipelines 100 requests as fast as it is read
            nonlocal read
            for seq in range(1, 101):
                read += 1
                yield pb.AppendRequest(seq=seq)

        replies = _service(leader).AppendStream(client(), None)
        first = asyncio.ensure_future(anext(replies))
        await _settle()
        assert read == BOUND and len(leader.futures) == BOUND  # the fifth request stays unread
        leader.answer(1)
        assert (await first).seq == 1
        await _settle()
        # the reply is out only once the stream resumes: the slot frees then, and one more request is read
        assert read == BOUND
        second = asyncio.ensure_future(anext(replies))
        await _settle()
        assert read == BOUND + 1
        got = [1]
        pending = second
        while True:
            leader.answer(BOUND)
            try:
                reply = await pending
            except StopAsyncIteration:
                break
            got.append(reply.seq)
            assert read - len(got) <= BOUND, (read, len(got))
            pending = asyncio.ensure_future(anext(replies))
        assert got == list(range(1, 101))  # in request order, none lost

    asyncio.run(scenario())


def test_over_grpc_the_client_is_held_back_by_flow_control() -> None:
    """A real in-process server: a client writing 100 MB of requests without reading stalls at the bound.

    What gRPC itself buffers is limited by its flow-control windows (a few MB),
    so the client's writes stop well before all are written.
    """
    async def scenario() -> None:
        leader = _FakeLeader()
        server = grpc.aio.server()
        pbg.add_ClientServicer_to_server(_service(leader), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = pbg.ClientStub(ch).AppendStream()
                payload = pb.DepotRecords(depot="*d", task=0, records=[b"x" * (256 << 10)])
                written = 0

                async def write_all() -> None:
                    nonlocal written
                    for seq in range(1, N + 1):
                        await call.write(pb.AppendRequest(seq=seq, appends=[payload]))
                        written += 1
                    await call.done_writing()

                writer = asyncio.ensure_future(write_all())
                await asyncio.sleep(1.0)
                assert len(leader.futures) == BOUND  # the leader saw only what the stream read
                assert not writer.done() and written < N // 2  # flow control holds the client's writes
                seen = 0
                while seen < N:
                    leader.answer(BOUND)
                    reply = await call.read()
                    seen += 1
                    assert reply.seq == seen
                    assert sum(not f.done() for f in leader.futures) <= BOUND  # read, not answered
                await writer
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_settler_holds_at_most_one_callback_per_request_in_flight() -> None:
    """Completions posted from a task thread never outnumber the requests the stream has read."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        settler = LoopSettler(loop)
        most = 0
        post = settler.post

        def counting_post(fn: Any, *args: Any) -> None:
            nonlocal most
            post(fn, *args)
            most = max(most, len(settler._items))

        settler.post = counting_post  # type: ignore[method-assign]
        work: list[asyncio.Future[pb.AppendReply]] = []
        lock = threading.Lock()

        def start(request: pb.AppendRequest) -> asyncio.Future[pb.AppendReply]:
            fut: asyncio.Future[pb.AppendReply] = loop.create_future()
            with lock:
                work.append(fut)
            return fut

        stop = threading.Event()

        def task_thread() -> None:  # answers whatever was posted, in bursts, from another thread
            while not stop.is_set():
                with lock:
                    burst, work[:] = list(work), []
                for fut in burst:
                    settler.post(settle_future, fut, pb.AppendReply(), None)
                stop.wait(0.001)

        svc = object.__new__(ClientService)
        svc.max_pipelined = BOUND
        svc._start_append = start  # type: ignore[method-assign]

        async def client() -> AsyncIterator[pb.AppendRequest]:
            for seq in range(1, 2001):
                yield pb.AppendRequest(seq=seq)

        t = threading.Thread(target=task_thread, daemon=True)
        t.start()
        try:
            seqs = [r.seq async for r in svc.AppendStream(client(), None)]
        finally:
            stop.set()
            t.join()
        assert seqs == list(range(1, 2001))
        assert 1 <= most <= BOUND

    asyncio.run(scenario())
