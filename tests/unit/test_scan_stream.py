"""Streamed scans without a cluster: a group's pages across stream failures, turns and resume tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import msgpack
import pytest

from conductor.client.errors import ClientError
from conductor.client.queries import _next_turn, _resume_point
from conductor.client.scan_stream import GroupPages
from conductor.wire import millrace_pb2 as pb
from pstate.keys import encode_key
from pstate.packed_page import pack_page, top_keys, unpack_pairs


class _Broken(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class _Call:
    """A ScanStream call: the pages from ``after``, or ``fail`` after ``good`` of them."""

    def __init__(self, pages: dict[bytes, pb.ScanReply], after: bytes, good: int, fail: grpc.StatusCode | None):
        self.pages, self.after, self.good, self.fail = pages, after, good, fail
        self.cancelled = False

    def __iter__(self) -> Iterator[pb.ScanReply]:
        after = self.after
        for _ in range(self.good):
            reply = self.pages[after]
            yield reply
            if reply.done:
                return
            after = reply.after
        if self.fail is not None:
            raise _Broken(self.fail)

    def cancel(self) -> None:
        self.cancelled = True


class _Cluster:
    """What GroupPages uses of a Cluster: a leader, a stub, the watch, and the call loop (unary Scan)."""

    timeout_s = 5.0

    def __init__(self, pages: dict[bytes, pb.ScanReply], good: int, fail: grpc.StatusCode | None) -> None:
        self.pages, self.good, self.fail = pages, good, fail
        self.streams: list[_Call] = []
        self.unary: list[bytes] = []
        self.tracked: set[int] = set()

    def _leader(self, r: Any, key: Any) -> tuple[int, str]:
        return 0, "here"

    def _sync_stub(self, address: str) -> Any:
        cluster = self

        class Stub:
            def ScanStream(self, request: pb.ScanRequest, timeout: float) -> _Call:
                call = _Call(cluster.pages, request.after, cluster.good, cluster.fail)
                cluster.streams.append(call)
                return call

        return Stub()

    def _track(self, key: Any, call: Any, generation: int) -> None:
        self.tracked.add(id(call))

    def _untrack(self, key: Any, call: Any) -> bool:
        self.tracked.discard(id(call))
        return False

    def _call_sync(self, module: str, group: int, method: str, request: pb.ScanRequest) -> pb.ScanReply:
        assert method == "Scan"
        self.unary.append(request.after)
        return self.pages[request.after]


def _chain(n: int) -> dict[bytes, pb.ScanReply]:
    """n pages: page i resumes at b"i+1" (the last is done)."""
    afters = [b""] + [b"%d" % i for i in range(1, n)]
    return {a: pb.ScanReply(items=msgpack.packb([i]), after=b"" if i == n - 1 else afters[i + 1], done=i == n - 1)
            for i, a in enumerate(afters)}


def _read(c: _Cluster) -> list[int]:
    g = GroupPages(c, "M", 0, lambda after: pb.ScanRequest(module="M", after=after), b"")  # type: ignore[arg-type]
    out = []
    while not g.done:
        out.append(msgpack.unpackb(g.next().items)[0])
    assert not c.tracked  # every stream let go of
    return out


def test_a_stream_that_breaks_goes_on_where_it_stopped_through_the_call_loop() -> None:
    c = _Cluster(_chain(7), good=2, fail=grpc.StatusCode.UNAVAILABLE)
    assert _read(c) == list(range(7))  # every page once, in order
    assert c.unary == [b"2", b"5"] and len(c.streams) == 3  # a page by Scan after each break, then a new stream
    assert all(s.cancelled for s in c.streams)


def test_a_worker_without_scan_stream_is_asked_a_page_per_call() -> None:
    c = _Cluster(_chain(4), good=0, fail=grpc.StatusCode.UNIMPLEMENTED)
    assert _read(c) == list(range(4))
    assert len(c.streams) == 1 and c.unary == [b"", b"1", b"2", b"3"]


def test_a_whole_stream_needs_no_call() -> None:
    c = _Cluster(_chain(5), good=10, fail=None)
    assert _read(c) == list(range(5)) and c.unary == [] and len(c.streams) == 1


def test_turns_go_round_the_groups_not_done() -> None:
    class G:
        def __init__(self, done: bool) -> None:
            self.done = done

    groups: Any = [G(False), G(True), G(False)]
    assert _next_turn(groups, 0) == 2 and _next_turn(groups, 2) == 0
    groups[0].done = groups[2].done = True
    assert _next_turn(groups, 2) == 2  # all done: the loop ends


def test_tokens_resume_and_old_tokens_still_do() -> None:
    assert _resume_point(msgpack.packb([1, [None, b"x", b""]]), 3) == (1, [None, b"x", b""])
    assert _resume_point(msgpack.packb([1, b"x"]), 3) == (1, [None, b"x", b""])  # [index, after]: before streams
    for bad in ([3, [None, None, b""]], [0, [None, b"", b""]], [0, [b""]], [0, b"x", 1]):
        with pytest.raises(ClientError):
            _resume_point(msgpack.packb(bad), 3)
    with pytest.raises(ClientError, match="not a scan token"):
        _resume_point(b"\xc1", 3)


def test_str_typed_pages_pack_and_decode_like_the_checked_way() -> None:
    keys = ["a", "\ud800x", "é" * 3, "k" * 40]
    raw = [b"\x02" + encode_key(k) for k in sorted(keys)]
    vals = [msgpack.packb(i) for i in range(len(raw))]
    assert pack_page(raw, vals, str_typed=True) == pack_page(raw, vals)
    assert unpack_pairs(pack_page(raw, vals, str_typed=True)) == list(zip(sorted(keys), range(len(raw)), strict=True))
    assert top_keys(raw, str_typed=True) == sorted(keys)
    nul = [b"\x02" + encode_key(k) for k in ("a\x00b", "c")]  # an escaped NUL: never the str fast path
    assert pack_page(nul, vals[:2], str_typed=True).str_keys == b"" and top_keys(nul, True) == ["a\x00b", "c"]
