"""A replica's feed (conductor.worker.subscriptions): one diff per topic and entry, bounded queues, resume."""

from __future__ import annotations

import asyncio
from typing import Any

from conductor.worker.replica_store import ReplicaStore
from conductor.worker.subscriptions import AppliedFeed, Subscriber
from pstate import Map, TaskGroupStore
from pstate.diffs import DIFFS, RESYNC, VALUE, Watch, unpack_event
from pstate.store import pstate_cf


def _store(tmp_path: Any) -> ReplicaStore:
    return ReplicaStore(TaskGroupStore(tmp_path / "s", {"$$counts": Map(str, int)}))


def _entry(rs: ReplicaStore, offset: int, key: str, n: int) -> tuple[int, int, bytes]:
    cs = rs.store.changes()
    cs.set("$$counts", key, n)
    return offset, 0, cs.encode()


def _subscribe(rs: ReplicaStore, posted: list[Any], from_offset: int = -1) -> tuple[Subscriber, list[bytes]]:
    watch = Watch.of(pstate_cf("$$counts"), rs.store.schemas["$$counts"], "k")
    return rs.feed.subscribe("$$counts", "k", watch, from_offset, lambda: rs.read_applied("$$counts", "k"),
                             lambda fn, *a: posted.append((fn, a)))


def _deliver(posted: list[Any]) -> None:
    for fn, args in posted:
        fn(*args)
    posted.clear()


def test_one_encoded_diff_reaches_every_subscriber(tmp_path: Any) -> None:
    async def main() -> None:
        rs = _store(tmp_path)
        posted: list[Any] = []
        subs = [_subscribe(rs, posted) for _ in range(100)]
        assert all(unpack_event(first[0]) == (VALUE, -1, None) for _, first in subs)
        rs.apply_entries([_entry(rs, 0, "k", 1), _entry(rs, 1, "other", 5), _entry(rs, 2, "k", 2)])
        assert len(posted) == 1  # one hand-off to the loop per apply call
        _deliver(posted)
        events = [s.take(10) for s, _ in subs]
        assert all(e is events[0][0] for batch in events for e in batch[:1])  # the same bytes, not copies
        assert [unpack_event(e) for e in events[0]] == [(DIFFS, 0, [["set", [], 1]]), (DIFFS, 2, [["set", [], 2]])]
        rs.close()
    asyncio.run(main())


def test_a_slow_subscriber_is_resynchronised_not_buffered(tmp_path: Any) -> None:
    async def main() -> None:
        rs = _store(tmp_path)
        posted: list[Any] = []
        s, _ = _subscribe(rs, posted)
        s.bound = 8
        for i in range(50):
            rs.apply_entries([_entry(rs, i, "k", i)])
            _deliver(posted)
            assert len(s.queue) <= 8
        assert s.resync and not s.queue
        rs.close()
    asyncio.run(main())


def test_resume_replays_the_ring_or_resyncs(tmp_path: Any) -> None:
    async def main() -> None:
        rs = _store(tmp_path)
        rs.feed.ring_entries = 5
        for i in range(10):
            rs.apply_entries([_entry(rs, i, "k", 100 + i)])
        posted: list[Any] = []
        s, first = _subscribe(rs, posted, from_offset=6)
        assert [unpack_event(e)[:2] for e in first] == [(DIFFS, 7), (DIFFS, 8), (DIFFS, 9)] and s.last == 9
        s, first = _subscribe(rs, posted, from_offset=2)  # the ring no longer reaches back to 3
        assert [unpack_event(e) for e in first] == [(RESYNC, 9, 109)] and s.last == 9
        s, first = _subscribe(rs, posted, from_offset=12)  # ahead of this replica: nothing until it applies 13
        assert first == [] and s.last == 12
        rs.close()
    asyncio.run(main())


def test_ring_is_bounded_by_bytes(tmp_path: Any) -> None:
    feed = AppliedFeed(lambda p, k: None, ring_entries=1000, ring_bytes=1000)
    for i in range(100):
        feed.applied(i, None, 100)
    assert feed.stats()["ring_entries"] == 10
