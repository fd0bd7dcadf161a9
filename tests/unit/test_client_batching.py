"""append_async's batching: a sticky partitioner keeps one task per batch window; linger and batch size are options.

No cluster: ``Depot.append_async`` goes through the real routing, hand-off and
batcher to a fake leader call that records each request; the event loop is held
while a burst is queued so the burst is one batch window.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from conductor.client.batching import StickyTasks, append_request
from conductor.client.cluster import Cluster
from conductor.client.handles import Depot
from conductor.wire import millrace_pb2 as pb
from topology.partitioners import Partitioner

TASKS = 6
GROUPS = 3


class _Leader:
    """Stands for every group leader's AppendStream: records each request and answers it at once."""

    def __init__(self) -> None:
        self.requests: list[pb.AppendRequest] = []
        self.sent_at: list[float] = []

    async def append(self, module: str, group: int, request: pb.AppendRequest) -> pb.AppendReply:
        self.requests.append(request)
        self.sent_at.append(time.monotonic())
        return pb.AppendReply(first_offsets=[0] * len(request.appends))

    def tasks(self) -> list[list[int]]:
        """The tasks of each request, in the order sent."""
        return [[d.task for d in r.appends] for r in self.requests]


def _client(partitioner: Partitioner, **options: float) -> tuple[Cluster, _Leader]:
    c = Cluster("127.0.0.1:1", **options)  # type: ignore[arg-type]  # (never connected)
    c._thread.start()
    meta = SimpleNamespace(definition=SimpleNamespace(depots={"*d": SimpleNamespace(partitioner=partitioner)}),
                           spec=SimpleNamespace(tasks=TASKS, group_of=lambda t: t % GROUPS))
    c._module = lambda module: meta  # type: ignore[assignment,method-assign,return-value]
    leader = _Leader()
    c._append_aio = leader.append  # type: ignore[method-assign]
    return c, leader


@pytest.fixture
def counting() -> Iterator[tuple[Cluster, _Leader, list[int]]]:
    """A client whose depot's sticky partitioner chooses tasks 0, 1, 2, ... in turn (and counts its calls)."""
    chosen: list[int] = []
    turn = itertools.count()

    def choose(_record: object, tasks: int) -> int:
        chosen.append(next(turn) % tasks)
        return chosen[-1]

    c, leader = _client(Partitioner("turns", choose, sticky=True))
    yield c, leader, chosen
    c.close()


def _burst(c: Cluster, n: int) -> list[int]:
    """append_async ``n`` records while the event loop is held, so they meet the batcher together; offsets."""
    hold = threading.Event()
    c._loop.call_soon_threadsafe(hold.wait)
    try:
        futs = [Depot(c, "M", "*d").append_async({"i": i}) for i in range(n)]
    finally:
        hold.set()
    return [f.result(timeout=5) for f in futs]


def test_a_sticky_partitioner_keeps_one_task_per_batch_window(counting: tuple[Cluster, _Leader, list[int]]) -> None:
    c, leader, chosen = counting
    for _ in range(4):
        _burst(c, 50)
    # each burst: one choice, one request of 50 records to that one task (one entry on one group)
    assert chosen == [0, 1, 2, 3]
    assert leader.tasks() == [[0], [1], [2], [3]]
    assert [len(r.appends[0].records) for r in leader.requests] == [50] * 4


def test_the_window_ends_only_when_its_batch_leaves(counting: tuple[Cluster, _Leader, list[int]]) -> None:
    c, leader, chosen = counting
    depot = Depot(c, "M", "*d")
    hold = threading.Event()
    c._loop.call_soon_threadsafe(hold.wait)
    first = [depot.append_async(i) for i in range(3)]
    assert chosen == [0]  # the loop is held: the batch has not left, every record stays on task 0
    hold.set()
    assert [f.result(timeout=5) for f in first] == [0, 1, 2]
    depot.append_async(3).result(timeout=5)  # the first batch left: a new window, a new choice
    assert chosen == [0, 1] and leader.tasks() == [[0], [1]]


def test_a_record_keyed_partitioner_still_routes_each_record() -> None:
    c, leader = _client(Partitioner("by_i", lambda r, tasks: r["i"] % tasks))
    try:
        _burst(c, 40)  # a burst meets each group's batcher: one request per group, each record on its own task
        assert len(leader.requests) == GROUPS
        for r in leader.requests:
            assert len({d.task % GROUPS for d in r.appends}) == 1
            for d in r.appends:
                assert len(d.records) == len(range(d.task, 40, TASKS))
    finally:
        c.close()


def test_sticky_tasks_end_a_window_only_for_its_own_task() -> None:
    s = StickyTasks()
    assert s.task("M", "*d", lambda: 4) == 4
    assert s.task("M", "*d", lambda: 5) == 4  # the window is open
    s.left("M", "*d", 2)  # a batch of another task (chosen by an earlier window) left
    assert s.task("M", "*d", lambda: 5) == 4
    s.left("M", "*d", 4)
    assert s.task("M", "*d", lambda: 5) == 5
    assert s.task("M", "*e", lambda: 1) == 1  # one window per depot


def test_max_batch_records_splits_a_burst_into_requests_of_that_size() -> None:
    c, leader = _client(Partitioner("one", lambda _r, _t: 0, sticky=True), max_batch_records=10)
    try:
        assert sorted(_burst(c, 25)) == sorted([*range(10), *range(10), *range(5)])  # (each request from 0)
        assert sorted(len(r.appends[0].records) for r in leader.requests) == [5, 10, 10]
    finally:
        c.close()


def test_linger_ms_holds_a_lone_record_that_long_and_batches_what_comes_meanwhile() -> None:
    c, leader = _client(Partitioner("one", lambda _r, _t: 0, sticky=True), linger_ms=300)
    try:
        depot = Depot(c, "M", "*d")
        start = time.monotonic()
        futs = [depot.append_async(0)]
        time.sleep(0.1)
        assert not leader.requests  # still lingering
        futs += [depot.append_async(i) for i in range(1, 5)]
        for f in futs:
            f.result(timeout=5)
        assert len(leader.requests) == 1 and len(leader.requests[0].appends[0].records) == 5
        assert leader.sent_at[0] - start >= 0.28
    finally:
        c.close()


@pytest.mark.parametrize("option", [{"linger_ms": -1}, {"max_batch_records": 0}, {"max_inflight_per_group": 0}])
def test_batching_options_out_of_range_are_refused(option: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Cluster("127.0.0.1:1", **option)  # type: ignore[arg-type]


@pytest.mark.parametrize("timestamp_ms", [None, 0, 1_700_000_000_000])
def test_an_append_request_built_in_place_is_the_request_built_from_parts(timestamp_ms: int | None) -> None:
    """append_request adds each part to the request's own repeated field (no serialize-and-parse merge of a
    DepotRecords built apart); on the wire it is the same request, timestamp presence included."""
    parts = [("*raw", 4, [b"\x01", b"\xa1x" * 50]), ("*clicks", 1, [b"\x02"])]
    req = append_request("Clicks", 1, pb.ACK_APPLIED, parts, timestamp_ms)
    old = pb.AppendRequest(module="Clicks", group=1, ack=pb.ACK_APPLIED, timestamp_ms=timestamp_ms, appends=[
        pb.DepotRecords(depot=d, task=t, records=r) for d, t, r in parts])
    assert req.SerializeToString() == old.SerializeToString()
    assert req.HasField("timestamp_ms") == (timestamp_ms is not None)
