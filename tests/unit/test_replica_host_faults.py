"""A replica's task thread under faults (real replog and RocksDB, a one-replica group, no network).

One request that cannot be built fails alone and the thread goes on; an entry
over ``replication.max.entry.bytes`` is refused before it is logged; anything
else that goes wrong stops the replica as a fault (internal, corrupt) with its
waiting appends failed retryably and its RocksDB released for the restart. On
a task thread shared by several replicas, the fault stops that replica alone.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from conductor.worker.inbox import Fail
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_status import replica_status
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.task_thread import TaskThread
from pstate import TaskGroupStore
from pstate.errors import CorruptStore
from replog.config import ReplicationConfig
from replog.errors import AppendFailed, EntryTooLarge, NotLeader, ReplicaFailed
from replog.messages import Ack, GroupState, MetastoreChanged
from topology import load_module
from topology.entries.port import EntryPort
from topology.entries.requests import DepotAppend, EntryRequest

DEFINITION = load_module("examples.clicks:Clicks").build()


#: a request whose building raises what no request should (a bug in building that one entry)
BROKEN = DepotAppend([("*raw", 0, [b"broken"])])


class _Entries(EntryPort):
    """The replica's entry port, except that :data:`BROKEN` raises a KeyError."""

    def __init__(self, store: ReplicaStore) -> None:
        super().__init__(store.current, store.code)

    def build(self, request: EntryRequest) -> tuple[Any, Any]:
        if request is BROKEN:
            raise KeyError("a bug in building this one request")
        return super().build(request)


def _open(directory: Path, group: int, faults: list[ReplicaHost], runner: TaskThread | None = None) -> ReplicaHost:
    directory.mkdir()
    pstates = {name: decl.schema for name, decl in DEFINITION.pstates.items()}
    store = ReplicaStore(TaskGroupStore(directory / "state", pstates, DEFINITION.depot_names()))
    config = ReplicationConfig(replication_factor=1, max_record_bytes=1000, max_entry_bytes=4000)
    def cas(h: ReplicaHost, _version: int, new: GroupState) -> None:  # the group znode: every CAS succeeds
        h.post(MetastoreChanged(new))

    if runner is None:
        runner = TaskThread(f"task-Clicks/{group}", dedicated=True)
    runner.claim()
    h = ReplicaHost("n1", "Clicks", group, directory, config, 1, store, lambda *_a: None, cas,
                    on_fault=faults.append, task_thread=runner, entries=_Entries(store))
    h.start()
    h.post(MetastoreChanged(GroupState("n1", 1, ("n1",), (), 1, 1)))
    return h


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[ReplicaHost, list[ReplicaHost]]]:
    faults: list[ReplicaHost] = []
    h = _open(tmp_path / "g", 0, faults)
    yield h, faults
    h.stop()


def _append(h: ReplicaHost, request: EntryRequest) -> concurrent.futures.Future[int]:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()

    def done(first: int, _result: Any, error: Exception | None) -> None:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(first)
    h.post(PendingEntry(request, 10, Ack.APPLIED, done))
    return fut


def _records(h: ReplicaHost, *records: Any) -> EntryRequest:
    return DepotAppend([("*raw", 0, [msgpack.packb(r) for r in records])])


def _leading(h: ReplicaHost) -> None:
    for _ in range(500):
        if h.replica.is_leader:
            return
        time.sleep(0.01)
    raise AssertionError("the replica did not take leadership")


def test_a_request_that_raises_fails_alone_and_the_thread_goes_on(host: Any) -> None:
    h, faults = host
    _leading(h)
    bad = _append(h, BROKEN)
    good = _append(h, _records(h, {"id": 1}))
    with pytest.raises(AppendFailed, match="KeyError"):
        bad.result(timeout=10)
    assert good.result(timeout=10) == 0
    assert _append(h, _records(h, {"id": 2})).result(timeout=10) == 1
    assert not faults and h.fault is None


def test_an_entry_over_max_entry_bytes_is_refused_before_it_is_logged(host: Any) -> None:
    h, faults = host
    _leading(h)
    end = h.log.end_offset
    with pytest.raises(EntryTooLarge, match=r"replication\.max\.entry\.bytes") as e:
        _append(h, _records(h, *[{"id": i, "pad": "x" * 900} for i in range(6)])).result(timeout=10)
    assert e.value.what == "entry" and e.value.size > 4000
    assert h.log.end_offset == end
    assert _append(h, _records(h, {"id": "small"})).result(timeout=10) == end
    assert not faults


def test_an_internal_error_stops_the_replica_as_a_fault_and_releases_its_store(host: Any, tmp_path: Path) -> None:
    h, faults = host
    _leading(h)
    assert _append(h, _records(h, {"id": 1})).result(timeout=10) == 0

    h.post(Fail(RuntimeError("a bug outside any one request")))  # (raised on the task thread, as a bug would be)
    h.thread.join(timeout=10)
    assert not h.thread.is_alive() and faults == [h]
    assert h.fault is not None and h.fault.kind == "internal" and "RuntimeError" in h.fault.reason
    assert replica_status(h)["failed"] and replica_status(h)["fault"] is h.fault
    # the store was released: the restart can open it, and it holds what was applied (or the replog replays it)
    reopened = TaskGroupStore(tmp_path / "g" / "state", {}, DEFINITION.depot_names())
    try:
        assert reopened.applied_offset in (-1, 0)
    finally:
        reopened.close()


def test_damage_reported_by_a_read_is_a_corrupt_fault(host: Any) -> None:
    h, faults = host
    _leading(h)
    h.report(CorruptStore("state", "block checksum mismatch"))
    h.thread.join(timeout=10)
    assert faults == [h] and h.fault is not None and h.fault.kind == "corrupt"
    assert issubclass(ReplicaFailed, NotLeader)  # clients retry it at the next leader


def test_on_a_shared_task_thread_a_fault_stops_that_replica_alone(tmp_path: Path) -> None:
    runner = TaskThread("task-test")
    faults: list[ReplicaHost] = []
    a, b = _open(tmp_path / "a", 0, faults, runner), _open(tmp_path / "b", 1, faults, runner)
    try:
        assert a.thread is b.thread is runner.thread and runner.load == 2
        _leading(a)
        _leading(b)
        assert _append(a, _records(a, {"id": 1})).result(timeout=10) == 0
        assert _append(b, _records(b, {"id": 1})).result(timeout=10) == 0

        a.post(Fail(RuntimeError("a bug outside any one request")))
        assert a.closed.wait(timeout=10) and faults == [a] and a.fault is not None
        # the other replica on the same thread goes on, and the thread no longer counts the failed one
        assert [_append(b, _records(b, {"id": i})).result(timeout=10) for i in (2, 3)] == [1, 2]
        assert b.fault is None and runner.thread.is_alive() and runner.load == 1
    finally:
        b.stop()
        a.stop()
    assert b.closed.is_set() and runner.load == 0
    runner.stop()
    runner.thread.join(timeout=10)
    assert not runner.thread.is_alive()


def test_a_dedicated_task_thread_ends_with_its_replica_or_when_it_never_started(tmp_path: Path) -> None:
    """``--task-threads 0``: each replica's thread ends with it, including one released before it started
    (recovery's reopen that finds the module gone)."""
    h = _open(tmp_path / "g", 0, [])
    assert h.task_thread.dedicated and h.task_thread.load == 1
    _leading(h)
    assert _append(h, _records(h, {"id": 1})).result(timeout=10) == 0
    h.stop()
    h.thread.join(timeout=10)
    assert h.closed.is_set() and not h.thread.is_alive() and h.task_thread.load == 0
    never = TaskThread("task-never", dedicated=True)
    never.claim()
    never.release()
    never.thread.join(timeout=10)
    assert not never.thread.is_alive()


def test_a_shared_task_thread_overlaps_its_replicas_fsyncs_and_a_failed_one_stops_that_replica_alone(
        tmp_path: Path) -> None:
    """Replicas posted to while their thread was busy step in one pass: the fsync of each but the last runs on a
    helper thread while the next one's drain goes on here (issue 32: a worker's groups replicating at once
    fsynced in series; here the next one has a client append to build, so the first one's drain ends before
    that build starts). An fsync that fails on the helper thread is that replica's fault, raised on the task
    thread; the others go on."""
    runner = TaskThread("task-test")
    faults: list[ReplicaHost] = []
    a, b, c = (_open(tmp_path / n, g, faults, runner) for g, n in enumerate("abc"))
    synced: list[tuple[str, str]] = []
    release = threading.Event()
    failing: set[str] = set()

    def recorded(h: ReplicaHost, name: str) -> None:
        written = h.durability.written

        def written_here(config: ReplicationConfig, now: int) -> tuple[float, float]:
            synced.append((name, threading.current_thread().name))
            if name == "c" and not release.is_set():
                assert release.wait(10)  # holds the task thread while the others are posted to
            if name in failing:
                raise OSError(5, "Input/output error")
            return written(config, now)
        h.durability.written = written_here  # type: ignore[method-assign]

    def busy_while(*posts: Callable[[], concurrent.futures.Future[int]]) -> list[concurrent.futures.Future[int]]:
        """``posts`` made while the task thread is in c's fsync (it runs them in the pass after it)."""
        release.clear()
        seen = len(synced)
        first = _append(c, _records(c, {"id": seen}))
        while len(synced) == seen:
            time.sleep(0.005)
        out = [first, *(post() for post in posts)]
        release.set()
        return out
    try:
        for h, name in ((a, "a"), (b, "b"), (c, "c")):
            _leading(h)
            recorded(h, name)
        futs = busy_while(lambda: _append(a, _records(a, {"id": 0})), lambda: _append(b, _records(b, {"id": 0})))
        assert [f.result(timeout=10) for f in futs] == [0, 0, 0]
        assert synced == [("c", "task-test"), ("a", "task-test-fsync_0"), ("b", "task-test")]
        failing.add("a")
        lost, kept = busy_while(lambda: _append(a, _records(a, {"id": 1})), lambda: _append(b, _records(b, {"id": 1})))[1:]
        with pytest.raises(ReplicaFailed):
            lost.result(timeout=10)
        assert a.closed.wait(timeout=10) and faults == [a] and a.fault is not None
        assert kept.result(timeout=10) == 1 and _append(b, _records(b, {"id": 2})).result(timeout=10) == 2
        assert b.fault is None and c.fault is None and runner.load == 2
    finally:
        release.set()
        for h in (a, b, c):
            h.stop()
    runner.stop()
    runner.thread.join(timeout=10)
