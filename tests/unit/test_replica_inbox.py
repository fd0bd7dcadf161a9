"""A replica's inbox is typed and bounded, with one behaviour per kind when full (conductor.worker.inbox):
appends are refused with Backpressure, peer messages are dropped and counted, control is never dropped
(coalesced, and asserted to stay small). A task thread's ready replicas are bounded by its load."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from conductor.worker.inbox import Fail, ReplicaInbox
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.task_thread import LoopWakes, TaskThread
from pstate import TaskGroupStore
from replog.config import ReplicationConfig
from replog.errors import Backpressure
from replog.messages import (
    Ack,
    ConfigChanged,
    GroupState,
    IsrChanged,
    MetastoreChanged,
    ReplicateAck,
    SessionExpired,
    SessionStarted,
)
from topology import load_module
from topology.entries.port import EntryPort


def _entry(nbytes: int = 10) -> PendingEntry:
    return PendingEntry(lambda: (None, None), nbytes, Ack.NONE, lambda *_a: None)


def _state(version: int) -> GroupState:
    return GroupState("n1", 1, ("n1",), (), version, 1)


def test_appends_over_the_bound_are_refused_with_backpressure_until_a_drain() -> None:
    inbox = ReplicaInbox("M/0")
    assert all(inbox.put_append(_entry(), 3, 1000) is None for _ in range(3))
    refused = inbox.put_append(_entry(), 3, 1000)
    assert isinstance(refused, Backpressure) and "replication.max.unapplied.entries=3" in str(refused)
    assert len(inbox.drain()) == 3
    assert inbox.put_append(_entry(), 3, 1000) is None  # room again once the task thread took them


def test_appends_over_the_byte_bound_are_refused_but_one_alone_always_waits() -> None:
    inbox = ReplicaInbox("M/0")
    assert inbox.put_append(_entry(5000), 10, 1000) is None  # (alone: refusing it would refuse it forever)
    refused = inbox.put_append(_entry(1), 10, 1000)
    assert isinstance(refused, Backpressure) and "replication.max.unapplied.bytes=1000" in str(refused)


def test_peer_messages_over_the_bound_are_dropped_and_counted_control_is_not() -> None:
    inbox = ReplicaInbox("M/0", peer_bound=4)
    acks = [ReplicateAck("n2", "n1", 1, i, i + 1) for i in range(6)]
    assert [inbox.put(a) for a in acks] == [True] * 4 + [False] * 2
    assert inbox.dropped == 2
    assert inbox.put(IsrChanged(_state(2)))  # control still goes in with the peer bound full
    assert inbox.drain() == [*acks[:4], IsrChanged(_state(2))]
    assert inbox.put(acks[5]) and inbox.dropped == 2  # the bound counts what waits, not what went through


def test_control_is_coalesced_the_latest_group_state_wins() -> None:
    inbox = ReplicaInbox("M/0")
    ack = ReplicateAck("n2", "n1", 1, 0, 1)
    inbox.put(MetastoreChanged(_state(1)))
    inbox.put(ConfigChanged(ReplicationConfig(min_isr=1)))
    inbox.put(ack)
    inbox.put(MetastoreChanged(_state(3)))
    inbox.put(ConfigChanged(ReplicationConfig(min_isr=2)))
    assert inbox.drain() == [ack, MetastoreChanged(_state(3)), ConfigChanged(ReplicationConfig(min_isr=2))]
    # a session event equal to the newest waiting one is a duplicate; the order of the others stays
    for ev in (SessionExpired(), SessionExpired(), SessionStarted(7), SessionStarted(7), SessionExpired()):
        inbox.put(ev)
    assert inbox.drain() == [SessionExpired(), SessionStarted(7), SessionExpired()]
    first, second = Fail(RuntimeError("first")), Fail(RuntimeError("second"))
    inbox.put(first)
    inbox.put(second)
    assert inbox.drain() == [first]  # one fault stops the replica: the first report says why


def test_control_that_does_not_coalesce_is_asserted_to_stay_under_its_bound() -> None:
    inbox = ReplicaInbox("M/0", control_bound=3)
    for v in range(3):
        inbox.put(IsrChanged(_state(v + 1)))
    with pytest.raises(AssertionError):
        inbox.put(IsrChanged(_state(9)))


class _Scripted(EntryPort):
    """An entry port whose requests are the test's own functions returning (builder, result)."""

    def build(self, request: Any) -> tuple[Any, Any]:
        result: tuple[Any, Any] = request()
        return result


def test_a_replica_refuses_an_append_over_its_inbox_bound_at_once(tmp_path: Path) -> None:
    """End to end on a replica host: while its task thread is busy, appends past the bound fail with
    Backpressure on the posting thread; those that waited are built once the thread is free."""
    definition = load_module("examples.clicks:Clicks").build()
    store = ReplicaStore(TaskGroupStore(tmp_path / "state", {}, definition.depot_names()))
    config = ReplicationConfig(replication_factor=1, max_unapplied_entries=3)
    runner = TaskThread("task-test", dedicated=True)
    runner.claim()

    def cas(h: ReplicaHost, _version: int, new: GroupState) -> None:
        h.post(MetastoreChanged(new))
    h = ReplicaHost("n1", "Clicks", 0, tmp_path, config, 1, store, lambda *_a: None, cas, task_thread=runner,
                    entries=_Scripted(store.current, store.code))
    h.start()
    h.post(MetastoreChanged(GroupState("n1", 1, ("n1",), (), 1, 1)))
    try:
        for _ in range(500):
            if h.replica.is_leader:
                break
            threading.Event().wait(0.01)
        busy, free = threading.Event(), threading.Event()

        def blocking() -> tuple[Any, Any]:
            busy.set()
            assert free.wait(10)
            return None, "built"
        answers: list[tuple[Any, Exception | None]] = []

        def done(_first: int, result: Any, error: Exception | None) -> None:
            answers.append((result, error))
        h.post(PendingEntry(blocking, 1, Ack.NONE, done))
        assert busy.wait(10)
        for _ in range(4):
            h.post(PendingEntry(lambda: (None, "built"), 1, Ack.NONE, done))
        assert len(answers) == 1 and isinstance(answers[0][1], Backpressure)
        free.set()
        h.post(MetastoreChanged(GroupState("n1", 1, ("n1",), (), 1, 1)))  # (any post: the thread steps again)
        for _ in range(500):
            if len(answers) == 5:
                break
            threading.Event().wait(0.01)
        assert [r for r, e in answers[1:]] == ["built"] * 4 and all(e is None for _r, e in answers[1:])
    finally:
        h.stop()
    # closed, it takes nothing more: an append is answered at once, as those waiting when it closed were
    late: list[Exception | None] = []
    h.post(PendingEntry(lambda: (None, None), 1, Ack.NONE, lambda _f, _r, e: late.append(e)))
    h.post(MetastoreChanged(GroupState("n1", 1, ("n1",), (), 2, 1)))
    assert len(late) == 1 and "closing" in str(late[0]) and h.inbox.waiting() == 0


class _Stub:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = threading.Event()


def test_a_task_threads_ready_replicas_hold_each_at_most_once_and_never_more_than_its_load() -> None:
    tt = TaskThread("task-test")
    tt.stop()
    tt.thread.join(timeout=10)  # (nothing takes the ready replicas from here on)
    a: Any = _Stub("a")
    b: Any = _Stub("b")
    tt.claim()
    tt.wake(a)
    tt.wake(a)
    assert list(tt._ready) == [a]
    b.closed.set()
    tt.wake(b)  # a closed replica is not stepped again
    assert list(tt._ready) == [a]
    b.closed.clear()
    with pytest.raises(AssertionError):
        tt.wake(b)  # more ready replicas than the thread was given
    tt.release(a)
    assert not tt._ready and tt.load == 0


def test_posts_on_the_event_loop_wake_the_task_thread_once_its_iteration_is_over() -> None:
    wakes = LoopWakes()
    tt = TaskThread("task-test", wakes=wakes)
    tt.stop()
    tt.thread.join(timeout=10)  # (nothing takes the ready replicas from here on)
    a: Any = _Stub("a")
    b: Any = _Stub("b")
    a.task_thread = b.task_thread = tt
    tt.claim()
    tt.claim()
    seen: list[list[Any]] = []

    async def burst() -> None:
        wakes.bind(asyncio.get_running_loop())
        tt.wake_soon(a)
        tt.wake_soon(b)
        tt.wake_soon(a)
        seen.append(list(tt._ready))  # deferred: nothing is ready while this callback runs
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen.append(list(tt._ready))  # the next iteration woke each replica once

    asyncio.run(burst())
    assert seen == [[], [a, b]]
    tt.release(a)
    tt.release(b)
    off_loop = threading.Thread(target=tt.wake_soon, args=(a,))  # another thread: at once
    tt.claim()
    off_loop.start()
    off_loop.join()
    assert list(tt._ready) == [a]


def test_a_task_threads_pass_steps_the_replicas_posted_to_first_in_the_order_they_were_posted_to() -> None:
    """Not the order they were added in: a destination leader's envelopes that came first must not wait behind
    the fsyncs of follower steps posted to after them (issue 32). The others follow (a deadline may be due)."""
    tt = TaskThread("task-test")
    tt.stop()
    tt.thread.join(timeout=10)
    a: Any = _Stub("a")
    b: Any = _Stub("b")
    c: Any = _Stub("c")
    tt._hosts = [a, b, c]
    assert tt._pass_order(dict.fromkeys([c, a])) == [c, a, b]
    assert tt._pass_order(dict.fromkeys([b, c, a])) == [b, c, a]
    assert tt._pass_order({}) == [a, b, c]
    gone: Any = _Stub("gone")  # woken, then closed and taken out of the thread's list: not stepped
    assert tt._pass_order(dict.fromkeys([gone, b])) == [b, a, c]
