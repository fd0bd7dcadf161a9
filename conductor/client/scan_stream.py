"""One task group's part of a scan, streamed from its leader: :class:`GroupPages`.

A ``ScanStream`` server stream pushes the group's pages as the worker reads them (two at most on the worker,
then gRPC's flow control: a client that stops reading stops the worker), instead of one request per page.
The stream is opened lazily and reopened where it stopped: a leader move (the client's watch cancels the
call), a deadline, a broken connection or a worker that has no ``ScanStream`` (an older version) make the
next page one ``Scan`` call through the client's call loop, which follows leader moves, retries and raises
the typed errors; the stream is then opened again from that page's resume point (never, for a worker that
has no ``ScanStream``). A page is the same on both paths, so a scan never returns a key twice or skips one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from conductor.client.retry import Retry
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import Unavailable
from replog.errors import NotLeader

if TYPE_CHECKING:
    from conductor.client.cluster import Cluster


class GroupPages:
    """The pages of one group's part of a scan, from ``after`` (b"": its start); ``request(after)`` builds the
    ``ScanRequest`` for the pages after ``after``. Used by one thread; :meth:`close` ends the stream."""

    def __init__(self, c: Cluster, module: str, group: int, request: Callable[[bytes], pb.ScanRequest],
                 after: bytes) -> None:
        self._c, self._module, self._group, self._request = c, module, group, request
        self.after = after
        self.done = False
        #: False once the leader answered UNIMPLEMENTED (a worker without ScanStream): a call per page
        self.streams = True
        self._call: Any = None
        self._replies: Iterator[pb.ScanReply] | None = None

    def open(self) -> None:
        """Start the stream (its worker reads ahead while the caller handles other groups' pages)."""
        if self._call is not None or self.done or not self.streams:
            return
        key = (self._module, self._group)
        try:
            generation, address = self._c._leader(Retry(self._c.timeout_s, f"{self._module}/{self._group}"), key)
            call = self._c._sync_stub(address).ScanStream(self._request(self.after), timeout=self._c.timeout_s)
        except (grpc.RpcError, Unavailable, NotLeader):  # (the next page goes through the call loop)
            return
        self._c._track(key, call, generation)  # a leader move cancels it
        self._call, self._replies = call, iter(call)

    def next(self) -> pb.ScanReply:
        """The next page (not after :attr:`done`)."""
        assert not self.done, (self._module, self._group)
        self.open()
        reply = None
        if self._replies is not None:
            try:
                reply = next(self._replies)
            except StopIteration:  # (ended without its last page: the worker went away)
                self.close()
            except grpc.RpcError as e:
                self.close()
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self.streams = False
        if reply is None:  # one page through the call loop (leader moves, retries, typed errors)
            reply = self._c._call_sync(self._module, self._group, "Scan", self._request(self.after))
        self.done = reply.done
        self.after = reply.after
        if self.done:
            self.close()
        return reply

    def close(self) -> None:
        if self._call is not None:
            self._c._untrack((self._module, self._group), self._call)
            self._call.cancel()
        self._call = self._replies = None
