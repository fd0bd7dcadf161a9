"""The dataflow's pure rules: completion of trees of hops, pulls and windows, retries, function references."""

from __future__ import annotations

import pytest

from topology.dataflow.completion import CompletionTracker
from topology.dataflow.poison import RetryBook, dead_letter
from topology.dataflow.shipping import Inlet, Pull, Shipper, trim_due
from topology.envelope import ROOT
from topology.refs import UnsendableFunction, fn_ref, resolve

A, B, C = 0, 1, 2


def relay(trackers: dict[int, CompletionTracker]) -> None:
    """Every group tells every source its report, until nothing changes (what pulls carry)."""
    for _ in range(20):
        moved = False
        for dst, t in trackers.items():
            for src, (pos, inc) in t.reports().items():
                moved |= trackers[src].reported(dst, pos, inc)
        if not moved:
            return


def test_a_root_completes_when_every_hop_of_its_tree_is_applied() -> None:
    t = {g: CompletionTracker() for g in (A, B, C)}
    # A's entry 10 (a client append) sends envelope 0 to B; B's entry 3 consumes it and sends 0 to C
    assert t[A].applied(10, {}, [(B, 0, [ROOT, 0])]) is False
    assert t[B].applied(3, {A: 1}, [(C, 0, [A, 0])]) is True  # not a root: nothing of its own to wait for
    relay(t)
    assert t[A].take_roots_done() == []  # C has not consumed yet
    assert t[B].report(A) == (1, [0])  # consumed, still waiting for its child
    t[C].applied(7, {B: 1}, [])
    relay(t)
    assert t[A].take_roots_done() == [10]
    assert t[A].complete_prefix(B) == 1 and t[B].complete_prefix(C) == 1
    assert t[A].in_flight() == t[B].in_flight() == 0


def test_an_entry_that_sends_nothing_is_complete_when_applied() -> None:
    t = CompletionTracker()
    assert t.applied(1, {}, []) is True
    assert t.applied(2, {B: 4}, []) is True
    assert t.report(B) == (4, [])


def test_a_chain_back_and_forth_completes_although_reports_are_per_source() -> None:
    """A -> B -> A -> B: a bare watermark from B would hide the last hop behind the first one forever."""
    t = {g: CompletionTracker() for g in (A, B)}
    t[A].applied(1, {}, [(B, 0, [ROOT, 0])])
    t[B].applied(1, {A: 1}, [(A, 0, [A, 0])])  # consumed A:0, answers on its behalf
    t[A].applied(2, {B: 1}, [(B, 1, [B, 0])])  # consumed B:0, answers on its behalf
    t[B].applied(2, {A: 2}, [])  # consumed A:1, a leaf
    relay(t)
    assert t[A].take_roots_done() == [1]
    assert (t[A].in_flight(), t[B].in_flight()) == (0, 0)


def test_a_group_that_sends_to_itself_settles() -> None:
    t = CompletionTracker()
    t.applied(5, {}, [(A, 0, [ROOT, 0])])
    t.applied(6, {A: 1}, [(A, 1, [A, 0])])
    t.applied(7, {A: 2}, [])
    t.settle_self(A)
    assert t.take_roots_done() == [5]
    assert t.report(A) == (2, [])


def test_shared_envelopes_complete_each_parent_once_all_its_envelopes_do() -> None:
    t = CompletionTracker()
    # one inbound entry consumed B:0 and C:0; both contributed to envelope B:5, only C:0 to C:9
    t.applied(1, {B: 1, C: 1}, [(B, 5, [B, 0, C, 0]), (C, 9, [C, 0])])
    assert t.reports() == {B: (1, [0]), C: (1, [0])}
    t.reported(B, 6)
    assert t.reports() == {B: (1, []), C: (1, [0])}
    t.reported(C, 10)
    assert t.reports() == {B: (1, []), C: (1, [])}


def test_reports_only_add_knowledge_and_may_overtake_an_apply() -> None:
    t = CompletionTracker()
    t.applied(1, {}, [(B, 0, [ROOT, 0]), (C, 0, [ROOT, 0])])
    t.reported(B, 2, [1])  # a new leader of B apply-raced ahead: envelope 1 is not applied here yet
    assert t.complete_prefix(B) == 1
    t.reported(B, 1)  # an older report: nothing moves back
    assert t.complete_prefix(B) == 1
    t.applied(2, {}, [(B, 1, [ROOT, 0])])  # known incomplete: tracked
    t.applied(3, {}, [(B, 2, [ROOT, 0])])  # at the reported position: tracked
    t.reported(C, 1)
    assert t.take_roots_done() == [1]  # its own envelopes are done; entries 2 and 3 wait
    t.reported(B, 3)
    assert sorted(t.take_roots_done()) == [2, 3]


def test_a_new_leader_rebuilds_what_is_pending_from_applied_state() -> None:
    old = CompletionTracker()
    old.applied(1, {A: 3}, [(B, 4, [A, 1]), (C, 0, [A, 2, ROOT, 0])])
    old.reported(B, 5)
    # the new leader sees positions {A: 3} and the untrimmed outbox: B from 4 (trim lagged), C from 0
    t = CompletionTracker.rebuild({A: 3}, {B: (4, [(4, [A, 1])]), C: (0, [(0, [A, 2, ROOT, 0])])})
    assert t.report(A) == (3, [1, 2])  # conservative until B and C report again
    t.reported(B, 5)
    assert t.report(A) == (3, [2]) == old.report(A)
    t.reported(C, 1)
    assert t.report(A) == (3, []) and t.take_roots_done() == []  # the old root has no waiter here


def test_inlet_queues_at_most_two_windows_per_source_and_pulls_the_rest_again() -> None:
    """A source shipping past its credit (a bug) cannot grow the destination's queue: the envelope that would
    take it past MAX_QUEUED_WINDOWS windows is dropped, counted and pulled again once entries consumed some."""
    inlet = Inlet(dst=B, epoch=3, window=1000, keepalive_ms=500)
    inlet.start({A: 0})
    inlet.pulls(0, {})
    assert inlet.accept(A, 0, 900) and inlet.accept(A, 1, 900)  # 1,800 queued: within two windows
    assert inlet.accept(A, 2, 300) is False and inlet.over_window == 1  # 2,100 would not be
    assert inlet.expected(A) == 2
    assert inlet.accept(A, 3, 10) is False and inlet.over_window == 1  # after it: a gap, as if lost
    inlet.consumed(A, 1800)
    assert inlet.pulls(10, {})[0].position == 2  # pulled again from the dropped one
    assert inlet.accept(A, 2, 300)
    big = Inlet(dst=B, epoch=3, window=1000, keepalive_ms=500)
    big.start({A: 0})
    assert big.accept(A, 0, 5000)  # one envelope larger than the bound goes when nothing else is queued


def test_inlet_accepts_in_order_and_pulls_with_a_window() -> None:
    inlet = Inlet(dst=B, epoch=3, window=1000, keepalive_ms=500)
    inlet.start({A: 5, C: 0})
    first = inlet.pulls(0, {A: (5, [])})
    assert first == [Pull(A, B, 3, 5, 1000, (5, ())), Pull(C, B, 3, 0, 1000, (0, ()))]
    assert inlet.pulls(10, {A: (5, [])}) == []
    assert inlet.accept(A, 4, 100) is False  # duplicate
    assert inlet.accept(A, 5, 300) and inlet.accept(A, 6, 300)
    assert inlet.pulls(20, {A: (5, [])}) == []  # more than half the window is queued: no room to offer
    inlet.consumed(A, 600)
    assert inlet.pulls(25, {A: (5, [])}) == [Pull(A, B, 3, 7, 1000, (5, ()))]  # consumed: the window reopens
    assert inlet.accept(A, 9, 10) is False  # a gap: repull from 7
    assert inlet.pulls(30, {A: (5, [])})[0].position == 7
    assert inlet.pulls(40, {A: (7, [6])}) == [Pull(A, B, 3, 7, 1000, (7, (6,)))]  # a new report
    assert sorted(p.src for p in inlet.pulls(600, {A: (7, [6])})) == [A, C]  # keepalives
    inlet.rewind(A, 6, 300)
    assert inlet.expected(A) == 6 and inlet.pulls(601, {A: (7, [6])})[0].position == 6


def test_shipper_sends_applied_envelopes_within_the_latest_pull() -> None:
    s = Shipper()
    assert s.pulled(Pull(A, B, 2, 0, 100, (0, ())), "stream-1")
    assert s.due({B: (0, 0)}) == []  # nothing applied yet: the pull waits
    assert s.due({B: (0, 3)}) == [(B, "stream-1", 0, 3, 100)]
    s.shipped(B, 3, 100)
    assert s.due({B: (0, 5)}) == []  # window spent until B pulls again
    assert not s.pulled(Pull(A, B, 1, 0, 100, (0, ())), "stale")  # a deposed leader of B
    assert s.pulled(Pull(A, B, 2, 2, 100, (0, ())), "stream-2")  # resend from 2
    assert s.due({B: (0, 5)}) == [(B, "stream-2", 2, 5, 100)]
    assert s.due({B: (4, 5)}) == [(B, "stream-2", 4, 5, 100)]  # 2 and 3 were completed and trimmed meanwhile
    s.disconnected("stream-2")
    assert s.due({B: (4, 5)}) == []


def test_trims_are_batched_except_the_one_that_empties_the_outbox() -> None:
    assert trim_due(0, 1000, 100, min_envelopes=256) is None
    assert trim_due(0, 1000, 300, min_envelopes=256) == 300
    assert trim_due(990, 1000, 1000) == 1000
    assert trim_due(10, 20, 5) is None


def test_retries_back_off_then_the_last_attempt_dead_letters() -> None:
    book = RetryBook(attempts=3, backoff_ms=100, factor=4)
    key = (A, 7)
    assert not book.last_attempt(key)
    assert book.failed(key, 1000) == 1100
    assert book.retry_at(key) == 1100 and not book.last_attempt(key)
    assert book.failed(key, 1100) == 1500
    assert book.last_attempt(key) and book.attempts_made(key) == 2
    with pytest.raises(AssertionError):
        book.failed(key, 1500)
    book.forget(key)
    assert book.retry_at(key) == 0 and len(book) == 0
    d = dead_letter("deliver", "KeyError: 'x'", 3, ["deliver", 3, ("k", 1), [{1, 2}]], A, 3)
    assert d == {"hop": "deliver", "error": "KeyError: 'x'", "task": 3, "from_group": A, "attempts": 3,
                 "handler": "deliver", "key": ["k", 1], "args": [[1, 2]]}


def module_level(n: int) -> int:
    return n


def test_functions_travel_by_module_level_name_only() -> None:
    ref = fn_ref(module_level, "here")
    assert ref == "tests.unit.test_dataflow_rules:module_level"
    assert resolve(ref) is module_level

    def nested(n: int) -> int:
        return n

    for bad in (nested, lambda n: n, print.__call__):
        with pytest.raises(UnsendableFunction, match="not a module-level function"):
            fn_ref(bad, "here")
    with pytest.raises(ValueError, match="not defined in this worker's code"):
        resolve("not.imported.module:fn")
