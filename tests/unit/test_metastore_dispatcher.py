"""The metastore's callback line is bounded and loses nothing (no ZooKeeper: the dispatcher and the state reactions).

A watch firing faster than its callbacks run takes one slot, its newest report
runs once; plain calls past the capacity wait for room; connection states are
collapsed to what the reactions need.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from conductor.metastore import Metastore
from conductor.metastore.dispatcher import CONNECTED, LOST, SUSPENDED, Dispatcher, collapse_states

S, L, C = SUSPENDED, LOST, CONNECTED


@pytest.fixture
def blocked() -> Iterator[tuple[Dispatcher, threading.Event, list[object]]]:
    """A dispatcher of capacity 3 whose thread is held inside a first call until the event is set."""
    d = Dispatcher("test-dispatcher", capacity=3)
    gate, inside = threading.Event(), threading.Event()
    ran: list[object] = []

    def hold() -> None:
        inside.set()
        gate.wait(10)

    d.submit(hold)
    assert inside.wait(5)
    yield d, gate, ran
    gate.set()
    d.stop()


def test_a_watch_firing_faster_than_its_callback_takes_one_slot_and_runs_its_newest_report(
        blocked: tuple[Dispatcher, threading.Event, list[object]]) -> None:
    d, gate, ran = blocked
    watch = object()
    d.submit(lambda: ran.append("before"))
    for version in range(10_000):
        d.submit(lambda v=version: ran.append(v), key=watch)  # type: ignore[misc]
    d.submit(lambda: ran.append("after"))
    assert d.queued() == 3 and d.coalesced == 9_999
    gate.set()
    done = threading.Event()
    d.submit(done.set)
    assert done.wait(5)
    assert ran == ["before", 9_999, "after"]  # the newest report, once, in the place of the first


def test_plain_calls_past_the_capacity_wait_for_room_then_run_in_order(
        blocked: tuple[Dispatcher, threading.Event, list[object]]) -> None:
    d, gate, ran = blocked
    for i in range(3):
        d.submit(lambda i=i: ran.append(i))  # type: ignore[misc]
    fourth = threading.Thread(target=d.submit, args=(lambda: ran.append(3),))
    fourth.start()
    fourth.join(0.3)
    assert fourth.is_alive() and d.queued() == 3  # the line is full: the submitter waits (backpressure)
    d.submit(lambda: ran.append("watch"), key="w")  # a keyed call never waits (one slot per key)
    assert d.queued() == 4
    gate.set()
    fourth.join(5)
    assert not fourth.is_alive()
    done = threading.Event()
    d.submit(done.set)
    assert done.wait(5)
    assert ran == [0, 1, 2, "watch", 3]


def test_the_dispatcher_never_waits_for_its_own_line() -> None:
    d = Dispatcher("test-dispatcher", capacity=1)
    errors: list[BaseException] = []
    gate = threading.Event()

    def hold() -> None:
        gate.wait()

    def callback() -> None:  # runs on the dispatcher: fills the line, then submits once more
        d.submit(hold)
        try:
            d.submit(lambda: None)
        except AssertionError as e:
            errors.append(e)

    d.submit(callback)
    deadline = time.monotonic() + 5
    while not errors and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    d.stop()
    assert errors and "wait forever" in str(errors[0])


@pytest.mark.parametrize(("states", "collapsed"), [
    ([S], [S]),
    ([S, C], [S, C]),
    ([S, C, S, C], [S, C]),
    ([S, C, S], [S]),
    ([S, L, C, S, C], [S, L, C]),
    ([C, S, L, C], [C, L, C]),
    ([L, C, S], [L, S]),
    ([L, C, S, L], [L]),
    ([C, S, C], [C]),
])
def test_connection_states_collapse_to_at_most_three(states: list[str], collapsed: list[str]) -> None:
    assert collapse_states(states) == collapsed
    out: list[str] = []
    for s in states:  # one at a time, as kazoo reports them
        out = collapse_states([*out, s])
        assert len(out) <= 3
    assert out == collapsed


def test_a_flapping_connection_takes_one_slot_and_keeps_every_reaction() -> None:
    """A stuck dispatcher and a connection flapping a thousand times, the session lost once among them."""
    reactions: list[str] = []
    ms = Metastore("127.0.0.1:1", pause_writes=lambda: reactions.append("pause"),
                   step_down=lambda: reactions.append("step_down"), resume=lambda: reactions.append("resume"))
    ms.nodes.reregister = lambda: reactions.append("reregister")  # type: ignore[method-assign]
    ms.add_state_listener(lambda s: reactions.append(f"listener {s}"))
    gate, inside = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        gate.wait(10)

    ms.submit(hold)
    assert inside.wait(5)
    try:
        for i in range(1000):
            ms._on_state(S)
            if i == 500:
                ms._on_state(L)
            ms._on_state(C)
        assert ms._dispatcher.queued() == 1  # the connection state's one slot
        gate.set()
        done = threading.Event()
        ms.submit(done.set)
        assert done.wait(5)
        assert reactions == ["pause", "listener SUSPENDED", "step_down", "listener LOST",
                             "reregister", "resume", "listener CONNECTED"]
    finally:
        gate.set()
        ms.close()
