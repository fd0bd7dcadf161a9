"""Client hot paths without a cluster: append_many framing and the abandonment of calls to a moved leader."""

from __future__ import annotations

import threading

import grpc

from conductor.client.batching import frame_group
from conductor.client.cluster import Cluster


def test_frame_group_keeps_partitions_whole_and_splits_at_the_limit() -> None:
    parts = [(0, [0, 2, 4], [b"a", b"c", b"e"]), (3, [1, 3], [b"b", b"d"]), (5, list(range(10, 17)), [b"x"] * 7)]
    reqs = frame_group("M", "*d", 1, 2, parts, limit=4)
    sizes = [sum(len(d.records) for d in req.appends) for req, _ in reqs]
    assert sizes == [4, 4, 4]
    assert all(req.module == "M" and req.group == 1 and req.ack == 2 for req, _ in reqs)
    # every record exactly once, in partition order, with its input index next to it
    seen = []
    for req, meta in reqs:
        assert [d.task for d in req.appends] == [t for t, _ in meta]
        for d, (_t, idx) in zip(req.appends, meta, strict=True):
            assert len(d.records) == len(idx)
            seen += list(zip(idx, d.records, strict=True))
    assert seen == [(0, b"a"), (2, b"c"), (4, b"e"), (1, b"b"), (3, b"d")] + [(i, b"x") for i in range(10, 17)]


def test_frame_group_one_request_when_under_the_limit() -> None:
    reqs = frame_group("M", "*d", 0, 2, [(0, [0], [b"a"]), (1, [1], [b"b"])], limit=10_000)
    assert len(reqs) == 1 and [d.task for d in reqs[0][0].appends] == [0, 1]


class _FakeCall:
    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


def test_leader_move_abandons_tracked_calls_only_of_that_group() -> None:
    c = Cluster("127.0.0.1:1")  # never connected: only the call registry is used
    try:
        key, other = ("M", 0), ("M", 1)
        a, b = _FakeCall(), _FakeCall()
        c._track(key, a, c._generation[key])
        c._track(other, b, c._generation[other])
        c._abandon("M", 0)
        assert a.cancelled.is_set() and not b.cancelled.is_set()
        assert c._untrack(key, a) is True  # the caller turns this into NotLeader and retries
        assert c._untrack(other, b) is False
        # a call started against the old leader's address after the move is cancelled at once
        late = _FakeCall()
        c._track(key, late, c._generation[key] - 1)
        assert late.cancelled.is_set() and c._untrack(key, late) is True
        assert not c._inflight[key] and not c._abandoned
    finally:
        c._loop.close()


def test_sync_future_cancel_raises_future_cancelled() -> None:
    # The sync fast path relies on a cancelled gRPC future raising FutureCancelledError from result().
    with grpc.insecure_channel("127.0.0.1:9") as ch:
        call = ch.unary_unary("/x.Y/Z").future(b"", timeout=30, wait_for_ready=True)
        call.cancel()
        try:
            call.result()
        except grpc.FutureCancelledError:
            pass
        else:  # pragma: no cover
            raise AssertionError("expected FutureCancelledError")
