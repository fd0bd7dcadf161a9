"""Scan pages read ahead on the worker: the next page of a packed scan, before its client asks for it.

A paged scan is a chain: the client learns where page n+1 starts from page n's reply, so without reading
ahead each page pays the worker's read and its thread hops after the request arrives. When the worker
answers a packed page that is not the last, it starts reading the next one on the query threads; the
request for it (same scan, ``after`` = the page's resume point) takes it without a read. A page read ahead
reflects the applied state when it was read, as if its request had come then (its reply says which
``applied_offset``); a scan was never one snapshot. Bounded: at most :data:`MAX_AHEAD` pages wait, each
within a page's bounds, and one not asked for within :data:`AHEAD_TTL_S` is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from conductor.wire import millrace_pb2 as pb

#: pages read ahead and waiting for their request, on one worker
MAX_AHEAD = 4
#: how long a page read ahead waits for its request
AHEAD_TTL_S = 5.0

Read = Callable[[bytes], Awaitable[pb.ScanReply]]


def scan_key(request: pb.ScanRequest, after: bytes) -> bytes:
    """What identifies a page: its request with ``after`` as the resume point."""
    r = pb.ScanRequest()
    r.CopyFrom(request)
    r.after = after
    key: bytes = r.SerializeToString(deterministic=True)
    return key


class ScanPrefetch:
    """The pages read ahead (see the module docstring); used on the worker's event loop only."""

    def __init__(self) -> None:
        self._ahead: OrderedDict[bytes, tuple[float, asyncio.Task[pb.ScanReply]]] = OrderedDict()

    async def page(self, request: pb.ScanRequest, read: Read) -> pb.ScanReply:
        """The page ``request`` asks for (read ahead, or read now by ``read(after)``); the next one is read ahead."""
        got = self._ahead.pop(scan_key(request, request.after), None)
        reply = await got[1] if got is not None else await read(request.after)
        if reply.packed and not reply.done:
            self._drop_old()
            self._ahead[scan_key(request, reply.after)] = (time.monotonic(), asyncio.ensure_future(read(reply.after)))
        return reply

    def _drop_old(self) -> None:
        now = time.monotonic()
        while self._ahead and (len(self._ahead) >= MAX_AHEAD or now - next(iter(self._ahead.values()))[0] > AHEAD_TTL_S):
            _, (_, task) = self._ahead.popitem(last=False)
            task.cancel()  # (waiting for a thread: never runs; reading: its thread finishes the page, unused)
            task.add_done_callback(forget_result)


def forget_result(task: asyncio.Future[pb.ScanReply]) -> None:
    """A done-callback for a page nobody will read (dropped, or its stream closed): its error is nobody's."""
    if not task.cancelled():
        task.exception()
