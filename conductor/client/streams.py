"""The client's ``AppendStream`` calls: one long-lived stream per group leader instead of a unary call each.

A message on an open stream costs the node about a third of the CPU of a
unary RPC (no call set-up, task, metadata or status) and the round trip about
half. Replies come back in request order, matched by ``seq``; errors come
in-band (:func:`checked`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import grpc

from conductor.client.errors import QueueFull
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import error_from_json


def checked(reply: pb.AppendReply) -> pb.AppendReply:
    """An AppendStream reply, or the error it carries (streams answer errors in-band)."""
    if reply.error:
        raise error_from_json(reply.error)
    return reply


#: how often the client looks for blocking appends past their deadline
DEADLINE_CHECK_S = 0.5


class StreamExpired(grpc.RpcError):  # type: ignore[misc]
    """A blocking append outlived its deadline on a stream (the stream is cancelled)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "no reply before the client's timeout"


class StreamBroken(grpc.RpcError):  # type: ignore[misc]
    """An append stream ended or finished under a request (the node closed it, or it was cancelled).

    UNAVAILABLE, so the requests that shared it are retried like after any broken connection:
    cancelling a stream for one request (its deadline, or its leader moved) must not fail the others.
    """

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the append stream ended"


class SyncAppendStream:
    """One ``AppendStream`` to a group leader, shared by every thread making blocking appends to it.

    Replies come back in request order, matched by ``seq``. There is no reader
    thread: a waiting caller reads replies itself (one at a time), hands others'
    replies to them and stops at its own, so a lone caller pays no thread
    hand-off. (gRPC's request-iterator thread still carries each request out.)
    A broken or cancelled stream fails every request waiting on it with the
    ``grpc.RpcError``; the client then opens a new one. The client's abandonment
    on a leader move and the deadline watchdog both cancel the whole stream,
    which only ever carries one group's requests to one leader.

    At most ``max_waiting`` requests wait on it (so at most as many are queued
    for gRPC's request thread); a caller past that waits for room until its
    deadline, then gets :class:`QueueFull`.
    """

    def __init__(self, channel: grpc.Channel, max_waiting: int = 1024) -> None:
        self.max_waiting = max_waiting
        self._room = threading.BoundedSemaphore(max_waiting)
        #: requests for gRPC's request-iterator thread: at most `max_waiting` (each caller's own, until sent)
        self._requests: queue.SimpleQueue[pb.AppendRequest | None] = queue.SimpleQueue()
        self._call = pbg.ClientStub(channel).AppendStream(iter(self._requests.get, None))
        self._cond = threading.Condition(threading.Lock())
        #: seq -> [reply or exception, deadline]; present while the request waits
        self._waiting: dict[int, list[Any]] = {}
        self._seq = 0
        self._reading = False
        self.broken: BaseException | None = None

    def request(self, req: pb.AppendRequest, deadline: float) -> pb.AppendReply:
        """Send `req` and wait for its reply (or the stream's error) until `deadline` (``time.monotonic``)."""
        start = time.monotonic()
        if not self._room.acquire(timeout=max(0.0, deadline - start)):
            raise QueueFull("blocking appends waiting on one group leader's stream", "max_blocking_appends_per_group",
                            self.max_waiting, time.monotonic() - start)
        try:
            return self._request(req, deadline)
        finally:
            self._room.release()

    def _request(self, req: pb.AppendRequest, deadline: float) -> pb.AppendReply:
        cond = self._cond
        with cond:
            if self.broken is not None:
                raise self.broken
            self._seq += 1
            seq = self._seq
            slot: list[Any] = [None, deadline]
            self._waiting[seq] = slot
        req.seq = seq
        self._requests.put(req)
        with cond:
            while seq in self._waiting:
                if self._reading:
                    cond.wait()
                    continue
                self._reading = True
                cond.release()
                try:
                    reply: Any = next(self._call)
                except StopIteration:
                    reply = StreamBroken()  # the node ended the stream
                except grpc.RpcError as e:
                    reply = e
                finally:
                    cond.acquire()
                    self._reading = False
                if isinstance(reply, BaseException):
                    self._fail_locked(reply)
                else:
                    w = self._waiting.pop(reply.seq, None)
                    if w is not None:
                        w[0] = reply
                cond.notify_all()
        result = slot[0]
        if isinstance(result, BaseException):
            raise result
        reply_out: pb.AppendReply = result
        return reply_out

    def _fail_locked(self, err: BaseException) -> None:
        if self.broken is None:
            self.broken = err
        for w in self._waiting.values():
            w[0] = err
        self._waiting.clear()

    def cancel(self, err: BaseException | None = None) -> None:
        """Fail every request waiting here and end the stream (any thread)."""
        with self._cond:
            self._fail_locked(err if err is not None else StreamBroken())
            self._cond.notify_all()
        self._call.cancel()
        self._requests.put(None)

    def expire(self, now: float) -> None:
        with self._cond:
            late = any(w[1] <= now for w in self._waiting.values())
        if late:
            self.cancel(StreamExpired())


class StreamTicket:
    """One blocking append on a shared stream, as the abandonment registry sees it."""

    __slots__ = ("stream",)

    def __init__(self, stream: SyncAppendStream) -> None:
        self.stream = stream

    def cancel(self) -> None:
        self.stream.cancel()


class AioAppendStream:
    """append_async's requests to one group leader on one ``AppendStream`` (event loop only).

    A message on an open stream costs the node about a third of the CPU of a
    unary RPC. Replies are matched by ``seq``; a broken or cancelled stream
    fails every request waiting on it with the ``grpc.RpcError`` (the client
    then opens a new one).
    """

    def __init__(self, stub: pbg.ClientStub) -> None:
        self.call = stub.AppendStream()
        self.waiting: dict[int, asyncio.Future[pb.AppendReply]] = {}
        self.seq = 0
        self.broken: BaseException | None = None
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.ensure_future(self._read())

    async def request(self, req: pb.AppendRequest) -> pb.AppendReply:
        if self.broken is not None:
            raise self.broken
        self.seq += 1
        seq = req.seq = self.seq
        fut: asyncio.Future[pb.AppendReply] = asyncio.get_running_loop().create_future()
        self.waiting[seq] = fut
        try:
            async with self._write_lock:
                try:
                    await self.call.write(req)
                except asyncio.InvalidStateError:  # the call finished before the reader noticed
                    self._fail(StreamBroken())
                    raise self.broken from None  # type: ignore[misc]
            return await fut
        finally:
            self.waiting.pop(seq, None)
            if fut.done() and not fut.cancelled():
                # Retrieved here when the write failed after `_fail` had set it: the error was raised already,
                # and an unretrieved one is logged from the garbage collector (where Python 3.11's traceback
                # formatting can break an ast.parse that the collection interrupted).
                fut.exception()

    async def _read(self) -> None:
        err: BaseException
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    err = StreamBroken()
                    break
                fut = self.waiting.pop(reply.seq, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except asyncio.CancelledError:
            err = StreamBroken()
        except grpc.RpcError as e:
            err = e
        self._fail(err)

    def _fail(self, err: BaseException) -> None:
        if self.broken is None:
            self.broken = err
        waiting, self.waiting = self.waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(err)

    def cancel(self) -> None:
        self._fail(StreamBroken())
        self.call.cancel()


class AioStreamTicket:
    """One append_async request on a shared stream, as the abandonment registry sees it (any thread)."""

    __slots__ = ("loop", "stream")

    def __init__(self, loop: asyncio.AbstractEventLoop, stream: AioAppendStream) -> None:
        self.loop = loop
        self.stream = stream

    def cancel(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.stream.cancel)
        except RuntimeError:  # the loop is closed: so is the client
            pass
